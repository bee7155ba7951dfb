"""The names re-exported at ``calibkit.``: each resolves to its module's object, ``dir`` lists them,
and ``import calibkit`` stays light (they are imported on first access)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import calibkit
from tests.conftest import ROOT


def test_every_exported_name_is_its_modules_object():
    assert len(calibkit.__all__) == len(set(calibkit.__all__))
    for name in calibkit.__all__:
        if name == "__version__":
            continue
        module = importlib.import_module(calibkit._LAZY[name])
        assert getattr(calibkit, name) is getattr(module, name), name
    assert set(calibkit.__all__) <= set(dir(calibkit))


def test_the_main_names_are_there():
    for name in ("TemperatureScaling", "CALIBRATORS", "evaluate", "ece", "smooth_ece", "CalibratedModel", "MbLS",
                 "SplitConformal", "save", "load"):
        assert name in calibkit.__all__
    # every registered calibrator class is exported
    assert {cls.__name__ for cls in calibkit.CALIBRATORS.values()} <= set(calibkit.__all__)


def test_unknown_name_raises_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'TemperatureScalling'"):
        calibkit.TemperatureScalling  # noqa: B018
    assert not hasattr(calibkit, "not_a_name")


def test_import_calibkit_imports_neither_torch_nor_numpy():
    code = "import sys, calibkit\nprint(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
