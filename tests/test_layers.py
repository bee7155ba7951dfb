"""The one-way data flow of docs/design.md, enforced: no part of calibkit imports a part above it.

Every module under ``calibkit/`` is parsed (``ast``) and every import it holds is read, those
inside functions too (calibkit imports heavy parts lazily, and a lazy import is a dependency
all the same). Each import names a top-level part of the package (``calibkit.bench.grid`` ->
``bench``); the importing part's layer must be at least the imported part's layer.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import calibkit

PACKAGE = Path(calibkit.__file__).parent

# The layers, lowest first; a part may import its own layer and those below it, never one above.
LAYERS = [
    # Leaves any part may use: the error classes, optional-package checks, the version.
    ("base", {"errors", "extras", "__init__"}),
    # Checks and settings that read no tensors of other parts: input validation, the training
    # config, the torch.distributed setup, atomic file writes, the results database (store knows
    # nothing of runs).
    # The numpy/torch boundary of the public functions and the nearest-name suggestion are leaves too.
    ("foundation", {"_validation", "config", "distributed", "diskio", "store", "_arrays", "suggest"}),
    # Pure tensor functions, readable and testable alone.
    ("functional", {"functional"}),
    # What is computed from probabilities and logits: metrics (and their bootstraps and panel
    # state), losses, calibrators, conformal prediction, plots, the torchmetrics wrapper.
    ("measures", {"_panel_state", "bootstrap", "resampling", "grouped_bootstrap", "seed_bootstrap",
                  "selective_bootstrap", "metrics", "losses", "calibrators", "conformal", "plots", "curves",
                  "integrations"}),
    # What produces a trained model: data sets, models, the training loop, the two-stage methods,
    # and the run directory they all write and read.
    ("training", {"data", "models", "train", "methods", "rundir"}),
    # Runs many trainings and records them.
    ("bench", {"bench"}),
    # Reads a bench's records (through bench's paths and stores) into tables and figures.
    ("report", {"report"}),
    # The bench as one library call (checks, CSM build, tuning, bench, report) over the parts below.
    ("pipeline", {"pipeline"}),
    # The subcommands: argument wiring over everything below.
    ("commands", {"commands"}),
    # The entry points.
    ("cli", {"cli", "__main__"}),
]
LAYER = {part: i for i, (_, parts) in enumerate(LAYERS) for part in parts}

# Imports allowed against the order, each with its reason: (importing module, imported part).
EXCEPTIONS: dict[tuple[str, str], str] = {}

# Parts a part may not import although they lie below it, each with its reason: part -> {parts}.
APART: dict[str, set[str]] = {
    # Training and its run directory know nothing of results stores or benches: a bench hands the
    # training loop what its directory asks (calibkit.train.state.Placement, calibkit.bench.paths).
    "train": {"store", "bench"},
    "rundir": {"store", "bench"},
}


def part_of(module: str) -> str:
    """The top-level part of ``calibkit.x.y`` (``x``); ``calibkit`` itself is ``__init__``."""
    words = module.split(".")
    if len(words) == 1:
        return "__init__"
    name = words[1]
    if (PACKAGE / f"{name}.py").exists() or (PACKAGE / name / "__init__.py").exists():
        return name
    return "__init__"  # an attribute of calibkit/__init__.py (``from calibkit import __version__``)


def module_name(path: Path) -> str:
    words = ("calibkit",) + path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(words[:-1] if words[-1] == "__init__" else words)


def imported(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """``(line, calibkit module)`` of every import in ``path`` (or in ``source`` as if it were
    ``path``), at any depth."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found = []
    tree = ast.parse(path.read_text() if source is None else source, filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package, level - 1 packages up
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "calibkit":  # from calibkit import rundir: the module named
                found += [(node.lineno, f"calibkit.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, target))
    return [(line, name) for line, name in found if name == "calibkit" or name.startswith("calibkit.")]


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def violations(paths, sources=None) -> list[str]:
    """One line per import of a part above the importer's (``sources``: text instead of a file)."""
    bad = []
    for path in paths:
        here = module_name(path)
        mine = part_of(here)
        for line, name in imported(path, (sources or {}).get(path)):
            other = part_of(name)
            if (LAYER[other] > LAYER[mine] or other in APART.get(mine, ())) and (here, other) not in EXCEPTIONS:
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {here} ({LAYERS[LAYER[mine]][0]}) imports "
                           f"{name} ({LAYERS[LAYER[other]][0]})")
    return bad


def test_every_part_of_the_package_has_a_layer():
    parts = {part_of(module_name(p)) for p in modules()}
    assert parts - set(LAYER) == set(), "place the new part in LAYERS"
    assert set(LAYER) - parts == set(), "a part in LAYERS that no longer exists"


def test_no_part_imports_a_part_above_it():
    assert violations(modules()) == []


def test_every_exception_is_still_needed():
    used = {(module_name(p), part_of(n)) for p in modules() for _, n in imported(p)}
    assert set(EXCEPTIONS) <= used


@pytest.mark.parametrize("source, found", [
    ("from calibkit.commands import presetargs\n", "calibkit.commands"),
    ("def f():\n    from calibkit.commands.presetargs import preset_from_args\n", "calibkit.commands.presetargs"),
    ("import calibkit.cli\n", "calibkit.cli"),
    ("from calibkit import report\n", "calibkit.report"),
])
def test_an_upward_import_in_the_bench_is_caught(source, found):
    probe = PACKAGE / "bench" / "_layer_probe.py"  # never written: its text is given
    (bad,) = violations([probe], {probe: source})
    assert bad.endswith(f"calibkit.bench._layer_probe (bench) imports {found} "
                        f"({LAYERS[LAYER[part_of(found)]][0]})")


@pytest.mark.parametrize("where", ["train/_layer_probe.py", "rundir.py"])
@pytest.mark.parametrize("source, found", [
    ("from calibkit.store.common import StoreError\n", "calibkit.store.common"),
    ("def f():\n    from calibkit.store import open_store\n", "calibkit.store"),
    ("from calibkit.bench import paths\n", "calibkit.bench"),
])
def test_training_importing_the_store_or_the_bench_is_caught(where, source, found):
    probe = PACKAGE / where  # its text is given (the probe file is never written)
    (bad,) = violations([probe], {probe: source})
    assert bad.endswith(f"imports {found} ({LAYERS[LAYER[part_of(found)]][0]})")


def test_relative_imports_resolve_to_their_package():
    assert (15, "calibkit.losses.basic") in imported(PACKAGE / "losses" / "fedlas.py",
                                                     "import torch\n" * 14 + "from .basic import IGNORE_INDEX\n")
    assert imported(PACKAGE / "losses" / "__init__.py", "from .fedlas import FeDLaS\n") == \
        [(1, "calibkit.losses.fedlas")]
