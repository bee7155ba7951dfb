"""CONTRIBUTING.md checked against the code and the tests it describes, so that it cannot go stale
unnoticed: every path it names exists, its list of layers is the table of tests/test_layers.py, and
each "A new ..." section names the file that holds its registry and every test that checks that
registry against a documentation table, with the table's file.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.test_layers import LAYER

GUIDE = (Path(ROOT) / "CONTRIBUTING.md").read_text()

# Each section of the guide -> the registries a new entry of its kind is added to (``package:NAME``
# where another part of calibkit has a table of the same name).
SECTIONS = {
    "A new loss": ("LOSSES",),
    "A new calibrator": ("CALIBRATORS", "calibrators:FIELDS"),
    "A new metric": ("PANEL",),
    "A new data set": ("DATASETS",),
    "A new model": ("MODELS",),
    "A new bench method": ("BENCH_METHODS", "BOUNDS"),
    "A new preset": ("BUILTIN_PRESETS",),
}
# Other names the tests use for a registry.
ALIASES = {"BENCH_METHODS": ("METHODS",), "BUILTIN_PRESETS": ("PRESETS",)}


def section(title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}$(.*?)(?=^## |\Z)", GUIDE, re.S | re.M)
    assert m, f"CONTRIBUTING.md has no section {title!r}"
    return m.group(1)


def defining_file(registry: str) -> tuple[str, str]:
    """``(name, the one module of calibkit/ (or of its ``package``) that assigns it at its top level)``."""
    package, _, name = registry.rpartition(":")
    found = [str(path.relative_to(ROOT)) for path in sorted((Path(ROOT) / "calibkit" / package).rglob("*.py"))
             if re.search(rf"^{name}(: [^=]+)? = ", path.read_text(), re.M)]
    assert len(found) == 1, (name, found)
    return name, found[0]


def test_every_path_the_guide_names_exists():
    paths = re.findall(r"`((?:calibkit|tests|docs)/[^`\s]*)`", GUIDE)
    assert len(paths) > 30
    for path in paths:
        if re.search(r"<\w+>|NAME|/x\.py$", path):  # a pattern (`tests/data/test_<name>.py`), not a file
            continue
        assert (Path(ROOT) / path).exists(), f"CONTRIBUTING.md names {path}, which does not exist"


def test_the_list_of_layers_is_the_layer_table():
    bullet = re.search(r"^- \*\*Layers\.\*\*(.*?)(?=^- \*\*)", GUIDE, re.S | re.M).group(1)
    named = [name for name in re.findall(r"`([\w.]+)`", bullet) if name in LAYER]
    missing = sorted(set(LAYER) - {"__init__"} - set(named))
    assert not missing, f"the layer list of CONTRIBUTING.md leaves out {missing}"
    order = [LAYER[name] for name in named]
    assert order == sorted(order), f"the layer list of CONTRIBUTING.md is not in the table's order: {named}"


@pytest.mark.parametrize("title", list(SECTIONS))
def test_each_section_names_the_file_of_its_registry(title):
    text = section(title)
    for registry in SECTIONS[title]:
        name, path = defining_file(registry)
        assert f"`{path}`" in text and name in text, f"{title!r} does not name {name} in {path}"


def test_each_section_names_the_tests_that_check_its_registry_against_the_docs():
    checks = 0
    for path in sorted((Path(ROOT) / "tests").rglob("test_*.py")):
        source = path.read_text()
        docs = sorted(set(re.findall(r'"docs", "(\w+\.md)"', source)))
        for title, names in SECTIONS.items():
            names = [registry.rpartition(":")[2] for registry in names]
            words = [word for name in names for word in (name, *ALIASES.get(name, ()))]
            if not docs or not re.search(rf"\b({'|'.join(words)})\b", source):
                continue
            checks += 1
            text, test = section(title), str(path.relative_to(ROOT))
            assert f"`{test}`" in text, f"{title!r} does not name {test}, which checks {names[0]} against the docs"
            for doc in docs:
                assert f"`docs/{doc}`" in text, f"{title!r} does not name docs/{doc}, which {test} reads"
    assert checks >= 5  # losses, calibrators, data sets, models, the grid
