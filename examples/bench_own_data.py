"""Benchmark the calibration methods on your own data and model, from Python.

Your data: one .npz (or .safetensors) file with x_train, y_train, x_test, y_test -- here the
8x8 handwritten digits shipped with calibkit as 64 precomputed features per example. Your model:
any factory(num_classes, in_channels) returning an nn.Module with `forward_features` and a linear
`head` (below: `make_model`). Your preset: a TOML text (the format of `calibkit preset show`),
with your own grid for LS. Then one call, `calibkit.pipeline.run_bench` with `tune=True`: select
on validation, run the grid at the selection, write the report -- what this command does:

    calibkit bench --preset OUT/mine.toml --out OUT --tune

Run:  python examples/bench_own_data.py              (2 seeds, 40 epochs: a few minutes on a CPU)
      python examples/bench_own_data.py --quick      (1 seed, 10 epochs: under a minute)
"""

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn


class FeatureNet(nn.Module):
    """The contract: `forward_features(x) -> (N, D)`, `head = nn.Linear(D, K)`, forward = head(features)."""

    def __init__(self, num_classes: int, in_channels: int, width: int = 128):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(in_channels, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
        self.head = nn.Linear(width, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(x))


def make_model(num_classes: int, in_channels: int) -> nn.Module:
    """The factory the preset names (`model = "examples/bench_own_data.py:make_model"`)."""
    return FeatureNet(num_classes, in_channels)


PRESET = """\
name = "digits-features"
dataset = "tensors"
data_dir = "{data}"
model = "{model}"
seeds = {seeds}
methods = ["ce", "ls", "mbls", "maccal"]
ood = "noise"
severities = []
n_boot = 200
note = "calibkit's 8x8 digits as 64 features, a 2-layer MLP; examples/bench_own_data.py"

[train]
epochs = {epochs}
batch_size = 64
lr = 0.05
val_size = 0.2
augment = false

[maccal]
epochs = {epochs}

[space.ls]
"loss.alpha" = [0.01, 0.05, 0.2]

[space.mbls]
"loss.margin" = [2, 6, 10]
"""


def write_data(path: Path) -> None:
    """Your arrays: here the shipped digits, 64 float features in [0, 1], a fixed 25% test split."""
    from calibkit.data.digits import read_digits_file

    x, y = read_digits_file()
    x = (x.reshape(len(x), -1) / 16.0).astype(np.float32)
    perm = np.random.default_rng(0).permutation(len(x))
    test, train = perm[: len(x) // 4], perm[len(x) // 4:]
    np.savez(path, x_train=x[train], y_train=y[train].astype(np.int64), x_test=x[test], y_test=y[test].astype(np.int64))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 seed, 10 epochs")
    ap.add_argument("--out", help="output directory (default: a temporary one)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out or tempfile.mkdtemp(prefix="calibkit-own-"))
    out.mkdir(parents=True, exist_ok=True)

    from calibkit.pipeline import BenchOptions, run_bench

    write_data(out / "digits.npz")
    text = PRESET.format(data=out / "digits.npz", model=f"{Path(__file__).resolve()}:make_model",
                         seeds=[0] if args.quick else [0, 1], epochs=10 if args.quick else 40)
    (out / "mine.toml").write_text(text)

    # Every name and value checked (as `calibkit preset check` does), then: the selection on
    # validation, the grid at the selected values, OUT/presets/<name>.toml and OUT/report/.
    quiet = BenchOptions(tune=True, figures=not args.quick, log=lambda *a, **k: None)
    result = run_bench(out / "mine.toml", out, quiet)
    for method, values in result.tuning.selection.items():
        print("selected:", method, ", ".join(f"{a}={v:g}" for a, v in values.items()))
    print(f"bench: {result.counts.done} run(s) done, {result.counts.failed} failed")
    print(result.report["text"])
    print(f"\nreport: {result.report['paths']['md']}\nrerun from the command line: calibkit bench --preset "
          f"{out}/presets/{result.preset.name}.toml --out {out}")


if __name__ == "__main__":
    main()
