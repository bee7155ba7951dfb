"""Cost of MaC-Cal's deployed predictor: S masked heads on features computed once.

Times, side by side in one process and interleaved over rounds (so that a shared machine's drifts
cancel in the ratios), on N inputs of the given model:

* ``features``: the backbone, ``model.forward_features(x)`` (what every predictor pays once);
* ``head``: the unmasked head on those features (plain inference, ``mc_samples = 0``);
* ``mc S``: the deployed predictor ``deployed_proba`` with S masked heads (masks drawn from a
  seeded CPU generator on every call, as deployed).

Prints the median time of each and the ratios ``mc S / head`` and ``(features + mc S) /
(features + head)``: the end-to-end cost of deploying MaC-Cal instead of the plain network.

    OMP_NUM_THREADS=1 python benchmarks/maccal_inference.py --model mlp --n 10000 --rounds 5
    OMP_NUM_THREADS=1 python benchmarks/maccal_inference.py --model resnet20 --n 2000 --size 32 --channels 3
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch

from calibkit.methods.maccal import deployed_proba
from calibkit.models import MODELS


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mlp", choices=sorted(MODELS))
    ap.add_argument("--n", type=int, default=10000, help="inputs (default 10000: a Fashion-MNIST test set)")
    ap.add_argument("--size", type=int, default=28)
    ap.add_argument("--channels", type=int, default=1)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--samples", type=int, nargs="+", default=[8, 32, 64, 128])
    ap.add_argument("--keep-rate", type=float, default=0.2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=1000)
    args = ap.parse_args()

    torch.manual_seed(0)
    model = MODELS[args.model](num_classes=args.classes, in_channels=args.channels).eval()
    x = torch.randn(args.n, args.channels, args.size, args.size)
    with torch.no_grad():
        feats = torch.cat([model.forward_features(x[i:i + args.batch_size]) for i in range(0, args.n, args.batch_size)])
    w, b = model.head.weight.detach(), model.head.bias.detach()
    jobs = {"features": lambda: [model.forward_features(x[i:i + args.batch_size])
                                 for i in range(0, args.n, args.batch_size)],
            "head": lambda: deployed_proba(feats, w, b, args.keep_rate, 0)}
    for s in args.samples:
        jobs[f"mc {s}"] = lambda s=s: deployed_proba(feats, w, b, args.keep_rate, s, seed=0)
    times = {name: [] for name in jobs}
    with torch.no_grad():
        for _ in range(args.rounds):
            for name, fn in jobs.items():
                times[name].append(_time(fn))
    med = {name: statistics.median(t) for name, t in times.items()}

    print(f"python {platform.python_version()}, torch {torch.__version__}, {os.cpu_count()} cores, "
          f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()}")
    print(f"model {args.model}: features D = {feats.shape[1]}, K = {args.classes}, N = {args.n}, "
          f"median of {args.rounds} interleaved rounds")
    print(f"{'':<10} {'time (ms)':>10} {'/ head':>8} {'end-to-end':>11}")
    for name, t in med.items():
        e2e = (med["features"] + t) / (med["features"] + med["head"]) if name != "features" else float("nan")
        print(f"{name:<10} {1000 * t:10.2f} {t / med['head']:8.1f} {e2e:11.3f}")


if __name__ == "__main__":
    main()
