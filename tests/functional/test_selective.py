"""risk_coverage_curve, aurc, eaurc, augrc, selective_risk: hand-computed cases with ties, a direct
loop over coverage levels, the average over every tie-breaking, and the input layouts."""

import itertools
import math

import numpy as np
import pytest
import torch

from calibkit.functional import augrc, aurc, eaurc, entropy_score, risk_coverage_curve, selective_risk


def rows(conf, correct, k=4):
    """(N, K) probabilities whose top label is class 0 with confidence ``conf``; label 0 when correct."""
    conf = torch.as_tensor(conf, dtype=torch.float64)
    p = ((1 - conf) / (k - 1))[:, None].repeat(1, k)
    p[:, 0] = conf
    return p, torch.where(torch.as_tensor(correct, dtype=torch.bool), 0, 1)


def random_set(n, seed, k=5, decimals=None):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, k, generator=g, dtype=torch.float64) * 2
    y = torch.multinomial(torch.softmax(z / 1.5, 1), 1, generator=g).squeeze(1)
    p = torch.softmax(z, 1)
    if decimals is not None:  # coarse confidences: many ties
        top = p.argmax(1)
        c = (p.max(1).values * 10 ** decimals).floor() / 10 ** decimals
        c = c.clamp(min=1.0 / k)
        p = ((1 - c) / (k - 1))[:, None].repeat(1, k)
        p[torch.arange(n), top] = c
    return p, y


# -- direct implementations, one coverage level at a time ---------------------------------------

def direct_errors(conf, err, k):
    """Expected errors among the k most confident rows, ties broken uniformly at random: rows
    above the k-th largest confidence are all taken, the tie at it fills the remaining places."""
    v = sorted(conf, reverse=True)[k - 1]
    above = [e for c, e in zip(conf, err) if c > v]
    tied = [e for c, e in zip(conf, err) if c == v]
    return sum(above) + (k - len(above)) * sum(tied) / len(tied)


def direct(conf, err):
    n = len(conf)
    out = {"aurc": 0.0, "augrc": 0.0, "oracle": 0.0}
    n_correct = n - sum(err)
    for k in range(1, n + 1):
        e = direct_errors(conf, err, k)
        out["aurc"] += e / k / n
        out["augrc"] += e / n / n
        out["oracle"] += max(0, k - n_correct) / k / n
    out["eaurc"] = out["aurc"] - out["oracle"]
    return out


def no_tie_aurc(err_in_order):
    """AURC and AUGRC of rows already ranked (no ties): the textbook definition."""
    n, total = len(err_in_order), 0
    a = g = 0.0
    for k, e in enumerate(err_in_order, 1):
        total += e
        a += total / k / n
        g += total / n / n
    return a, g


def top(p, y):
    conf = p.max(1).values.tolist()
    err = (p.argmax(1) != y).double().tolist()
    return conf, err


# -- hand-computed ------------------------------------------------------------------------------

# 5 rows: 0.9 correct | 0.8 correct, 0.8 error | 0.6 error, 0.6 correct  (three tie groups)
# expected errors E(k), k = 1..5: 0, 0 + 1 * 1/2, 1, 1 + 1/2, 2
# risks E(k)/k: 0, 1/4, 1/3, 3/8, 2/5 -> AURC = (0 + 30 + 40 + 45 + 48) / 120 / 5 = 163/600
# AUGRC = (0 + 0.5 + 1 + 1.5 + 2) / 25 = 1/5
# oracle (3 correct first): errors 0, 0, 0, 1, 2 -> risks 0, 0, 0, 1/4, 2/5 -> 13/20 / 5 = 78/600
# E-AURC = 85/600; curve: coverage 1/5, 3/5, 1 with risk 0, 1/3, 2/5
HAND = rows([0.9, 0.8, 0.8, 0.6, 0.6], [1, 1, 0, 0, 1])


def test_hand_computed_with_ties():
    p, y = HAND
    assert float(aurc(p, y)) == pytest.approx(163 / 600, abs=1e-15)
    assert float(augrc(p, y)) == pytest.approx(1 / 5, abs=1e-15)
    assert float(eaurc(p, y)) == pytest.approx(85 / 600, abs=1e-15)
    cov, risk = risk_coverage_curve(p, y)
    assert cov.tolist() == pytest.approx([1 / 5, 3 / 5, 1.0], abs=1e-15)
    assert risk.tolist() == pytest.approx([0.0, 1 / 3, 2 / 5], abs=1e-15)
    # coverage 0.4 -> k = 2: one of the tied 0.8 rows, half an expected error -> 0.5 / 2
    assert float(selective_risk(p, y, coverage=0.4)) == pytest.approx(0.25, abs=1e-15)
    assert float(selective_risk(p, y, coverage=0.5)) == pytest.approx(1 / 3, abs=1e-15)  # k = 3
    assert float(selective_risk(p, y, coverage=0.7)) == pytest.approx(3 / 8, abs=1e-15)  # k = 4
    assert float(selective_risk(p, y, coverage=1.0)) == pytest.approx(2 / 5, abs=1e-15)


def test_hand_computed_without_ties_is_the_textbook_value():
    # 0.9 correct, 0.8 error, 0.7 error, 0.6 correct: errors 0, 1, 2, 2
    p, y = rows([0.6, 0.9, 0.7, 0.8], [1, 1, 0, 0])
    assert float(aurc(p, y)) == pytest.approx((0 + 1 / 2 + 2 / 3 + 2 / 4) / 4, abs=1e-15)
    assert float(augrc(p, y)) == pytest.approx((0 + 1 + 2 + 2) / 16, abs=1e-15)
    cov, risk = risk_coverage_curve(p, y)
    assert cov.tolist() == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert risk.tolist() == pytest.approx([0, 1 / 2, 2 / 3, 1 / 2])


def test_one_tied_block_is_the_error_rate_everywhere():
    p, y = rows([0.7] * 6, [1, 0, 1, 1, 0, 1])
    for cov in (1 / 6, 0.5, 1.0):
        assert float(selective_risk(p, y, coverage=cov)) == pytest.approx(1 / 3, abs=1e-15)
    assert float(aurc(p, y)) == pytest.approx(1 / 3, abs=1e-15)
    assert float(augrc(p, y)) == pytest.approx(sum(k / 3 for k in range(1, 7)) / 36, abs=1e-15)
    cov, risk = risk_coverage_curve(p, y)
    assert cov.tolist() == [1.0] and risk.tolist() == pytest.approx([1 / 3])


# -- against independent implementations --------------------------------------------------------

@pytest.mark.parametrize("seed,decimals", [(0, None), (1, 1), (2, 2)])
def test_against_direct_loop(seed, decimals):
    p, y = random_set(120, seed, decimals=decimals)
    conf, err = top(p, y)
    ref = direct(conf, err)
    assert float(aurc(p, y)) == pytest.approx(ref["aurc"], abs=1e-12)
    assert float(augrc(p, y)) == pytest.approx(ref["augrc"], abs=1e-12)
    assert float(eaurc(p, y)) == pytest.approx(ref["eaurc"], abs=1e-12)
    n = len(conf)
    for k in (1, 7, 60, 119, 120):
        assert float(selective_risk(p, y, coverage=k / n)) == pytest.approx(direct_errors(conf, err, k) / k, abs=1e-12)
    # the curve: one point per distinct confidence, accepting everything at or above it
    cov, risk = risk_coverage_curve(p, y)
    values = sorted(set(conf), reverse=True)
    assert len(cov) == len(values)
    for v, c, r in zip(values, cov.tolist(), risk.tolist()):
        acc = [e for cc, e in zip(conf, err) if cc >= v]
        assert c == pytest.approx(len(acc) / n, abs=1e-15) and r == pytest.approx(sum(acc) / len(acc), abs=1e-15)


def test_ties_equal_the_average_over_every_tie_breaking():
    # 7 rows, groups of 3, 1 and 3 tied confidences with mixed errors: 7! orderings
    conf = [0.9, 0.9, 0.9, 0.8, 0.5, 0.5, 0.5]
    err = [1, 0, 0, 1, 0, 1, 1]
    p, y = rows(conf, [1 - e for e in err])
    sums = np.zeros(2)
    count = 0
    for perm in itertools.permutations(range(7)):
        order = sorted(perm, key=lambda i: -conf[i])  # stable: the permutation breaks the ties
        sums += no_tie_aurc([err[i] for i in order])
        count += 1
    assert float(aurc(p, y)) == pytest.approx(sums[0] / count, abs=1e-12)
    assert float(augrc(p, y)) == pytest.approx(sums[1] / count, abs=1e-12)


def test_aurc_is_the_mean_selective_risk():
    p, y = random_set(50, 3, decimals=1)
    mean = sum(float(selective_risk(p, y, coverage=k / 50)) for k in range(1, 51)) / 50
    assert float(aurc(p, y)) == pytest.approx(mean, abs=1e-13)


@pytest.mark.parametrize("decimals", [None, 1])
def test_row_order_does_not_matter(decimals):
    p, y = random_set(300, 4, decimals=decimals)
    perm = torch.randperm(300, generator=torch.Generator().manual_seed(5))
    for f in (aurc, augrc, eaurc, selective_risk):
        assert float(f(p[perm], y[perm])) == float(f(p, y))
    for a, b in zip(risk_coverage_curve(p[perm], y[perm]), risk_coverage_curve(p, y)):
        assert torch.equal(a, b)


# -- E-AURC -------------------------------------------------------------------------------------

def test_eaurc_zero_for_a_perfect_ranking_with_ties_inside_each_side():
    # correct rows strictly above every error; ties among correct rows and among errors
    p, y = rows([0.95, 0.9, 0.9, 0.9, 0.7, 0.6, 0.6, 0.6], [1, 1, 1, 1, 1, 0, 0, 0])
    assert float(eaurc(p, y)) == 0.0
    # the oracle's AURC itself: 3 errors of 8 at the end: (1/6 + 2/7 + 3/8) / 8
    assert float(aurc(p, y)) == pytest.approx((1 / 6 + 2 / 7 + 3 / 8) / 8, abs=1e-15)


def test_eaurc_positive_when_a_correct_row_ties_with_an_error():
    p, y = rows([0.9, 0.8, 0.8], [1, 1, 0])
    # E(k): 0, 1/2, 1 vs oracle 0, 0, 1 -> E-AURC = (1/2)/2 / 3
    assert float(eaurc(p, y)) == pytest.approx(1 / 12, abs=1e-15)


def test_eaurc_all_correct_and_all_wrong():
    p, y = rows([0.9, 0.5, 0.7], [1, 1, 1])
    assert float(aurc(p, y)) == 0.0 and float(eaurc(p, y)) == 0.0 and float(augrc(p, y)) == 0.0
    p, y = rows([0.9, 0.5, 0.7], [0, 0, 0])
    assert float(aurc(p, y)) == 1.0 and float(eaurc(p, y)) == 0.0
    assert float(augrc(p, y)) == pytest.approx((1 + 2 + 3) / 9)


def test_oracle_aurc_tends_to_the_closed_form():
    n, r = 100_000, 0.2
    n_err = int(n * r)
    conf = torch.linspace(0.99, 0.5, n, dtype=torch.float64)
    p, y = rows(conf, [1] * (n - n_err) + [0] * n_err)  # errors least confident: the oracle ranking
    assert float(eaurc(p, y)) == 0.0
    assert float(aurc(p, y)) == pytest.approx(r + (1 - r) * math.log(1 - r), abs=1e-4)


# -- layouts and the confidence argument --------------------------------------------------------

def test_custom_confidence_matches_direct_loop():
    p, y = random_set(80, 6)
    score = -entropy_score(p)
    err = (p.argmax(1) != y).double().tolist()
    ref = direct(score.tolist(), err)
    assert float(aurc(p, y, confidence=score)) == pytest.approx(ref["aurc"], abs=1e-12)
    assert float(augrc(p, y, confidence=score.numpy())) == pytest.approx(ref["augrc"], abs=1e-12)
    assert float(aurc(p, y, confidence=p.max(1).values)) == float(aurc(p, y))
    # integer scores are accepted (all tied here: the error rate)
    flat = torch.zeros(80, dtype=torch.long)
    assert float(aurc(p, y, confidence=flat)) == pytest.approx(sum(err) / 80)


def test_binary_dense_and_ignore_index():
    g = torch.Generator().manual_seed(7)
    p1 = torch.rand(40, generator=g, dtype=torch.float64)
    y = (torch.rand(40, generator=g) < 0.6).long()
    two = torch.stack([1 - p1, p1], 1)
    for f in (aurc, augrc, eaurc, selective_risk):
        assert float(f(p1, y)) == pytest.approx(float(f(two, y)), abs=1e-15)
    # dense (N, K, H, W) equals its rows; ignored pixels leave with their confidence
    p, lab = random_set(2 * 3 * 4, 8, k=3)
    dense = p.reshape(2, 3, 4, 3).permute(0, 3, 1, 2)
    dlab = lab.reshape(2, 3, 4).clone()
    assert float(aurc(dense, dlab)) == pytest.approx(float(aurc(p, lab)), abs=1e-15)
    dlab[0, 1, :] = 255
    keep = dlab.reshape(-1) != 255
    score = torch.arange(24, dtype=torch.float64).reshape(2, 3, 4)
    got = aurc(dense, dlab, confidence=score, ignore_index=255)
    want = aurc(p[keep], lab[keep], confidence=score.reshape(-1)[keep])
    assert float(got) == pytest.approx(float(want), abs=1e-15)


def test_outputs_are_float64():
    p, y = HAND
    for f in (aurc, augrc, eaurc, selective_risk):
        v = f(p.float(), y)
        assert v.dtype == torch.float64 and v.dim() == 0
    cov, risk = risk_coverage_curve(p.numpy(), y.numpy())  # numpy in, numpy out
    assert isinstance(cov, np.ndarray) and cov.dtype == risk.dtype == np.float64


def test_coverage_rounding_guard():
    p, y = random_set(10, 9)
    # 0.7 * 10 = 7.000000000000001: ceil would take 8 rows
    conf, err = top(p, y)
    assert float(selective_risk(p, y, coverage=0.7)) == pytest.approx(direct_errors(conf, err, 7) / 7, abs=1e-15)


def test_validation():
    p, y = HAND
    for bad in (0, 0.0, -0.1, 1.01, float("nan"), True, "0.5"):
        with pytest.raises(ValueError, match="coverage"):
            selective_risk(p, y, coverage=bad)
    with pytest.raises(ValueError, match="confidence"):
        aurc(p, y, confidence=torch.tensor([1.0, float("nan"), 0, 0, 0]))
    with pytest.raises(ValueError, match="confidence"):
        aurc(p, y, confidence=torch.zeros(4))
    with pytest.raises(ValueError, match="labels out of range"):
        augrc(p, torch.tensor([0, 1, 2, 3, 4]))
    bad = p.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        eaurc(bad, y)
    with pytest.raises(ValueError, match="softmax"):
        risk_coverage_curve(p * 3, y)
    with pytest.raises(ValueError, match="labels"):
        aurc(p, y[:4])


def test_device_path_with_ignored_rows(monkeypatch):
    # the device path keeps ignored rows with weight 0 instead of removing them
    from calibkit.functional import panel

    p, y = random_set(30, 10, decimals=1)
    y = y.clone()
    y[::4] = -100
    keep = y != -100
    score = torch.linspace(0, 1, 30, dtype=torch.float64)
    want = [float(aurc(p[keep], y[keep])), float(aurc(p[keep], y[keep], confidence=score[keep]))]
    monkeypatch.setattr(panel, "_FORCE_TORCH_PATH", True)
    got = [float(aurc(p, y, ignore_index=-100)), float(aurc(p, y, confidence=score, ignore_index=-100))]
    assert got == pytest.approx(want, abs=1e-15)


def test_levels_expanded_in_chunks_give_the_same_values(monkeypatch):
    import calibkit.functional.selective as S

    p, y = random_set(1000, 5, decimals=2)  # groups straddle the chunk boundaries
    whole = {f.__name__: float(f(p, y)) for f in (aurc, eaurc, augrc)}
    monkeypatch.setattr(S, "_LEVELS", 7)
    chunked = {f.__name__: float(f(p, y)) for f in (aurc, eaurc, augrc)}
    for key in whole:
        assert chunked[key] == pytest.approx(whole[key], abs=1e-14), key


# --- the minimum number of rows (docs/metrics.md, "Minimum samples") ---------------------------

SELECTIVE = {"curve": risk_coverage_curve, "aurc": aurc, "eaurc": eaurc, "augrc": augrc, "risk": selective_risk}


@pytest.mark.parametrize("name", sorted(SELECTIVE))
def test_one_row_is_refused_and_two_rows_give_the_hand_values(name):
    from calibkit.errors import UserError
    from calibkit.functional.selective import MIN_SELECTIVE_ROWS

    assert MIN_SELECTIVE_ROWS == 2
    fn = SELECTIVE[name]
    with pytest.raises(UserError, match=r"^1 scored row\(s\): a risk-coverage curve and its areas need at least 2 "):
        fn(torch.tensor([[0.9, 0.1]]), torch.tensor([0]))
    with pytest.raises(UserError, match="need at least 2 "):  # two rows, one of them ignored
        fn(torch.tensor([[0.9, 0.1], [0.6, 0.4]]), torch.tensor([0, -1]), ignore_index=-1)
    # two rows: confidence 0.9 correct, 0.6 wrong. Curve (1/2, 0), (1, 1/2); AURC = (0/1 + 1/2) / 2;
    # the ranking is the oracle's, so E-AURC = 0; AUGRC = (0/2 + 1/2) / 2; risk at coverage 0.9 (k = 2) = 1/2
    out = fn(torch.tensor([[0.9, 0.1], [0.6, 0.4]]), torch.tensor([0, 1]))
    want = {"curve": ([0.5, 1.0], [0.0, 0.5]), "aurc": 0.25, "eaurc": 0.0, "augrc": 0.25, "risk": 0.5}[name]
    if name == "curve":
        assert [t.tolist() for t in out] == list(want)
    else:
        assert float(out) == pytest.approx(want, abs=1e-15)
