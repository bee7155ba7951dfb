"""Regret of calibkit's calibrator choice on the real-outputs test bed, under each selection rule.

For every ``.npz`` of the real-outputs folder (``probs`` (10000, K) and ``labels``; see its README)
and every repeat, the 10,000 rows are split into a validation half and a test half: repeat 0 is the
README's split (rows 0-4999 validation), repeat ``r > 0`` a random half drawn with seed ``r``.
Logits = log(probs), probabilities raised to the smallest positive float32 first.

On each split every calibrator is cross-fitted once on the validation half, and the stack of the
smooth ones (:mod:`calibkit.calibrators.stack`) is built from their out-of-fold predictions
(:func:`calibkit.calibrators.crossfit.cross_fit_predictions`) and fitted on the whole half; each rule
then chooses from the same out-of-fold predictions (its own resamples, :func:`with_samples`), so the
rules differ in the rule alone. Every fitted calibrator (and the uncalibrated model) is scored on
the test half; the **regret** of a choice is its test NLL (or Brier score) minus the lowest test NLL
(Brier) of any candidate on that split, in hindsight. Fixed temperature scaling and fixed SMS are
scored the same way. ``acc loss`` is the largest drop of test accuracy below the uncalibrated
model's of any chosen calibrator, in points.

Usage::

    python benchmarks/selection_regret.py [FOLDER] [--repeats 3] [--n-boot 1000] [--cache DIR] [--model STEM ...]

Prints the per-model mean regrets and the mean over models (markdown). With ``--cache DIR`` each
split's raw facts are kept in ``DIR/<model>__<repeat>__<n_boot>__facts-v2.json`` (every candidate's
test numbers and its cross-fitted scores with the NLL, Brier and ECE resamples) and read back by a later run (a run cut
short resumes); ``--only-cached`` prints the table of the splits already there, naming the models
left out. Files are processed smallest K first; ``--model`` restricts a run to some of them, so
that the slow K = 100 models can run in their own processes on the same cache.

Cost: at K = 100 one split is dominated by the maps with ``K^2 + K`` parameters (SMS, Dirichlet
calibration, matrix scaling), fitted on the whole validation half and on each of its five
cross-fitting folds; every rule chooses from the same out-of-fold predictions, whose NLL, Brier and
ECE resamples are drawn once per split (the draw depends on the resamples, seed and bins alone, so
this changes no number).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

import calibkit.functional as F
from calibkit.calibrators.crossfit import CrossFitScore, cross_fit_predictions, with_samples
from calibkit.calibrators.selection import NONE, SelectionRule, choose

DEFAULT = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "real_outputs"

#: The rules compared, by label ("(the default)" marks the rule ``SelectionRule()`` applies, :func:`label`).
RULES = {
    "nll, lowest": SelectionRule(default="temperature", significance=False),
    "nll, temperature unless significantly beaten": SelectionRule(default="temperature", significance=True),
    "nll, sms unless significantly beaten": SelectionRule(default="sms", significance=True),
    "nll, stack unless significantly beaten": SelectionRule(default="stack", significance=True),
    "brier, lowest": SelectionRule(select_by="brier", default="temperature", significance=False),
    "brier, temperature unless significantly beaten": SelectionRule(select_by="brier", default="temperature",
                                                                     significance=True),
    "brier, sms unless significantly beaten": SelectionRule(select_by="brier", default="sms", significance=True),
    "ece, temperature unless significantly beaten": SelectionRule(select_by="ece", default="temperature"),
}
FIXED = ("temperature", "sms", "stack")
#: In the cache files' names: facts of an earlier layout (before the stack was a candidate) are not read.
FACTS = "facts-v2"


def load(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logits, labels)`` of one file: log of the probabilities clipped at the smallest positive float32."""
    with np.load(path, allow_pickle=False) as f:
        probs, labels = f["probs"], f["labels"]
    tiny = float(np.finfo(np.float32).tiny)
    return torch.log(torch.as_tensor(probs, dtype=torch.float64).clamp(min=tiny)), torch.as_tensor(labels).long()


def split(n: int, repeat: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Validation and test indices of one repeat (repeat 0: the first and second halves)."""
    idx = torch.arange(n) if repeat == 0 else torch.randperm(n, generator=torch.Generator().manual_seed(repeat))
    return idx[: n // 2], idx[n // 2:]


#: The metrics whose resamples are kept per split (every rule chooses by one of them).
METRICS = ("nll", "brier", "ece")


def one_split(z: torch.Tensor, y: torch.Tensor, repeat: int, n_boot: int) -> dict:
    """The raw facts of one split, from which every rule's choice is replayed (:func:`regrets`).

    ``{"test": {name: {"nll", "brier", "acc"}}, "scores": {metric: {name: CrossFitScore dict}}}``:
    every candidate's test numbers (``"none"``: the uncalibrated model) and its cross-fitted scores
    with the resampled values of each metric of :data:`METRICS` (seed and bins of the default rule).
    """
    val, test = split(len(y), repeat)
    base_rule = SelectionRule(n_boot=n_boot)
    scores, fitted, oof, yv = cross_fit_predictions(z[val], y[val], rule=base_rule)
    zt, yt = z[test], y[test]
    test_probs = {NONE: torch.softmax(zt, 1)}
    test_probs.update({n: c.predict_proba(zt).double() for n, c in fitted.items()})
    num = {n: {"nll": float(F.nll(p, yt)), "brier": float(F.brier(p, yt)), "acc": float(F.accuracy(p, yt))}
           for n, p in test_probs.items()}
    resampled = {m: with_samples(scores, oof, yv, replace(base_rule, select_by=m)) for m in METRICS}
    return {"test": num, "scores": {m: {n: s.to_dict() for n, s in v.items()} for m, v in resampled.items()}}


def regrets(facts: dict, exclude: frozenset = frozenset()) -> dict:
    """``{label: {"nll", "brier", "acc_loss", "chosen"}}`` of every rule of :data:`RULES` and fixed choice."""
    num = facts["test"]
    pool = {n: v for n, v in num.items() if n not in exclude}  # the candidates of the hindsight
    best = {m: min(v[m] for v in pool.values()) for m in ("nll", "brier")}

    def regret(name: str) -> dict:
        return {"nll": num[name]["nll"] - best["nll"], "brier": num[name]["brier"] - best["brier"],
                "acc_loss": 100 * (num[NONE]["acc"] - num[name]["acc"]), "chosen": name}

    scores = {m: {n: CrossFitScore.from_dict(d) for n, d in v.items()} for m, v in facts["scores"].items()}
    out = {label: regret(choose(scores[rule.select_by], rule).chosen) for label, rule in RULES.items()}
    for name in FIXED:
        out[f"always {name}"] = regret(name)
    hindsight = min(pool, key=lambda n: num[n]["nll"])  # the uncalibrated model included
    out["best in hindsight (test NLL)"] = regret(hindsight)
    return out


def _load_all(path: Path, repeats: int, n_boot: int, cache: Path | None, only_cached: bool,
              exclude: frozenset = frozenset()) -> list[dict] | None:
    runs = []
    for r in range(repeats):
        file = None if cache is None else cache / f"{path.stem}__{r}__{n_boot}__{FACTS}.json"
        if file is not None and file.is_file():
            runs.append(regrets(json.loads(file.read_text()), exclude))
            continue
        if only_cached:
            return None
        z, y = load(path)
        facts = one_split(z, y, r, n_boot)
        if file is not None:
            file.parent.mkdir(parents=True, exist_ok=True)
            tmp = file.with_suffix(".tmp")
            tmp.write_text(json.dumps(facts))
            tmp.replace(file)
        runs.append(regrets(facts, exclude))
    return runs


def label(name: str) -> str:
    """``name``, marked when its rule is the one a default :class:`SelectionRule` of its metric applies."""
    rule = RULES.get(name)
    if rule is None:
        return name
    default = SelectionRule(select_by=rule.select_by)
    same = (rule.anchor, rule.uses_significance) == (default.anchor, default.uses_significance)
    if not same:
        return name
    which = "" if rule.select_by == "nll" else f" of --select-by {rule.select_by}"
    return f"{name} (the default{which})"


def table(per_model: dict, repeats: int) -> str:
    labels = list(next(iter(per_model.values()))[0])
    head = ["choice"] + [m for m in per_model] + ["**mean NLL regret**", "**mean Brier regret**", "max acc loss"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in labels:
        cells, nlls, briers, losses = [], [], [], []
        for runs in per_model.values():
            n = sum(r[name]["nll"] for r in runs) / len(runs)
            b = sum(r[name]["brier"] for r in runs) / len(runs)
            nlls.append(n)
            briers.append(b)
            losses += [r[name]["acc_loss"] for r in runs]
            cells.append(f"{n:.4f} / {b:.4f}")
        lines.append(f"| {label(name)} | " + " | ".join(cells) + f" | **{sum(nlls) / len(nlls):.4f}** | "
                     f"**{sum(briers) / len(briers):.4f}** | {max(losses):+.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", default=str(DEFAULT))
    ap.add_argument("--repeats", type=int, default=3, help="validation/test splits per file (default 3)")
    ap.add_argument("--n-boot", type=int, default=1000, help="resamples of the significance step (default 1000)")
    ap.add_argument("--cache", metavar="DIR", help="keep each split's result here and reuse it")
    ap.add_argument("--only-cached", action="store_true", help="print the table of the cached splits only")
    ap.add_argument("--model", action="append", metavar="STEM",
                    help="only this file of the folder (repeatable): several processes sharing --cache can each "
                         "run some models, and a last run with --only-cached prints the whole table")
    ap.add_argument("--hindsight-without", action="append", metavar="NAME",
                    help="leave this candidate out of the best in hindsight (repeatable; e.g. stack: regret "
                         "against the best single calibrator, which a mixture can go below)")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        print("--repeats must be >= 1", file=sys.stderr)
        return 2
    files = sorted(Path(args.folder).glob("*.npz"))
    if args.model:
        unknown = sorted(set(args.model) - {f.stem for f in files})
        if unknown:
            print(f"--model {', '.join(unknown)}: no such .npz in {args.folder}", file=sys.stderr)
            return 2
        files = [f for f in files if f.stem in args.model]
    if not files:
        print(f"no .npz files in {args.folder}", file=sys.stderr)
        return 1
    files.sort(key=lambda f: (np.load(f, allow_pickle=False)["probs"].shape[1], f.name))
    torch.set_num_threads(1)
    start = time.perf_counter()
    per_model, missing = {}, []
    cache = Path(args.cache) if args.cache else None
    for path in files:
        runs = _load_all(path, args.repeats, args.n_boot, cache, args.only_cached,
                         frozenset(args.hindsight_without or ()))
        if runs is None:
            missing.append(path.stem)
            continue
        per_model[path.stem] = runs
        chosen = {k: "/".join(r[k]["chosen"] for r in runs) for k in list(RULES) + ["best in hindsight (test NLL)"]}
        mean = {k: round(sum(r[k]["nll"] for r in runs) / len(runs), 4) for k in runs[0]}
        print(f"{path.stem}: chosen {chosen}; mean NLL regret {mean} ({time.perf_counter() - start:.0f} s so far)",
              file=sys.stderr)
    if not per_model:
        print("no model finished", file=sys.stderr)
        return 1
    print(f"Test-NLL / test-Brier regret (mean over {args.repeats} validation/test split(s) per model), "
          "and the largest test accuracy loss of the choice (points)"
          + (f"; hindsight without {', '.join(args.hindsight_without)}" if args.hindsight_without else "") + ":\n")
    print(table(per_model, args.repeats))
    if missing:
        print(f"\nNot finished (left out of the means): {', '.join(missing)}")
    print(f"\n{len(per_model)} models x {args.repeats} split(s) in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
