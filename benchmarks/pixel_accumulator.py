"""Memory and time of the streaming pixel accumulator on 10^8 pixels, and its AECE approximation.

Streams ``--pixels`` pixels (default 10^8) of K = 21 classes (PASCAL VOC's count) through
``CalibrationAccumulator(n_bins=15, ignore_index=255)`` in batches of ``--batch`` images of
512 x 512, with 10% void pixels (label 255). The probabilities mimic a trained segmentation
network: ``softmax(6 * onehot(label) + 2 * noise)`` with 20% of the pixels' labels replaced, so
most confidences are near 1. Only the ``update`` calls are timed (not the data generation).

Prints the state size after the first and the last batch (it must not grow), the peak resident
memory of the process, the time per 10^6 pixels, and the AECE of the fixed state against the
exact AECE on the first ``--exact-pixels`` pixels (an exact-state accumulator keeps 3 numbers
per pixel, so it is run on that prefix only).

Usage: ``python benchmarks/pixel_accumulator.py [--pixels 100000000] [--batch 8]``
"""

from __future__ import annotations

import argparse
import resource
import time

import torch

from calibkit.metrics import CalibrationAccumulator

K, SIDE = 21, 512


def _batch(i: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    labels = torch.randint(0, K, (n, SIDE // 32, SIDE // 32), generator=g)
    labels = labels.repeat_interleave(32, 1).repeat_interleave(32, 2)  # 32 x 32 blocks of one class
    wrong = torch.rand(n, SIDE, SIDE, generator=g) < 0.2
    shown = torch.where(wrong, torch.randint(0, K, (n, SIDE, SIDE), generator=g), labels)
    logits = 6 * torch.nn.functional.one_hot(shown, K).movedim(-1, 1).float()
    logits += 2 * torch.randn(n, K, SIDE, SIDE, generator=g)
    labels = labels.clone()
    labels[torch.rand(n, SIDE, SIDE, generator=g) < 0.1] = 255
    return torch.softmax(logits, 1), labels


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pixels", type=int, default=100_000_000)
    ap.add_argument("--batch", type=int, default=8, help="images of 512 x 512 per batch")
    ap.add_argument("--exact-pixels", type=int, default=10_000_000)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    per_batch = args.batch * SIDE * SIDE
    n_batches = -(-args.pixels // per_batch)
    fixed = CalibrationAccumulator(n_bins=15, ignore_index=255)
    exact = CalibrationAccumulator(n_bins=15, ignore_index=255, state="exact")
    exact_fixed = CalibrationAccumulator(n_bins=15, ignore_index=255)
    t_update, sizes, seen = 0.0, [], 0
    for i in range(n_batches):
        probs, labels = _batch(i, args.batch)
        t0 = time.perf_counter()
        fixed.update(probs, labels)
        t_update += time.perf_counter() - t0
        sizes.append(fixed.state_bytes())
        if seen < args.exact_pixels:
            exact.update(probs, labels)
            exact_fixed.update(probs, labels)
        seen += per_batch
    out = fixed.compute()
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"pixels streamed: {seen:,} ({n_batches} batches of {per_batch:,}; {fixed.n:,} valid), K = {K}, 15 bins")
    print(f"state: {sizes[0]:,} bytes after the first batch, {sizes[-1]:,} after the last "
          f"(exact state on {exact.n:,} pixels: {exact.state_bytes():,} bytes)")
    print(f"peak resident memory of the process: {peak_mib:.0f} MiB (one batch of probabilities: "
          f"{per_batch * K * 4 / 2**20:.0f} MiB)")
    print(f"update time: {t_update:.1f} s in all, {1e6 * t_update / seen * 1e3:.1f} ms per 10^6 pixels "
          f"(1 thread, loaded machine)")
    e, f = exact.compute(), exact_fixed.compute()
    print(f"panel on all pixels: ECE {out['ece']:.5f}, AECE {out['aece']:.5f}, cECE {out['cece']:.5f}, "
          f"mIoU {out['miou']:.4f}")
    print(f"AECE on the first {exact.n:,} valid pixels: exact {e['aece']:.6f}, fixed state {f['aece']:.6f} "
          f"(difference {abs(e['aece'] - f['aece']):.1e}); ECE identical: {e['ece'] == f['ece']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
