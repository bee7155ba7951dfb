"""``calibkit.bench.space``: loss specs, candidates of a given space, values applied to a preset and
read back from it (the grids and presets themselves are tested in test_tune.py and test_presetfile.py)."""

import pytest

from calibkit.bench.grid import BENCH_METHODS, Axis
from calibkit.bench.presetfile import parse_preset
from calibkit.bench.space import apply_values, candidates, current_values, loss_params, slug, with_loss_params

BASE = 'name = "mine"\ndataset = "imagefolder"\nmodel = "mlp"\nseeds = [0]\n'


def test_loss_spec_parameters_and_their_errors():
    assert loss_params("mbls: margin = 6 , lam=0.1,") == ("mbls", {"margin": "6", "lam": "0.1"})
    assert loss_params(" ce ") == ("ce", {})
    assert loss_params("x:k=v=w") == ("x", {"k": "v=w"})  # the key ends at the first "="
    for spec, item in (("mbls:margin", "margin"), ("mbls:=6", "=6"), ("mbls:margin=6, =1", "=1")):
        with pytest.raises(ValueError, match=f"^loss spec {spec!r}: expected key=value, got {item!r}$"):
            loss_params(spec)


def test_values_written_into_a_loss_spec():
    assert with_loss_params("ce", {}) == "ce"  # no parameter: no colon
    assert with_loss_params("mbls:margin=6,lam=0.1", {"margin": 10.0}) == "mbls:margin=10,lam=0.1"
    # floats in the shortest form, other numbers as Python writes them (no exponent for a large int)
    assert with_loss_params("x", {"a": 0.5, "n": 3, "big": 1234567}) == "x:a=0.5,n=3,big=1234567"


def test_slug_names_a_candidate_by_its_sorted_values():
    assert slug({}) == "default"
    assert slug({"loss.margin": 6.0, "loss.lam": 0.25}) == "lam=0.25,margin=6"


def test_candidates_of_a_given_space_are_its_product_in_grid_order():
    space = {"loss.alpha": Axis((0.1, 0.2), 0.1), "train.epochs": Axis((1.0, 3.0, 5.0), 3.0)}
    got = candidates("ls", space=space)  # the given space, not LS's own
    assert got == [{"loss.alpha": a, "train.epochs": e} for a in (0.1, 0.2) for e in (1.0, 3.0, 5.0)]
    assert candidates("ls", space={}) == [{}]


def test_apply_values_to_each_target():
    p = parse_preset(BASE)
    assert "ls" not in p.train_by_method and p.csm == {}
    q = apply_values(p, "ls", {"train.epochs": 3, "csm.sharpness": 2.0, "loss.alpha": 0.2})
    assert q.train_by_method["ls"] == {"epochs": 3}  # a method the preset had no overrides for
    assert q.csm == {"sharpness": 2.0} and q.losses["ls"] == "ls:alpha=0.2"
    assert p.train_by_method == {} and p.csm == {}  # the preset itself is unchanged
    for address in ("loss.", "nope.alpha", "alpha"):
        with pytest.raises(ValueError, match=rf"^ls: bad search-space address {address!r}; "
                                             r"expected <loss\|train\|maccal\|csm>\.<name>$"):
            apply_values(p, "ls", {address: 1.0})


def test_current_values_follow_the_presets_own_space():
    p = parse_preset(BASE + '[space.mbls]\n"loss.lam" = [0.1, 0.2, 0.3]\n')
    assert "loss.lam" not in BENCH_METHODS["mbls"].space
    assert current_values(p, "mbls") == {"loss.lam": 0.2}  # its space's published value
    q = apply_values(p, "mbls", {"loss.lam": 0.3})
    assert current_values(q, "mbls") == {"loss.lam": 0.3}
