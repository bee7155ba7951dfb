"""Calibration metrics in your own evaluation loop: streaming, bootstrap intervals, temperature scaling.

A plain PyTorch program: a small classifier trained for a few epochs (over-confident on purpose),
then an ordinary evaluation loop over a ``DataLoader`` that

1. feeds each batch's probabilities to :class:`calibkit.metrics.CalibrationAccumulator`
   (per-bin sums only, so it works for any number of batches, and under DDP with ``sync()``);
2. keeps the logits, from which a bootstrap interval of the test ECE and a paired interval of
   "after temperature scaling minus before" are computed;
3. fits :class:`calibkit.calibrators.TemperatureScaling` on the **validation** logits (never on
   test) and evaluates the scaled test predictions;

and, as the last step, the same accumulator on pixels (a segmentation-shaped output with void
pixels, ``ignore_index=255``). Run ``python examples/metrics_streaming.py`` (``--quick``: seconds).
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from calibkit.calibrators import TemperatureScaling
from calibkit.metrics import CalibrationAccumulator, bootstrap_ci, paired_bootstrap_diff

K, D = 10, 20


def make_data(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(K, D, generator=torch.Generator().manual_seed(7)) * 0.6
    y = torch.randint(0, K, (n,), generator=g)
    x = centres[y] + torch.randn(n, D, generator=g)
    flip = torch.rand(n, generator=g) < 0.15
    return x, torch.where(flip, torch.randint(0, K, (n,), generator=g), y)


def train_model(x, y, epochs: int) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, K))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(0))
    for _ in range(epochs):
        for xb, yb in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
    return model.eval()


@torch.no_grad()
def evaluate_loop(model, loader):
    """Your evaluation loop: stream the metrics, keep the logits for the intervals and TS."""
    acc = CalibrationAccumulator(n_bins=15)
    logits, labels = [], []
    for xb, yb in loader:
        z = model(xb)
        acc.update(torch.softmax(z, 1), yb)  # probabilities, never logits
        logits.append(z)
        labels.append(yb)
    # under DDP: acc.sync() here, then every rank holds the global panel
    return acc.compute(), torch.cat(logits), torch.cat(labels)


def show(title, panel):
    print(f"{title:28s} acc {100 * panel['acc']:5.2f}  ECE {100 * panel['ece']:5.2f}  AECE {100 * panel['aece']:5.2f}"
          f"  classwise {100 * panel['cece']:5.2f}  NLL {panel['nll']:.3f}")


def pixels_demo():
    """The accumulator on segmentation-shaped outputs: (n, K, H, W) probabilities, (n, H, W)
    labels with void pixels 255. Its memory stays fixed however many pixels stream through."""
    g = torch.Generator().manual_seed(3)
    acc = CalibrationAccumulator(n_bins=15, num_classes=4, ignore_index=255)
    for _ in range(4):  # four batches of two 32 x 32 "images"
        labels = torch.randint(0, 4, (2, 32, 32), generator=g)
        logits = 3 * torch.nn.functional.one_hot(labels, 4).movedim(-1, 1) + 2 * torch.randn(2, 4, 32, 32, generator=g)
        labels[:, :4] = 255  # a void band
        acc.update(torch.softmax(logits, 1), labels)
    out = acc.compute()
    print(f"pixels: N = {acc.n} valid pixels, ECE {100 * out['ece']:.2f}, mIoU {100 * out['miou']:.1f}, "
          f"state {acc.state_bytes() / 1024:.0f} KiB")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer samples, epochs and resamples")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    n_train, epochs, n_boot = (2000, 8, 200) if args.quick else (3000, 30, 1000)
    model = train_model(*make_data(n_train, seed=0), epochs)
    val_x, val_y = make_data(2000, seed=1)
    test_loader = DataLoader(TensorDataset(*make_data(4000, seed=2)), batch_size=256)

    before, test_logits, test_y = evaluate_loop(model, test_loader)
    show("test, before scaling", before)
    probs = torch.softmax(test_logits.double(), 1)
    ci = bootstrap_ci("ece", probs, test_y, n_resamples=n_boot, seed=0)  # basic bootstrap (default)
    print(f"  ECE {ci.estimate:.4f}, bias-corrected {ci.corrected:.4f}, "
          f"95% interval [{ci.low:.4f}, {ci.high:.4f}]")

    with torch.no_grad():
        val_logits = model(val_x)
    ts = TemperatureScaling().fit(val_logits, val_y)  # validation split only
    after_loader = DataLoader(TensorDataset(test_logits, test_y), batch_size=256)
    acc = CalibrationAccumulator(n_bins=15)
    for zb, yb in after_loader:
        acc.update(ts.predict_proba(zb), yb)
    show(f"test, after TS (T = {ts.temperature_:.2f})", acc.compute())
    diff = paired_bootstrap_diff(ts.predict_proba(test_logits).double(), probs, test_y, "ece",
                                 n_resamples=n_boot, seed=0)
    print(f"  ECE after - before: {diff.estimate:+.4f}, 95% interval [{diff.low:+.4f}, {diff.high:+.4f}]"
          f"{' (significant)' if diff.high < 0 or diff.low > 0 else ''}")
    pixels_demo()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
