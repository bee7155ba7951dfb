"""The confirmatory comparisons of the bench report, and the power of its validation split.

**Two kinds of evidence.** The method + calibrator pair is chosen on the validation split
(:mod:`calibkit.report.verdict`): legitimate for a *choice*, because the test split takes no part
in it, but with a few hundred validation rows it cannot separate differences of a few tenths of a
point. The test split is larger and untouched by any choice, so it can *test* claims, provided the
claims are declared before it is read and it is read once. The claims are fixed by the validation
stage alone:

* for every training-time method ``m`` (every method but CE), the pair ``m + c_m``, with ``c_m``
  its calibrator chosen on validation, is compared with CE + temperature scaling on the test
  split, in the rule's metric (NLL by default): the paired, seed-averaged bootstrap difference of
  :func:`calibkit.report.paired.paired_delta` (two levels from 3 shared seeds on);
* its two-sided p-value is the inversion of the basic bootstrap interval
  (:func:`basic_p_value`: the smallest ``alpha`` at which the ``1 - alpha`` basic interval
  excludes 0), so a p-value below 0.05 and a 95% interval excluding 0 say the same thing;
* the family is every such comparison; the p-values are **Holm**-adjusted over it
  (:func:`holm`), which keeps the family-wise error rate (the chance that any method is declared
  different from CE + TS when none is) at or below ``alpha`` (0.05) under any dependence between
  the comparisons. A method is *confirmed better* when its adjusted p-value is at most ``alpha``
  and its difference is below 0 (an error metric).

The confirmatory results and the validation choice can disagree: a method may be confirmed
better on test while 500 validation rows could not separate it. The recommendation then follows
the confirmatory result (the sentence says which evidence is which; ``docs/metrics.md``).

**Power.** :func:`detectable` is the smallest true difference that a two-sided test at level
``alpha`` detects with probability ``power`` when the standard error of the difference is ``se``
(the standard deviation of its bootstrap resamples): ``(z_{1 - alpha/2} + z_{power}) se``, 2.80
``se`` at the defaults (0.05, 80%). A difference that is not significant and smaller than that
reads "too little data to tell", not "no difference".
"""

from __future__ import annotations

import math
from statistics import NormalDist

import torch

from calibkit.bench.grid import REFERENCE
from calibkit.calibrators.selection import TIE
from calibkit.report.data import label
from calibkit.report.paired import paired_delta

ALPHA = 0.05  # the family-wise error rate of the confirmatory comparisons
POWER = 0.8  # the power of the detectable difference


def basic_p_value(samples, estimate: float) -> float:
    """Two-sided p-value of ``difference = 0`` from the inversion of the basic bootstrap interval.

    The basic ``1 - a`` interval ``[2 est - q(1 - a/2), 2 est - q(a/2)]`` excludes 0 exactly when
    ``q(a/2) > 2 est`` or ``q(1 - a/2) < 2 est``, so the smallest such ``a`` is
    ``2 min(P*(theta* <= 2 est), P*(theta* >= 2 est))`` (``P*``: the share of the resamples),
    at most 1.
    """
    s = torch.as_tensor(samples, dtype=torch.float64)
    below = float((s <= 2 * estimate).double().mean())
    above = float((s >= 2 * estimate).double().mean())
    return min(1.0, 2 * min(below, above))


def holm(pvalues: dict) -> dict:
    """Holm's step-down adjusted p-values ``{key: p_adj}`` (the same keys; ``None`` values are kept
    out of the family and stay ``None``).

    Sorted ascending, ``p_adj(i) = max_{j <= i} min(1, (m - j + 1) p(j))`` with ``m`` tested
    hypotheses: rejecting where ``p_adj <= alpha`` is Holm's procedure at family-wise level ``alpha``.
    """
    tested = sorted((p, i, k) for i, (k, p) in enumerate(pvalues.items()) if p is not None)
    m, out, running = len(tested), {k: None for k in pvalues}, 0.0
    for j, (p, _, k) in enumerate(tested):
        running = max(running, min(1.0, (m - j) * p))
        out[k] = running
    return out


def detectable(se: float, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest difference a two-sided test at level ``alpha`` detects with probability
    ``power`` when the difference's standard error is ``se``: ``(z_{1-alpha/2} + z_power) se``."""
    z = NormalDist().inv_cdf
    return (z(1 - alpha / 2) + z(power)) * se


def confirmatory(summary: dict, probs, selections: dict, metric: str = "nll", n_boot: int = 1000, seed: int = 0,
                 alpha: float = ALPHA) -> dict | None:
    """Every method + its validation-chosen calibrator against CE + temperature scaling on test,
    Holm-adjusted over the methods (module docstring); None without CE runs or other methods.

    Returns:
        ``{"metric", "alpha", "n_boot", "tests": {method: {"calibrator", "diff", "lo", "hi", "p", "p_holm",
        "confirmed", "detectable", "seeds", "levels"}}}`` (``confirmed``: ``"better"``,
        ``"worse"`` or None; a method without shared seeds has no entry).
    """
    if REFERENCE not in summary or REFERENCE not in selections:
        return None
    ce_runs = summary[REFERENCE]["runs"]
    tests = {}
    for m, sel in selections.items():
        if m == REFERENCE or m not in summary:
            continue
        d = paired_delta(summary[m]["runs"], ce_runs, probs, metric, after_a=sel.chosen, after_b="temperature",
                         n_boot=n_boot, seed=seed, with_samples=True)
        if d is None:
            continue
        samples = d.pop("samples")
        tests[m] = {"calibrator": sel.chosen, "diff": d["diff"], "lo": d["lo"], "hi": d["hi"],
                    "p": basic_p_value(samples, d["diff"]), "seeds": d["seeds"], "levels": d["levels"],
                    "detectable": detectable(float(samples.std()), alpha)}
    if not tests:
        return None
    adjusted = holm({m: t["p"] for m, t in tests.items()})
    for m, t in tests.items():
        t["p_holm"] = adjusted[m]
        real = abs(t["diff"]) > TIE  # two copies of one model differ by float rounding: never "confirmed"
        t["confirmed"] = (("better" if t["diff"] < 0 else "worse") if adjusted[m] <= alpha and real else None)
    return {"metric": metric, "alpha": alpha, "n_boot": n_boot, "tests": tests}


def confirmed_better(conf: dict | None) -> list[str]:
    """The methods confirmed better than CE + TS, smallest adjusted p-value first."""
    if not conf:
        return []
    better = [(t["p_holm"], m) for m, t in conf["tests"].items() if t["confirmed"] == "better"]
    return [m for _, m in sorted(better)]


def confirmatory_lines(conf: dict | None) -> list[str]:
    """The block's confirmatory lines (Markdown bullets), one per method."""
    if not conf:
        return []
    metric = conf["metric"]
    scale, digits = (100, 2) if metric == "ece" else (1, 4)
    unit = " x100" if metric == "ece" else ""
    n = len(conf["tests"])
    lines = [f"- Confirmatory (test, read once; each method + its validation-chosen calibrator minus CE + "
             f"temperature scaling, {metric.upper()}{unit}, Holm-adjusted over {n} method(s), family-wise "
             f"error {100 * conf['alpha']:g}%):"]
    for m, t in conf["tests"].items():
        verdict = {"better": "confirmed better", "worse": "confirmed worse"}.get(t["confirmed"] or "")
        if verdict is None:
            small = abs(t["diff"]) < t["detectable"]
            verdict = ("too little data to tell" if small else "not significant") + (
                f" (detectable: {scale * t['detectable']:.{digits}f})")
        lines.append(f"  - {label(m)} + {t['calibrator']}: {scale * t['diff']:+.{digits}f} "
                     f"[{scale * t['lo']:+.{digits}f}, {scale * t['hi']:+.{digits}f}], "
                     f"{p_text('p', t['p'], conf.get('n_boot'))}, "
                     f"{p_text('Holm p', t['p_holm'], conf.get('n_boot'), n)}: {verdict}")
    return lines


def p_text(name: str, p: float, n_boot: int | None, family: int = 1) -> str:
    """``"p = 0.0436"``; a bootstrap p-value of 0 as the bound its resamples give, ``"p < 2/n_boot"``
    (the smallest nonzero value :func:`basic_p_value` takes is ``2 / n_boot``), times ``family`` for
    Holm's adjusted value (at most ``family`` times the raw one)."""
    if p == 0 and n_boot:
        return f"{name} < {min(1.0, 2 * family / n_boot):.2g}"
    return f"{name} = {p:.3g}"


def power_line(rec: dict) -> str | None:
    """The validation split's power line of the block: the smallest difference of the rule's metric
    (NLL, Brier score or ECE) it detects, from the resamples of the runner-up pair minus the chosen
    pair; a line saying so when no other pair is eligible (None without resamples)."""
    p = rec.get("power")
    if not p:
        if "rule" in rec and rec.get("runner_up", 0) is None:  # no other eligible pair: nothing to size
            return ("- Power: no other pair is eligible on validation, so there is no difference between pairs "
                    "for this validation split to detect.")
        return None
    metric = rec["rule"].select_by
    scale, digits, unit = (100, 2, " x100") if metric == "ece" else (1, 4, "")
    return (f"- Power: with {rec['val_rows']} validation rows and {rec['seeds']} seed(s), the smallest "
            f"{metric.upper()}{unit} difference between pairs this validation split detects (two-sided "
            f"{100 * ALPHA:g}%, power {100 * POWER:g}%) is {scale * p['detectable']:.{digits}f} (2.80 x the "
            f"bootstrap standard error {scale * p['se']:.{digits}f}); a smaller difference that is not "
            "significant means too little data to tell, not no difference.")


def validation_power(selections: dict, pair: tuple, other: tuple | None) -> dict | None:
    """``{"se", "detectable"}`` of the validation difference ``other - pair`` in the rule's metric
    (the standard deviation of its paired resamples), or None without resamples."""
    if other is None:
        return None
    a = selections[other[0]].scores[other[1]].samples
    b = selections[pair[0]].scores[pair[1]].samples
    if a is None or b is None or a.shape != b.shape:
        return None
    se = float((a - b).std())
    return {"se": se, "detectable": detectable(se)} if math.isfinite(se) else None


def null_p_values(n_methods: int, n_rows: int, n_boot: int, seed: int) -> dict[int, float]:
    """The p-values of :func:`basic_p_value` for ``n_methods`` null methods against CE on one simulated
    test set (the family-wise error check of ``docs/metrics.md``; ``benchmarks/confirmatory_fwer.py``).

    Every model is the truth (3 classes, logits ``1.5 N(0, 1)``, labels drawn from them) plus its own
    independent ``N(0, 1)`` noise, so every expected test NLL is the same. The resampled NLL difference
    is the mean of the per-row differences over the resampled rows (what the paired bootstrap of the
    NLL computes), one draw of rows shared by the methods.
    """
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n_rows, 3, generator=g, dtype=torch.float64) * 1.5
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)

    def losses():
        logp = torch.log_softmax(z + torch.randn(z.shape, generator=g, dtype=torch.float64), 1)
        return -logp.gather(1, y.view(-1, 1)).squeeze(1)

    ce = losses()
    idx = torch.randint(0, n_rows, (n_boot, n_rows), generator=g)
    out = {}
    for m in range(n_methods):
        d = losses() - ce
        out[m] = basic_p_value(d[idx].mean(1), float(d.mean()))
    return out
