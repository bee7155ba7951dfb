"""Bootstrap intervals for many calibrated probability sets: per-model calls vs one shared draw.

What ``calibkit calibrate`` needs for its table: for each of ``M`` probability sets on the same
test labels, the bootstrap interval of ECE and the paired difference from a reference set. Two
ways, timed side by side in one process (so the load of other processes hits both alike):

* ``per call``: ``bootstrap_ci`` for each set and ``paired_bootstrap_diff`` for each set against
  the reference (``2 M - 1`` index draws, ``3 M - 2`` metric evaluations on the resamples);
* ``shared``: one ``bootstrap_cis(..., reference=...)`` (one draw, ``M`` evaluations).

The results are checked to be equal bit for bit before the times are printed.

Data: rows 5000-9999 (the test split) of ``cifar10_wrn16-4.npz`` (K = 10) and
``cifar100_wrn16-4.npz`` (K = 100) in ``/work/shared/data/real_outputs``; the ``M`` sets are
``softmax(log p / T)`` for ``M`` temperatures from 0.5 to 3 (stand-ins for ``M`` calibrators).

Usage: ``.venv/bin/python benchmarks/bootstrap_shared.py [--sets 10] [--n-boot 1000] [--metric ece] [--repeats 2]``
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import torch

DATA = Path("/work/shared/data/real_outputs")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", type=int, default=10)
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--metric", default="ece")
    ap.add_argument("--repeats", type=int, default=2, help="rounds of both ways; the best time of each is kept")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from calibkit.bootstrap import bootstrap_ci, bootstrap_cis, paired_bootstrap_diff

    print(f"torch {torch.__version__}, {args.threads} thread(s), {os.cpu_count()} CPUs, load average "
          f"{', '.join(f'{v:.1f}' for v in os.getloadavg())}; {args.sets} sets, {args.n_boot} resamples, "
          f"metric {args.metric}, best of {args.repeats}")
    print(f"{'data':<22}{'N x K':>12}{'per call s':>12}{'shared s':>10}{'speed-up':>10}")
    for file in ("cifar10_wrn16-4.npz", "cifar100_wrn16-4.npz"):
        with np.load(DATA / file) as f:
            p, y = torch.from_numpy(f["probs"][5000:]).double(), torch.from_numpy(f["labels"][5000:]).long()
        logp = p.clamp(min=float(np.finfo(np.float32).tiny)).log()
        sets = {f"T={t:.2f}": torch.softmax(logp / t, 1) for t in np.linspace(0.5, 3.0, args.sets)}
        ref = next(iter(sets))
        kw = dict(n_resamples=args.n_boot, seed=0)
        per_call = shared = float("inf")
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            cis = {k: bootstrap_ci(args.metric, q, y, **kw) for k, q in sets.items()}
            diffs = {k: paired_bootstrap_diff(q, sets[ref], y, args.metric, **kw) for k, q in sets.items() if k != ref}
            per_call = min(per_call, time.perf_counter() - t0)
            t0 = time.perf_counter()
            cis2, diffs2 = bootstrap_cis(args.metric, sets, y, reference=ref, **kw)
            shared = min(shared, time.perf_counter() - t0)
        for a, b in [(cis[k], cis2[k]) for k in cis] + [(diffs[k], diffs2[k]) for k in diffs]:
            assert (a.estimate, a.low, a.high, a.bias) == (b.estimate, b.low, b.high, b.bias)
            assert torch.equal(a.samples, b.samples)
        print(f"{file:<22}{f'{len(y)} x {p.shape[1]}':>12}{per_call:>12.3f}{shared:>10.3f}{per_call / shared:>9.1f}x")


if __name__ == "__main__":
    main()
