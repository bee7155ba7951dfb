"""The loss registry and ``build``: the value parser by hand, every error message in full, and the
arguments that come from the caller (``num_classes``, ``ignore_index``) rather than the spec."""

import os
import re

import pytest
import torch

from calibkit import losses
from calibkit.losses import LOSSES, build
from calibkit.losses import _parse_value as parse
from tests.conftest import ROOT


def _documented_losses() -> list[str]:
    """The names in the headings of "Training losses" in docs/methods.md (``### Title — `name```), in order."""
    with open(os.path.join(ROOT, "docs", "methods.md")) as f:
        section = f.read().split("\n## Training losses", 1)[1].split("\n## ", 1)[0]
    return [name for heading in re.findall(r"^### (.*)$", section, flags=re.M)
            for name in re.findall(r"`([a-z0-9_]+)`", heading.rpartition(" — ")[2])]


def test_every_registered_loss_is_documented_in_order():
    assert _documented_losses() == list(LOSSES)


@pytest.mark.parametrize("name", list(LOSSES))
def test_every_registered_loss_has_its_own_tests(name):
    """Besides the loops over ``LOSSES``, some test of tests/losses names the loss: its values."""
    folder = os.path.join(ROOT, "tests", "losses")
    named = []
    for file in sorted(os.listdir(folder)):
        if file.startswith("test_") and file != "test_registry.py":
            with open(os.path.join(folder, file)) as f:
                if f'"{name}"' in f.read():
                    named.append(file)
    assert named, f"no test under tests/losses names the loss {name!r}"


def test_registry_builds_exported_classes():
    built = {name: type(build(name, num_classes=3)) for name in LOSSES}
    assert set(losses.__all__) == {*(cls.__name__ for cls in built.values()), "LOSSES", "build"}
    assert all(getattr(losses, cls.__name__) is cls for cls in built.values())
    # the classes of the names checked by hand
    expected = {"ce": losses.CrossEntropy, "ls": losses.LabelSmoothing, "focal": losses.Focal, "flsd": losses.FLSD,
                "ecp": losses.ECP, "mbls": losses.MbLS, "acls": losses.ACLS, "dfl": losses.DualFocal,
                "adafocal": losses.AdaFocal}
    for name, cls in expected.items():
        assert type(build(name, num_classes=3)) is cls, name
    ls, mbls = build("fedlas_ls", num_classes=3), build("fedlas_mbls", num_classes=3)
    assert type(ls) is type(mbls) is losses.FeDLaS and (ls.variant, mbls.variant) == ("ls", "mbls")


@pytest.mark.parametrize("text, value", [
    ("true", True), ("False", False), ("TRUE", True), ("fAlSe", False),
    ("7", 7), ("+3", 3), ("-12", -12), ("007", 7),
    ("2.5", 2.5), ("-1e-3", -0.001), ("1E2", 100.0), ("inf", float("inf")),
    ("abc", "abc"), ("XyX", "XyX"), ("X", "X"), ("'quoted'", "quoted"), ('"dq"', "dq"), ("1x", "1x"), ("3 4", "3 4"),
])
def test_parse_value_by_hand(text, value):
    out = parse(text)
    assert out == value and type(out) is type(value)


def test_build_reads_names_and_values_case_and_space_insensitively():
    m = build("  MbLS : margin = 6 , , lam=1e-1 ,")
    assert type(m) is losses.MbLS and m.hparams == {"margin": 6, "lam": 0.1}
    assert type(m.hparams["margin"]) is int
    assert build("focal:").hparams == {"gamma": 3.0}  # an empty list of items: the defaults
    a = build("adafocal:n_bins=4,lam=2", num_classes=5)
    assert (a.num_classes, a.n_bins, a.lam) == (5, 4, 2)


def test_ignore_index_comes_from_the_caller():
    for name in LOSSES:
        assert build(name, num_classes=3).ignore_index == 255, name
        assert build(name, num_classes=3, ignore_index=0).ignore_index == 0, name
        assert build(name, num_classes=3, ignore_index=None).ignore_index is None, name
    # ...and the built loss uses it: a pixel labelled 0 is dropped.
    logits = torch.tensor([[[[2.0, -1.0]], [[0.5, 1.0]]]])  # (1, 2 classes, 1, 2 pixels)
    targets = torch.tensor([[[0, 1]]])  # (1, 1, 2)
    keep_second = torch.nn.functional.cross_entropy(torch.tensor([[-1.0, 1.0]]), torch.tensor([1]))
    assert torch.allclose(build("ce", ignore_index=0)(logits, targets), keep_second)
    with pytest.raises(ValueError, match=r"^unknown hyperparameter 'ignore_index' for loss 'ce'; valid: \(none\)$"):
        build("ce:ignore_index=0")


def test_num_classes_reaches_the_losses_that_take_it():
    assert build("fedlas_mbls", num_classes=6).num_classes == 6
    assert build("ce", num_classes=6).ignore_index == 255  # accepted and unused
    with pytest.raises(ValueError, match=r"^loss 'adafocal' needs num_classes: build\('adafocal:lam=2', "
                                         r"num_classes=K\)$"):
        build("adafocal:lam=2")
    with pytest.raises(ValueError, match=r"^loss 'fedlas_ls' needs num_classes: build\('fedlas_ls', num_classes=K\)$"):
        build("fedlas_ls")


@pytest.mark.parametrize("spec, message", [
    ("", r"^loss spec must be a non-empty string like 'mbls:margin=6', got ''$"),
    ("   ", r"^loss spec must be a non-empty string like 'mbls:margin=6', got '   '$"),
    (None, r"^loss spec must be a non-empty string like 'mbls:margin=6', got None$"),
    (3, r"^loss spec must be a non-empty string like 'mbls:margin=6', got 3$"),
    ("crossentropy:x=1", rf"^unknown loss 'crossentropy'; valid losses: {', '.join(LOSSES)}$"),
    ("mbls:margin", r"^malformed item 'margin' in loss spec 'mbls:margin': expected key=value$"),
    ("mbls:=3", r"^malformed item '=3' in loss spec 'mbls:=3': expected key=value$"),
    ("mbls:margin= ", r"^malformed item 'margin=' in loss spec 'mbls:margin= ': expected key=value$"),
    ("mbls:gamma=2", r"^unknown hyperparameter 'gamma' for loss 'mbls'; valid: margin, lam$"),
    ("adafocal:num_classes=3", r"^unknown hyperparameter 'num_classes' for loss 'adafocal'; valid: n_bins, lam, "
                               r"gamma_init, gamma_min, gamma_max, flip_threshold$"),
    ("mbls:lam=1, lam =2", r"^hyperparameter 'lam' given twice in loss spec 'mbls:lam=1, lam =2'$"),
])
def test_spec_errors_in_full(spec, message):
    with pytest.raises(ValueError, match=message):
        build(spec, num_classes=4)


def test_value_with_an_equals_sign_is_kept_whole():
    # "margin=1=2": key "margin", value "1=2" (a string, which MbLS then rejects by its own check).
    with pytest.raises((ValueError, TypeError)) as info:
        build("mbls:margin=1=2")
    assert "malformed" not in str(info.value) and "unknown hyperparameter" not in str(info.value)
