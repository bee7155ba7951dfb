"""Where the time goes on a GPU: the ``evaluate`` panel and one training epoch, under torch.profiler.

Prints, for a CUDA device (``--device``, default ``cuda``):

* the cost of one host synchronisation (``torch.cuda.synchronize()``, a scalar ``.item()``);
* ``calibkit.metrics.evaluate`` on N x K probabilities (the data of ``metrics_speed.py``): wall
  time, the number of host synchronisations it makes (``torch.cuda.set_sync_debug_mode``), and the
  profiler's operators sorted by device time and by host time;
* one epoch of the default preset's CE run through the training loop (``calibkit.train.loop``)
  and through the bare steps of ``bench_overhead.py``: wall time per step of each and the
  profiler's operators sorted by host time, with the number of kernel launches per step.

    python benchmarks/gpu_profile.py [--n 1000000] [--k 100] [--rows 25]

On the CPU (``--device cpu``) it runs the same jobs, which checks the script itself.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _table(prof, sort: str, rows: int) -> str:
    try:
        return prof.key_averages().table(sort_by=sort, row_limit=rows, max_name_column_width=60)
    except (AttributeError, KeyError, ValueError):
        return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=60)


def _activities(device):
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])


def _launches(prof) -> int:
    return sum(e.count for e in prof.key_averages() if e.key in ("cudaLaunchKernel", "cuLaunchKernel",
                                                                 "cudaLaunchKernelExC", "cuLaunchKernelEx"))


def sync_cost(device) -> None:
    if device.type != "cuda":
        return
    t = torch.ones((), device=device)
    for name, fn in (("synchronize", lambda: torch.cuda.synchronize(device)), ("scalar .item()", t.item)):
        fn()
        t0 = time.perf_counter()
        for _ in range(1000):
            fn()
        print(f"host sync: {name}: {1e6 * (time.perf_counter() - t0) / 1000:.1f} us")


def panel(device, n: int, k: int, rows: int) -> None:
    from calibkit.metrics import evaluate

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(n, k, generator=g)
    pred = torch.randint(0, k, (n,), generator=g)
    logits[torch.arange(n), pred] += 4 + 6 * torch.rand(n, generator=g)
    labels = torch.where(torch.rand(n, generator=g) > 0.7, torch.randint(0, k, (n,), generator=g), pred)
    probs, labels = torch.softmax(logits, 1).to(device), labels.to(device)
    for _ in range(2):
        evaluate(probs, labels)
    _sync(device)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        evaluate(probs, labels)
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    print(f"\nevaluate N={n} K={k} on {device}: best of 5 {1000 * best:.2f} ms")
    if device.type == "cuda":
        torch.cuda.set_sync_debug_mode("warn")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            evaluate(probs, labels)
        torch.cuda.set_sync_debug_mode(0)
        print(f"host synchronisations in one evaluate: {len(caught)}")
        for w in caught[:12]:
            print("   ", str(w.message).splitlines()[0][:120])
    with profile(activities=_activities(device)) as prof:
        evaluate(probs, labels)
        _sync(device)
    print(f"kernel launches: {_launches(prof)}")
    if device.type == "cuda":
        print(_table(prof, "self_cuda_time_total", rows))
    print(_table(prof, "self_cpu_time_total", rows))


def epoch(device, rows: int) -> None:
    import bench_overhead as bo

    from calibkit import distributed as D
    from calibkit.bench.grid import get_preset
    from calibkit.bench.runner import train_config
    from calibkit.train import loop

    cfg = train_config(get_preset("default"), "ce", 0, device=str(device), num_threads=1)
    dd = D.setup(cfg.device)
    with tempfile.TemporaryDirectory() as tmp:
        run = loop.build_run(cfg, dd, None, Path(tmp), lambda *a, **k: None)
    steps = len(run.train_y) // cfg.batch_size
    loop._train_epoch(run, 0, False)  # warm-up

    def loop_epochs(e):
        for i in range(e):
            loop._train_epoch(run, 1 + i, False)

    def bare_epochs(e):
        bo.bare_epochs(run, e, first=1)

    bare_epochs(1)
    for name, fn in (("training loop", loop_epochs), ("bare steps", bare_epochs)):
        _sync(device)
        t0 = time.perf_counter()
        fn(3)
        _sync(device)
        print(f"\n{name}: {1e3 * (time.perf_counter() - t0) / (3 * steps):.3f} ms per step (3 epochs of {steps})")
    for name, fn in (("training loop", loop_epochs), ("bare steps", bare_epochs)):
        with profile(activities=_activities(device)) as prof:
            fn(1)
            _sync(device)
        print(f"\n{name}, one epoch: {_launches(prof) / steps:.1f} kernel launches per step")
        print(_table(prof, "self_cpu_time_total", rows))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--rows", type=int, default=25)
    ap.add_argument("--skip", nargs="*", default=[], choices=["panel", "epoch"])
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device is available here")
    torch.set_num_threads(1)
    sync_cost(device)
    if "panel" not in args.skip:
        panel(device, args.n, args.k, args.rows)
    if "epoch" not in args.skip:
        epoch(device, args.rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
