"""Memory of the streaming pixel accumulator as the number of pixels grows (to 10^8).

Feeds ``CalibrationAccumulator(n_bins=15, ignore_index=255)`` dense probability batches shaped like
PASCAL VOC evaluation batches ((B, 21, 500, 500), ~5% void pixels) and prints, after 10^6, 10^7
and 10^8 pixels, the accumulator's state size (``state_bytes()``) and the process's peak resident
memory. A batch is generated, accumulated and freed before the next, so the peak is one batch plus
the state; the state must not grow with the pixel count.

    /work/coord/heavy python benchmarks/pixel_memory.py          # 10^8 pixels
    python benchmarks/pixel_memory.py --pixels 1e7               # quicker
"""

from __future__ import annotations

import argparse
import resource
import time

import torch


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kilobytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pixels", type=float, default=1e8, help="total pixels to accumulate (default 1e8)")
    parser.add_argument("--classes", type=int, default=21)
    parser.add_argument("--side", type=int, default=500, help="image side (default 500, VOC-sized)")
    parser.add_argument("--batch", type=int, default=4, help="images per batch")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from calibkit.metrics import CalibrationAccumulator

    gen = torch.Generator().manual_seed(0)
    acc = CalibrationAccumulator(n_bins=15, ignore_index=255)
    per_batch = args.batch * args.side * args.side
    marks = [m for m in (1e6, 1e7, 1e8, 1e9) if m <= args.pixels]
    seen, t0 = 0, time.time()
    print(f"{'pixels':>12} {'state bytes':>12} {'peak RSS MB':>12} {'seconds':>8}")
    while seen < args.pixels:
        logits = torch.randn(args.batch, args.classes, args.side, args.side, generator=gen) * 3
        labels = torch.randint(0, args.classes, (args.batch, args.side, args.side), generator=gen)
        labels[torch.rand(labels.shape, generator=gen) < 0.05] = 255
        acc.update(logits.softmax(1), labels)
        del logits, labels
        seen += per_batch
        while marks and seen >= marks[0]:
            print(f"{marks.pop(0):>12.0e} {acc.state_bytes():>12d} {peak_rss_mb():>12.0f} {time.time() - t0:>8.0f}",
                  flush=True)
    res = acc.compute()
    print(f"{seen} pixels accumulated ({acc.n} labelled); ECE {100 * res['ece']:.3f}, mIoU {100 * res['miou']:.2f}")


if __name__ == "__main__":
    main()
