"""Evaluation passes (logits in eval mode, no gradients) at several batch sizes, side by side.

    OMP_NUM_THREADS=1 python benchmarks/eval_batch.py [--models cnn mlp resnet20] [--n 2048]

For each model, the same ``--n`` random inputs go through the network in batches of 64 to 1024;
printed per batch size: the wall time (median of ``--repeats``), its ratio to batches of 1024 (the
accelerator default), and the largest difference from the logits of batches of 1024 (0 when the
batch size does not change the arithmetic). This is the measurement behind the CPU default of
:func:`calibkit.distributed.eval_batch_size`.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch

from calibkit.distributed import EVAL_BATCH, EVAL_BATCH_ACCELERATOR
from calibkit.models import MODELS

SMALL = {"cnn", "mlp"}
SIZES = (64, 128, 256, 512, 1024)


@torch.no_grad()
def logits(model, x: torch.Tensor, batch: int) -> torch.Tensor:
    return torch.cat([model(x[i:i + batch]) for i in range(0, len(x), batch)])


def median_time(fn, repeats: int) -> float:
    fn()  # warm-up: kernel selection and allocator
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["cnn", "mlp", "resnet20"], choices=sorted(MODELS))
    parser.add_argument("--n", type=int, default=2048, help="inputs per pass")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}; defaults: cpu "
          f"{EVAL_BATCH['cpu']}, accelerators {EVAL_BATCH_ACCELERATOR}")
    for name in args.models:
        torch.manual_seed(0)
        c, s = (1, 28) if name in SMALL else (3, 32)
        model = MODELS[name](num_classes=10, in_channels=c).eval()
        x = torch.randn(args.n, c, s, s)
        ref = logits(model, x, 1024)
        base = median_time(lambda model=model, x=x: logits(model, x, 1024), args.repeats)
        for batch in SIZES:
            t = base if batch == 1024 else median_time(
                lambda model=model, x=x, batch=batch: logits(model, x, batch), args.repeats)
            diff = (logits(model, x, batch) - ref).abs().max().item()
            print(f"{name:10s} batch {batch:5d}: {t:7.3f} s  {t / base:5.2f}x of batch 1024  max |diff| {diff:.1e}")


if __name__ == "__main__":
    main()
