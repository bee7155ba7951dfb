"""Fit time of every registered calibrator on real outputs, and of 5 cross-fitted fits, cold vs warm-started.

Data: ``/work/shared/data/real_outputs/cifar10_wrn16-4.npz`` (K = 10) and ``cifar100_wrn16-4.npz``
(K = 100), rows 0-4999 (the validation split), logits ``log(probs)`` with the probabilities clipped
at the smallest positive float32. For each calibrator:

* ``full``: one fit on all 5,000 rows (what cross-fitting starts from);
* ``5 cold``: the total time of 5 fits, fit ``f`` on the rows outside fold ``f`` (a seeded
  permutation cut into 5 parts), each from scratch;
* ``5 warm``: the same 5 fits with ``fit(..., init=full)``.

Cold and warm fits of one fold run back to back in one process, so the load from other processes
hits both alike; on a shared machine compare the ratio, not the seconds. ``iters`` is the mean of
``n_iter_`` over the 5 fits (cold / warm) where the calibrator has one; ``oof NLL`` the NLL of the
out-of-fold predictions (each row predicted by the fit that did not see it), cold / warm: where
the two differ, the warm start changed the result (a fit stopped at ``max_iter``, or Dirichlet's
reused ``(lam, mu)``), and a lower warm value may be the held-out fold leaking through ``init``.

Usage: ``.venv/bin/python benchmarks/calibrator_fit_speed.py [--threads 1] [--folds 5] [--only a,b]``
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import torch

DATA = Path("/work/shared/data/real_outputs")


def load_val(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows 0-4999 of a real-outputs file as float32 logits ``log(max(p, tiny))`` and int64 labels."""
    with np.load(DATA / name) as f:
        probs, labels = f["probs"][:5000], f["labels"][:5000]
    tiny = np.finfo(np.float32).tiny
    return torch.from_numpy(np.log(np.maximum(probs, tiny)).astype(np.float32)), torch.from_numpy(labels).long()


def _fit(cls, x, y, idx=None, **kw):
    """A fresh ``cls`` fitted on (x, y), or on the rows ``idx`` of them."""
    if idx is not None:
        x, y = x[idx], y[idx]
    return cls().fit(x, y, **kw)


def _timed(fn, *args, **kw):
    t0 = time.perf_counter()
    out = fn(*args, **kw)
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--only", help="comma-separated calibrators (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from calibkit.calibrators import CALIBRATORS

    names = args.only.split(",") if args.only else list(CALIBRATORS)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {os.cpu_count()} CPUs, load average "
          f"{', '.join(f'{v:.1f}' for v in os.getloadavg())}; {args.folds} cross-fitted fits on 4/5 of 5,000 rows")
    for file in ("cifar10_wrn16-4.npz", "cifar100_wrn16-4.npz"):
        x, y = load_val(file)
        CALIBRATORS["temperature"]().fit(x[:100], y[:100])  # first-call costs out of the timings
        perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
        folds = perm.tensor_split(args.folds)
        trains = [torch.cat([folds[j] for j in range(args.folds) if j != f]).sort().values
                  for f in range(args.folds)]
        print(f"\n{file}: N = {len(y)}, K = {x.shape[1]}")
        print(f"{'calibrator':<17}{'full s':>8}{'5 cold s':>10}{'5 warm s':>10}{'warm/cold':>11}{'iters cold/warm':>17}"
              f"{'oof NLL cold/warm':>21}")
        for name in names:
            cls = CALIBRATORS[name]
            full, t_full = _timed(_fit, cls, x, y)
            cold = warm = 0.0
            it_cold, it_warm = [], []
            nll = {"cold": 0.0, "warm": 0.0}
            for idx, held in zip(trains, folds):
                c, t = _timed(_fit, cls, x, y, idx)
                cold += t
                w, t = _timed(_fit, cls, x, y, idx, init=full)
                warm += t
                for tag, cal in (("cold", c), ("warm", w)):
                    p = cal.predict_proba(x[held]).double().gather(1, y[held, None])
                    nll[tag] -= float(p.clamp(min=1e-300).log().sum()) / len(y)
                if hasattr(c, "n_iter_"):
                    it_cold.append(c.n_iter_)
                    it_warm.append(w.n_iter_)
            iters = f"{np.mean(it_cold):.1f} / {np.mean(it_warm):.1f}" if it_cold else "-"
            print(f"{name:<17}{t_full:>8.3f}{cold:>10.3f}{warm:>10.3f}{warm / cold:>11.2f}{iters:>17}"
                  f"{nll['cold']:>12.5f} / {nll['warm']:.5f}")


if __name__ == "__main__":
    main()
