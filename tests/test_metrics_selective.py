"""The panel's selective-prediction entries (``aurc``, ``eaurc``, ``augrc``): equal to the
functional versions, to a direct computation written here, and the same for any thread count."""

import pytest
import torch

import calibkit.functional as F
from calibkit.metrics import PANEL, CalibrationAccumulator, evaluate

AREAS = {"aurc": F.aurc, "eaurc": F.eaurc, "augrc": F.augrc}


def _data(gen, n=800, k=6, decimals=None):
    logits = torch.randn(n, k, generator=gen, dtype=torch.float64) * 2
    probs = torch.softmax(logits, 1)
    if decimals is not None:  # many tied confidences; rows renormalised, so ties stay ties
        probs = torch.round(probs * 10 ** decimals) / 10 ** decimals
        probs = probs / probs.sum(1, keepdim=True)
    labels = torch.where(torch.rand(n, generator=gen) < 0.6, probs.argmax(1), torch.randint(0, k, (n,), generator=gen))
    return probs, labels


def _direct(conf: list[float], err: list[int]) -> dict[str, float]:
    """Textbook AURC, E-AURC and AUGRC of distinct confidences: one pass down the ranking."""
    ranked = [e for _, e in sorted(zip(conf, err), key=lambda t: -t[0])]
    n, n_err = len(ranked), sum(ranked)
    seen = risk = gen_risk = oracle = 0.0
    for k, e in enumerate(ranked, start=1):
        seen += e
        risk += seen / k
        gen_risk += seen / n
        oracle += max(k - (n - n_err), 0) / k  # the errors last
    return {"aurc": risk / n, "eaurc": (risk - oracle) / n, "augrc": gen_risk / n}


def test_panel_has_the_selective_entries_after_the_calibration_ones():
    assert PANEL[-3:] == ("aurc", "eaurc", "augrc")


def test_panel_areas_equal_a_direct_computation(gen):
    probs, labels = _data(gen)
    conf, pred = probs.max(1)
    assert len(set(conf.tolist())) == len(conf)  # distinct: the textbook ranking is unambiguous
    want = _direct(conf.tolist(), (pred != labels).int().tolist())
    got = evaluate(probs, labels)
    for key in AREAS:
        assert got[key] == pytest.approx(want[key], abs=1e-12), key


@pytest.mark.parametrize("decimals", [None, 1, 2])
def test_panel_areas_are_the_functional_ones(gen, decimals):
    probs, labels = _data(gen, decimals=decimals)
    got = evaluate(probs, labels)
    for key, fn in AREAS.items():
        assert got[key] == float(fn(probs, labels)), key  # one implementation: the same float


def test_panel_areas_in_every_layout_and_with_ignored_rows(gen):
    probs, labels = _data(gen, n=240, k=3)
    dense = probs.reshape(4, 60, 3).movedim(2, 1).reshape(4, 3, 6, 10)
    dense_labels = labels.reshape(4, 6, 10).clone()
    dense_labels[0, 0] = 255
    got = CalibrationAccumulator(ignore_index=255, state="exact").update(dense, dense_labels).compute()
    keep = dense_labels.reshape(-1) != 255
    for key, fn in AREAS.items():
        assert got[key] == pytest.approx(float(fn(probs[keep], labels[keep])), abs=1e-15), key
    binary = torch.rand(300, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 2, (300,), generator=gen)
    got = evaluate(binary, y)
    for key, fn in AREAS.items():
        assert got[key] == float(fn(binary, y)), key


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_panel_is_the_same_for_any_thread_count(gen, dtype):
    probs, labels = _data(gen, n=150_000, k=4, decimals=None)  # large enough to split the sort
    probs = probs.to(dtype)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = evaluate(probs, labels)
        torch.set_num_threads(3)
        three = evaluate(probs, labels)
    finally:
        torch.set_num_threads(before)
    assert one == three


def test_streaming_areas_need_every_row_and_equal_one_shot(gen):
    probs, labels = _data(gen, n=900, decimals=2)
    acc = CalibrationAccumulator(state="exact")
    for p, y in zip(probs.split(250), labels.split(250)):
        acc.update(p, y)
    got, ref = acc.compute(), evaluate(probs, labels)
    for key in AREAS:
        assert got[key] == ref[key], key
