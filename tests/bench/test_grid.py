"""The benchmark grid's pure helpers: hard bounds, default OOD sets, method selection, preset
look-up and the checkpoint-policy override (no training; every value checked by hand)."""

import re

import pytest

from calibkit.bench.grid import (
    BENCH_METHODS,
    BOUNDS,
    IMAGE_ONLY,
    PRESETS,
    REFERENCE,
    Axis,
    Bound,
    Preset,
    applicable,
    bound_for,
    default_ood,
    get_preset,
    grid_methods,
    select_methods,
    space_for,
    with_keep,
    with_overrides,
)


def preset(**kw) -> Preset:
    base = dict(name="p", dataset="fmnist", model="mlp", seeds=(0,), train={"epochs": 1})
    base.update(kw)
    return Preset(**base)


@pytest.mark.parametrize("bound,inside,outside", [
    (Bound(), [-1e9, 0.0, 1e9], []),
    (Bound(0.0), [0.0, 5.0], [-1e-9]),
    (Bound(0.0, low_open=True), [1e-9, 7.0], [0.0, -1.0]),
    (Bound(high=1.0), [-3.0, 1.0], [1.0 + 1e-9]),
    (Bound(0.0, 1.0, high_open=True), [0.0, 0.5, 1.0 - 1e-9], [1.0, 2.0, -0.1]),
    (Bound(0.0, 1.0, low_open=True, high_open=True), [1e-9, 0.5], [0.0, 1.0]),
    (Bound(0.0, 1.0), [0.0, 1.0], [-1e-9, 1.0 + 1e-9]),
])
def test_bound_admits_its_closed_ends_and_refuses_its_open_ones(bound, inside, outside):
    assert [bound.admits(v) for v in inside] == [True] * len(inside)
    assert [bound.admits(v) for v in outside] == [False] * len(outside)


def test_bound_admits_reads_numbers_of_any_type():
    assert Bound(0.0, 1.0, high_open=True).admits("0.5") and not Bound(0.0).admits("-1")


@pytest.mark.parametrize("bound,text", [
    (Bound(), "(-inf, inf)"),
    (Bound(0.0), "[0, inf)"),
    (Bound(0.0, low_open=True), "(0, inf)"),
    (Bound(0.0, 1.0, high_open=True), "[0, 1)"),
    (Bound(0.05, 2.5), "[0.05, 2.5]"),
    (Bound(high=3.0, high_open=True), "(-inf, 3)"),
    (Bound(0.0, 1.0, low_open=True, high_open=True), "(0, 1)"),
])
def test_bound_text_is_interval_notation(bound, text):
    assert bound.text() == text


def test_bound_for_listed_positive_and_unbounded_addresses():
    assert bound_for("loss.alpha") is BOUNDS["loss.alpha"]
    assert bound_for("loss.alpha", Axis((-1.0, 2.0), 0.0)) is BOUNDS["loss.alpha"]  # the list wins over the grid
    positive = bound_for("loss.theta", Axis((0.5, 0.9), 0.5))  # not listed, grid all > 0
    assert positive == Bound(0.0, low_open=True) and not positive.admits(0.0) and positive.admits(1e-9)
    assert bound_for("loss.theta", Axis((0.0, 0.9), 0.5)) == Bound()  # a grid reaching 0: unbounded
    assert bound_for("loss.theta", Axis((-2.0, 1.0), 1.0)) == Bound()
    assert bound_for("loss.theta") == Bound() and bound_for("loss.theta", Axis((), 1.0)) == Bound()


def test_default_ood_is_none_for_the_users_own_data_only():
    assert [default_ood(d) for d in ("imagefolder", "tensors", "fmnist", "cifar10")] == ["none", "none", "digits",
                                                                                       "digits"]
    assert preset(dataset="tensors").ood == "none" and preset().ood == "digits"
    assert preset(ood="svhn").ood == "svhn" and preset(dataset="tensors", ood="svhn").ood == "svhn"


def test_preset_loss_space_and_keep_readers():
    p = preset(losses={"mbls": "mbls:margin=6"}, spaces={"ls": {"loss.alpha": Axis((0.1, 0.2), 0.1)}},
               train={"epochs": 1, "keep": "last"})
    assert p.loss_for("mbls") == "mbls:margin=6" and p.loss_for("focal") == BENCH_METHODS["focal"].loss == "focal"
    assert p.space_for("ls") == {"loss.alpha": Axis((0.1, 0.2), 0.1)}
    assert p.space_for("focal") is BENCH_METHODS["focal"].space
    assert space_for(None, "ls") is BENCH_METHODS["ls"].space and space_for(p, "ls") is p.spaces["ls"]
    assert p.keep == "last" and preset().keep == "best-acc"  # no keep in train: the shared protocol's


def test_applicable_skips_image_only_methods_outside_images():
    names = ["ce", "mixup", "ls", "csm", "regmixup", "maccal"]
    assert applicable(names, preset()) == (names, [])
    assert applicable(names, preset(modality="text")) == (["ce", "ls", "maccal"], ["mixup", "csm", "regmixup"])
    assert applicable(names, preset(modality="features")) == (["ce", "ls", "maccal"], ["mixup", "csm", "regmixup"])
    assert set(IMAGE_ONLY) == {"mixup", "regmixup", "csm"}


def test_grid_methods_default_to_the_presets_list_then_all():
    assert grid_methods(preset()) == (list(BENCH_METHODS), [])
    assert grid_methods(preset(methods=("mbls",))) == (["ce", "mbls"], [])
    assert grid_methods(preset(methods=("mbls",)), ["focal"]) == (["ce", "focal"], [])  # names win
    assert grid_methods(preset(methods=("mbls",)), []) == (["ce"], [])  # an empty list is not "none given"
    assert grid_methods(preset(modality="text", methods=("csm", "ls"))) == (["ce", "ls"], ["csm"])


def test_select_methods_adds_the_reference_and_what_methods_build_on_in_grid_order():
    assert select_methods(None) == list(BENCH_METHODS)
    assert select_methods(["csm", "focal"]) == ["ce", "focal", "csm"]  # grid order, CE added
    assert select_methods(["maccal"]) == ["ce", "maccal"] and select_methods([]) == [REFERENCE]
    with pytest.raises(ValueError) as err:
        select_methods(["focal", "nope", "bad"])
    assert str(err.value) == f"unknown method(s) nope, bad; valid methods: {', '.join(BENCH_METHODS)}"


def test_get_preset_names_the_valid_presets():
    assert get_preset("smoke") is PRESETS["smoke"]
    with pytest.raises(ValueError) as err:
        get_preset("smok")
    assert str(err.value) == f"unknown preset 'smok'; valid presets: {', '.join(PRESETS)}"


def test_with_keep_sets_one_policy_for_every_run():
    p = preset(train={"epochs": 3, "keep": "best-acc"}, train_by_method={"mixup": {"mix_alpha": 0.4}})
    assert with_keep(p, None) is p
    changed = with_keep(p, "best-nll")
    assert changed.train == {"epochs": 3, "keep": "best-nll"} and changed.keep == "best-nll"
    assert p.train["keep"] == "best-acc" and changed.train_by_method == p.train_by_method  # a copy
    with pytest.raises(ValueError) as err:
        with_keep(p, "best")
    assert str(err.value) == ("unknown checkpoint policy 'best'; choose one of "
                              "best-acc, best-nll, best-ece, best-miou, last")
    clash = preset(name="q", train_by_method={"ls": {"keep": "last"}, "csm": {"keep": "last"},
                                              "mixup": {"mix_alpha": 0.4}})
    with pytest.raises(ValueError) as err:
        with_keep(clash, "last")
    assert str(err.value) == ("preset q: csm, ls override the checkpoint policy; "
                              "one policy must hold for every method")


def test_with_overrides_replaces_only_the_named_fields():
    p = preset(seeds=(0, 1), n_boot=50)
    q = with_overrides(p, seeds=(3,), robust_n=10)
    assert (q.seeds, q.robust_n, q.n_boot, q.name) == ((3,), 10, 50, "p") and p.seeds == (0, 1)
    with pytest.raises(TypeError, match=re.escape("unexpected keyword argument 'colour'")):
        with_overrides(p, colour="red")


@pytest.mark.parametrize("name, margin", [("smoke", "1"), ("text-smoke", "1"), ("text-pretrained-smoke", "0.1"),
                                          ("fmnist-pretrained-smoke", "1")])
def test_smoke_presets_run_the_margin_losses_at_a_small_margin(name, margin):
    # at the default margin 10 their penalty never fires in 1-2 epochs and they train exactly as CE
    from calibkit.bench.grid import PRESETS, grid_methods

    p = PRESETS[name]
    losses = [m for m in ("mbls", "acls") if m in grid_methods(p)[0]]
    assert losses and all(p.loss_for(m) == f"{m}:margin={margin}" for m in losses)
    assert f"margin {margin}:" in p.note or f"margin {margin}," in p.note
