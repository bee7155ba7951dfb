"""Time to fit every registered calibrator on N x K validation logits (default 5,000 x 100).

Data: logits ``3 z`` with ``z`` standard normal x 2 and labels drawn from ``softmax(z)`` (an
over-confident model, T* = 3), float32, seeded. Each calibrator is fitted ``--repeats`` times in
interleaved rounds (best time kept); Dirichlet calibration includes its cross-validation. The
CPU time of the process (user + system) is printed beside the wall time: on a machine shared with
other processes the wall time includes waiting for a core, the CPU time does not. Target (issue
29): all calibrators together within 10 s on a 2-core CPU.

Usage: ``.venv/bin/python benchmarks/calibrators_speed.py [--n 5000] [--k 100] [--repeats 1] [--threads 1]``
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import time

import torch


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from calibkit.calibrators import CALIBRATORS

    g = torch.Generator().manual_seed(0)
    z = torch.randn(args.n, args.k, generator=g) * 2
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g).squeeze(1)
    logits = 3 * z
    CALIBRATORS["temperature"]().fit(logits[:100], y[:100])  # first-call costs (imports, allocator) out of the timings

    wall = {name: float("inf") for name in CALIBRATORS}
    cpu = dict(wall)
    for _ in range(args.repeats):
        for name, cls in CALIBRATORS.items():
            c0, t0 = _cpu(), time.perf_counter()
            cls().fit(logits, y)
            wall[name] = min(wall[name], time.perf_counter() - t0)
            cpu[name] = min(cpu[name], _cpu() - c0)

    print(f"fit on N = {args.n}, K = {args.k} float32 logits; torch {torch.__version__}, {args.threads} thread(s), "
          f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), load average "
          f"{', '.join(f'{v:.1f}' for v in os.getloadavg())}; best of {args.repeats}")
    print(f"{'calibrator':<18}{'wall s':>9}{'cpu s':>9}{'share of cpu':>14}")
    total_cpu, total_wall = sum(cpu.values()), sum(wall.values())
    for name in CALIBRATORS:
        print(f"{name:<18}{wall[name]:>9.3f}{cpu[name]:>9.3f}{cpu[name] / total_cpu:>13.1%}")
    print(f"{'all':<18}{total_wall:>9.3f}{total_cpu:>9.3f}   target: 10 s in all")


if __name__ == "__main__":
    main()
