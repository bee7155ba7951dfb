"""Speed of calibkit's ECE and of the whole ``evaluate`` panel against torchmetrics' ECE.

Data: N x K logits (default 1,000,000 x 100, float32) shaped like an over-confident trained
classifier's: a standard-normal background plus a margin drawn uniformly in [4, 10] on one
"predicted" class per row (mean confidence 0.76); the label is that class 70% of the time, a
uniform class otherwise. Probabilities = softmax(logits), computed once.

Timed side by side in one run, in interleaved rounds (best of ``--repeats``):

* ``calibkit.functional.ece(probs, labels)``                   (validation included)
* ``calibkit.metrics.evaluate(probs, labels)``                 (the whole panel, 16 metrics)
* ``torchmetrics ... multiclass_calibration_error(probs, ...)`` (its default validation)
* from logits: ``ece(softmax(logits))`` and ``evaluate(softmax(logits))`` vs torchmetrics given
  the logits (it applies the softmax itself).

On the CPU every job is timed at 1 torch thread and at torch's default thread count (the number
in effect when the script starts, or ``--threads``), in one run, and the ratios are printed side
by side: at 2 threads or more calibkit's panel runs the top label and the sort-based part on the
calling thread while a helper computes the classwise sums, NLL and Brier
(``calibkit/functional/panel_cpu.py``); torchmetrics' binning uses torch's threads. Rounds interleave
the thread counts and the jobs, and the load average at the start of each round is printed.
Each job's best wall time is printed with its best process CPU time; at 1 thread the CPU-time
ratio is printed too, since on a shared machine it moves much less with the other jobs than the
wall time does.

With a CUDA device (or ``--device cuda``) the same jobs are timed on the GPU as well, each
call followed by ``torch.cuda.synchronize()`` (``evaluate`` returns python floats, so it ends
with its own device-to-host transfer; torchmetrics returns a device tensor). The ratios are
printed per device.

Usage: ``.venv/bin/python benchmarks/metrics_speed.py [--n 1000000] [--k 100] [--repeats 5] [--device cpu,cuda]
[--threads 1,2]``
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch


def _timed(fn, sync=None) -> tuple[float, float]:
    """Wall time and CPU time of the process (all threads) of one call."""
    if sync:
        sync()
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    if sync:
        sync()
    return time.perf_counter() - t0, time.process_time() - c0


def _run(device: str, logits, labels, k: int, repeats: int, counts: list[int]) -> dict:
    """Best time of every job at every thread count in ``counts``, rounds interleaved over both."""
    from torchmetrics.functional.classification import multiclass_calibration_error as tm_ece

    from calibkit.functional import ece
    from calibkit.metrics import evaluate

    logits, labels = logits.to(device), labels.to(device)
    probs = torch.softmax(logits, 1)
    sync = torch.cuda.synchronize if device.startswith("cuda") else None
    jobs = {
        "calibkit ece": lambda: ece(probs, labels),
        "calibkit evaluate (panel)": lambda: evaluate(probs, labels),
        "torchmetrics ece": lambda: tm_ece(probs, labels, k, n_bins=15),
        "calibkit softmax+ece (logits)": lambda: ece(torch.softmax(logits, 1), labels),
        "calibkit softmax+evaluate (logits)": lambda: evaluate(torch.softmax(logits, 1), labels),
        "torchmetrics ece (logits)": lambda: tm_ece(logits, labels, k, n_bins=15),
    }
    ours, theirs = float(ece(probs, labels)), float(tm_ece(probs, labels, k, n_bins=15))
    for fn in jobs.values():  # warm-up (CUDA kernels, caching allocator)
        fn()
    best = {threads: {name: float("inf") for name in jobs} for threads in counts}
    cpu = {threads: {name: float("inf") for name in jobs} for threads in counts}
    loads = []
    for _ in range(repeats):  # interleaved, so load changes hit every job and thread count alike
        loads.append(_load())
        for threads in counts:
            torch.set_num_threads(threads)
            for name, fn in jobs.items():
                wall, used = _timed(fn, sync)
                best[threads][name] = min(best[threads][name], wall)
                cpu[threads][name] = min(cpu[threads][name], used)
    mean_conf = float(probs.max(1).values.float().mean())
    return {"best": best, "cpu": cpu, "ours": ours, "theirs": theirs, "mean_conf": mean_conf, "loads": loads}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5, help="rounds; each timing is the best over rounds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", default=None,
                    help="comma-separated CPU thread counts (default: 1 and torch's default count)")
    ap.add_argument("--device", default=None, help="comma-separated devices (default: cpu, and cuda when available)")
    args = ap.parse_args(argv)

    g = torch.Generator().manual_seed(args.seed)
    n, k = args.n, args.k
    logits = torch.randn(n, k, generator=g)
    predicted = torch.randint(0, k, (n,), generator=g)
    # a margin drawn per row, so confidences spread over (0.1, 1) like a trained network's
    logits[torch.arange(n), predicted] += 4 + 6 * torch.rand(n, generator=g)
    flip = torch.rand(n, generator=g) > 0.7
    labels = torch.where(flip, torch.randint(0, k, (n,), generator=g), predicted)

    devices = args.device.split(",") if args.device else ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    if any(d.startswith("cuda") for d in devices) and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device is available here")
    default = torch.get_num_threads()
    counts = [int(t) for t in args.threads.split(",")] if args.threads else sorted({1, default})
    print(f"machine: {os.cpu_count()} CPUs ({platform.machine()}), torch {torch.__version__} "
          f"(default {default} threads), python {platform.python_version()}")
    ratios = {}
    for device in devices:
        if device.startswith("cuda"):
            print(f"device: {torch.cuda.get_device_name(device)}")
        here = counts if device == "cpu" else [default]
        r = _run(device, logits, labels, k, args.repeats, here)
        torch.set_num_threads(default)
        print(f"[{device}] data: N={n}, K={k}, float32; ECE calibkit {r['ours']:.6f} vs torchmetrics "
              f"{r['theirs']:.6f} (diff {abs(r['ours'] - r['theirs']):.1e}); mean confidence {r['mean_conf']:.3f}")
        print(f"[{device}] load average (1 min) at the start of each round: {', '.join(r['loads'])}")
        for threads in here:
            tag = f"{device}, {threads} thread{'s' if threads > 1 else ''}"
            ratios[tag] = _report(tag, r["best"][threads], r["cpu"][threads], args.repeats)
    print("ratios side by side (calibkit / torchmetrics ECE; target: evaluate panel <= 1.0):")
    print(f"  {'':24s} {'ece':>7s} {'panel':>7s} {'ece (logits)':>13s} {'panel (logits)':>15s}")
    for tag, (r1, r2, r3, r4) in ratios.items():
        print(f"  {tag:24s} {r1:7.3f} {r2:7.3f} {r3:13.3f} {r4:15.3f}")
    if not any(d.startswith("cuda") for d in devices):
        print("[cuda] unmeasured: no CUDA device in this run (the CUDA ratios need a GPU)")
    return 0


def _load() -> str:
    return f"{os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else "n/a"


def _report(tag: str, best: dict, cpu: dict, repeats: int) -> tuple[float, float, float, float]:
    print(f"[{tag}] best of {repeats} interleaved rounds (wall; process CPU time, all threads):")
    for name, t in best.items():
        print(f"  {name:38s} {1000 * t:9.2f} ms   cpu {1000 * cpu[name]:9.2f} ms")
    if tag.endswith(" 1 thread"):  # one thread: CPU time is the work, little affected by other jobs
        print(f"  cpu-time ratio, evaluate panel / torchmetrics ECE: "
              f"{cpu['calibkit evaluate (panel)'] / cpu['torchmetrics ece']:.3f}")
    return (best["calibkit ece"] / best["torchmetrics ece"],
            best["calibkit evaluate (panel)"] / best["torchmetrics ece"],
            best["calibkit softmax+ece (logits)"] / best["torchmetrics ece (logits)"],
            best["calibkit softmax+evaluate (logits)"] / best["torchmetrics ece (logits)"])


if __name__ == "__main__":
    raise SystemExit(main())
