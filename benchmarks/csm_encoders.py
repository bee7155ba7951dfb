"""CSM's reannotation encoder: the seed's CE run against the frozen ImageNet EfficientNet-Lite0.

Runs a preset (default: ``default``) twice with the methods CE and CSM, once with each bench
encoder (``[csm] encoder = "classifier"`` and ``"efficientnet_lite0"``, calibkit[pretrained]),
into one directory (resumed when run again), then prints:

1. **Agreement of the soft labels** on the generated set, seed by seed: the mean absolute
   difference of the two annotations' ``lam'`` (the share of class ``c1``), the Pearson
   correlation of their projections ``lam_hat``, the share of images whose dominant class
   (``lam' > 0.5``) is the same, and each encoder's correlation with the mixing weight the
   generator was asked for (``lam`` = 0, 1/7, ..., 1 along a group).
2. **The CSM runs** trained on each annotation: test accuracy and ECE (x100) before and after
   temperature scaling, seed means, and the paired interval of the seed-averaged difference
   (EfficientNet minus classifier; :mod:`calibkit.seed_bootstrap`: seeds and test samples resampled
   from 3 shared seeds on, test samples only below).

    python benchmarks/csm_encoders.py --out /tmp/csm_encoders              (3 seeds)
    python benchmarks/csm_encoders.py --out /tmp/csm_encoders --seeds 0    (a quick look)
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import numpy as np
import torch

from calibkit.bench.grid import PRESETS
from calibkit.bench.runner import Bench, run_dir_for
from calibkit.bootstrap import paired_bootstrap_diff
from calibkit.calibrators import TemperatureScaling
from calibkit.methods.csm.store import ANNOT_TENSORS, load_store
from calibkit.metrics import evaluate
from calibkit.rundir import load_logits, read_tensors
from calibkit.seed_bootstrap import seed_paired_interval
from calibkit.store import Store

ENCODERS = ("classifier", "efficientnet_lite0")


def variant(base, encoder: str):
    return dataclasses.replace(base, name=f"{base.name}-csm-{encoder}", methods=("ce", "csm"),
                               csm={**base.csm, "encoder": encoder})


def run_variants(base, out: Path, seeds) -> dict:
    presets = {}
    for enc in ENCODERS:
        preset = variant(base, enc)
        t0 = time.perf_counter()
        bench = Bench(preset, out, seeds=seeds)
        try:
            counts = bench.run()
        finally:
            bench.close()
        print(f"{preset.name}: {counts.done} run(s) done, {counts.skipped} skipped, {counts.failed} failed "
              f"in {time.perf_counter() - t0:.0f} s")
        if counts.failed:
            raise SystemExit(f"{preset.name}: a run failed; see {out}/logs")
        presets[enc] = preset
    return presets


def annotation(out: Path, preset, seed: int) -> dict:
    """The annotated copy the CSM run of ``seed`` trained on, as its record names it."""
    with Store(out / "runs.db", readonly=True) as store:
        (row,) = [r for r in store.runs(preset.name) if r["method"] == "csm" and r["seed"] == seed]
    return read_tensors(Path(row["extra"]["csm_store"]) / ANNOT_TENSORS)


def pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(np.corrcoef(a.double().numpy(), b.double().numpy())[0, 1])


def agreement(out: Path, presets: dict, seeds, source) -> None:
    store = load_store(source)
    print("\nSoft labels on the generated set (classifier = the seed's CE run, efficientnet = ImageNet Lite0)")
    print("seed  mean|lam'_c - lam'_e|  r(lam_hat)  same dominant class  r(lam_c, asked)  r(lam_e, asked)")
    for s in seeds:
        c, e = (annotation(out, presets[enc], s) for enc in ENCODERS)
        for t in (c, e):  # both annotate the store in its own order
            assert torch.equal(t["group"], store["group"]) and torch.equal(t["member"], store["member"])
        mae = float((c["lam_annot"] - e["lam_annot"]).abs().mean())
        same = float(((c["lam_annot"] > 0.5) == (e["lam_annot"] > 0.5)).double().mean())
        print(f"{s:>4}  {mae:>20.3f}  {pearson(c['lam_hat'], e['lam_hat']):>10.3f}  {100 * same:>18.1f}%  "
              f"{pearson(c['lam_annot'], store['lam']):>15.3f}  {pearson(e['lam_annot'], store['lam']):>15.3f}")


def probs_of(run: Path, ts: bool) -> tuple[torch.Tensor, torch.Tensor]:
    lg = load_logits(run)
    if ts:
        cal = TemperatureScaling().fit(lg["val_logits"], lg["val_labels"])
        return cal.predict_proba(lg["test_logits"].double()), lg["test_labels"]
    return torch.softmax(lg["test_logits"].double(), dim=1), lg["test_labels"]


def comparison(out: Path, presets: dict, seeds, resamples: int) -> None:
    print("\nCSM runs on the test set (x100; seed means; d = efficientnet - classifier, 95% paired interval)")
    for ts in (False, True):
        rows = {m: {enc: [] for enc in ENCODERS} for m in ("acc", "ece")}
        diffs = {m: ([], []) for m in ("acc", "ece")}
        for s in seeds:
            got = {enc: probs_of(run_dir_for(out, presets[enc].name, "csm", s), ts) for enc in ENCODERS}
            labels = got["classifier"][1]
            assert torch.equal(labels, got["efficientnet_lite0"][1]), "the runs must share one test set"
            for enc in ENCODERS:
                panel = evaluate(got[enc][0], labels)
                for m in rows:
                    rows[m][enc].append(panel[m])
            for m in diffs:
                d = paired_bootstrap_diff(got["efficientnet_lite0"][0], got["classifier"][0], labels, m,
                                          n_resamples=resamples, seed=0)
                diffs[m][0].append(d.estimate)
                diffs[m][1].append(d.samples)
        label = "after TS " if ts else "before TS"
        for m in rows:
            iv = seed_paired_interval(diffs[m][0], torch.stack(diffs[m][1]))
            c, e = (100 * float(np.mean(rows[m][enc])) for enc in ENCODERS)
            print(f"{label} {m:<4} classifier {c:6.2f}  efficientnet {e:6.2f}  d {100 * iv['estimate']:+.2f} "
                  f"[{100 * iv['lo']:+.2f}, {100 * iv['hi']:+.2f}] ({iv['levels']}-level, {iv['seeds']} seeds)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path, help="bench directory (resumed when it exists)")
    ap.add_argument("--preset", default="default", help="a built-in image preset with CSM (default: default)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--resamples", type=int, default=1000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    base = PRESETS[args.preset]
    presets = run_variants(base, args.out, args.seeds)
    from calibkit.bench.twostage import csm_source

    agreement(args.out, presets, args.seeds, csm_source(base, None))
    comparison(args.out, presets, args.seeds, args.resamples)


if __name__ == "__main__":
    main()
