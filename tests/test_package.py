"""What the installed package carries: version, presets, the digits, and which parts need extras."""

import os
import subprocess

import numpy as np
import pytest
import tomllib

import calibkit
from calibkit.extras import MissingExtra, require
from tests.conftest import PYTHON, ROOT

# Optional packages the base install does not have: blocked in a subprocess, imports of them fail.
EXTRAS = ("sklearn", "scipy", "PIL", "diffusers", "transformers", "torchmetrics")
BLOCK = f"import sys\nfor m in {EXTRAS!r}: sys.modules[m] = None\n"


def test_version_has_one_source(capsys):
    meta = tomllib.loads(open(os.path.join(ROOT, "pyproject.toml")).read())
    assert "version" not in meta["project"] and "version" in meta["project"]["dynamic"]
    assert meta["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "calibkit.__version__"}
    from calibkit.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"calibkit {calibkit.__version__}"
    changelog = open(os.path.join(ROOT, "CHANGELOG.md")).read()
    assert f"## {calibkit.__version__}" in changelog


def test_presets_ship_inside_the_package():
    from calibkit.config import CONFIG_DIR, load_config

    pkg = os.path.dirname(calibkit.__file__)
    assert os.path.commonpath([str(CONFIG_DIR), pkg]) == pkg
    names = sorted(p.stem for p in CONFIG_DIR.glob("*.toml"))
    assert {"fmnist", "cifar10", "cifar100", "tinyimagenet"} <= set(names)
    for name in names:
        assert load_config(name).data  # every shipped preset is a valid config
    meta = tomllib.loads(open(os.path.join(ROOT, "pyproject.toml")).read())
    assert "configs/*.toml" in meta["tool"]["setuptools"]["package-data"]["calibkit"]


def test_shipped_digits_equal_scikit_learns():
    sklearn_datasets = pytest.importorskip("sklearn.datasets")
    from calibkit.data.digits import read_digits_file

    images, labels = read_digits_file()
    d = sklearn_datasets.load_digits()
    assert images.dtype == np.uint8 and images.shape == (1797, 8, 8)
    assert np.array_equal(images, d.images) and np.array_equal(labels, d.target)


def test_digits_and_default_bench_need_no_extra(tmp_path):
    """With every optional package blocked, the digits (data set and OOD set) load and the default
    bench's preflight passes (it loads Fashion-MNIST, so it runs only where the data is installed)."""
    from calibkit.data import DATASETS

    have_fmnist = os.path.isdir(DATASETS["fmnist"].default_dir or "")
    code = BLOCK + (
        "from calibkit.data import load\n"
        "from calibkit.data.ood import load_ood\n"
        "b = load('digits', seed=0)\n"
        "assert tuple(b.train.images.shape[1:]) == (1, 28, 28) and len(b.test.labels) == 360\n"
        "assert load_ood('digits', like=b).shape == (1797, 1, 28, 28)\n")
    if have_fmnist:
        code += ("from calibkit.bench.grid import PRESETS\n"
                 "from calibkit.bench.preflight import check_bench\n"
                 f"check_bench(PRESETS['default'], {str(tmp_path / 'b')!r})\n")
    res = subprocess.run([PYTHON, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert res.returncode == 0, res.stderr
    assert not (tmp_path / "b").exists()  # the preflight creates nothing


def test_require_names_the_extra(monkeypatch):
    import calibkit.extras as extras

    require("os", "anything")  # importable: no error
    monkeypatch.setattr(extras, "available", lambda m: False)
    with pytest.raises(MissingExtra, match=r"^reading SVHN needs scipy: pip install 'calibkit\[data\]'$"):
        require("scipy", "reading SVHN")
    with pytest.raises(MissingExtra, match=r"needs diffusers, transformers: pip install 'calibkit\[csm\]'$"):
        require(("diffusers", "transformers"), "CSM")
    with pytest.raises(MissingExtra, match=r"needs no_such_pkg: pip install no_such_pkg$"):
        require("no_such_pkg", "x")


def test_every_file_the_package_reads_is_package_data():
    """Non-Python files under calibkit/ are matched by the package-data globs (so wheels carry them)."""
    import fnmatch

    meta = tomllib.loads(open(os.path.join(ROOT, "pyproject.toml")).read())
    globs = meta["tool"]["setuptools"]["package-data"]["calibkit"]
    pkg = os.path.dirname(calibkit.__file__)
    for folder, dirs, files in os.walk(pkg):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in files:
            if f.endswith((".py", ".pyc")):
                continue
            rel = os.path.relpath(os.path.join(folder, f), pkg)
            # fnmatch's "*" also matches "/", as setuptools' "**" does
            assert any(fnmatch.fnmatch(rel, g) for g in globs), rel
