"""Check that a change leaves CPU training results bit-identical: save, change, compare.

Trains five small runs on the CPU (digits, MLP, 2 epochs; CE with augmentation, Mixup, RegMixup
with MbLS, FeDLaS-LS with its gate, focal loss with gradient clipping) and saves or compares their
kept weights and val/test logits, tensor by tensor with ``torch.equal``.

    git stash; python tools/training_fingerprint.py save /tmp/ref.pt; git stash pop
    python tools/training_fingerprint.py compare /tmp/ref.pt      # exit 1 when any tensor differs

Run it from the repository root (so that this checkout's calibkit is imported) with
``OMP_NUM_THREADS=1``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

from calibkit import rundir
from calibkit.config import TrainConfig
from calibkit.train import train

CASES = {
    "ce_aug": dict(loss="ce", augment=True),
    "mixup": dict(loss="ce", method="mixup", augment=True),
    "regmixup_mbls": dict(loss="mbls", method="regmixup"),
    "fedlas": dict(loss="fedlas_ls"),
    "focal_clip": dict(loss="focal", grad_clip=1.0),
}


def fingerprint() -> dict[str, torch.Tensor]:
    out = {}
    for name, kw in CASES.items():
        cfg = TrainConfig(data="digits", model="mlp", epochs=2, batch_size=64, lr=0.05, train_subset=256,
                          val_size=100, num_threads=1, device="cpu", **kw)
        with tempfile.TemporaryDirectory() as d:
            train(cfg, Path(d) / "r", progress=False, verbose=False)
            for k, v in rundir.read_tensors(Path(d) / "r" / rundir.MODEL).items():
                out[f"{name}/weights/{k}"] = v.clone()
            for k, v in rundir.load_logits(Path(d) / "r").items():
                out[f"{name}/logits/{k}"] = v.clone()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("action", choices=("save", "compare"))
    ap.add_argument("path")
    args = ap.parse_args()
    torch.set_num_threads(1)
    now = fingerprint()
    if args.action == "save":
        torch.save(now, args.path)
        print(f"saved {len(now)} tensors to {args.path}")
        return 0
    ref = torch.load(args.path)
    differ = sorted(k for k in ref.keys() | now.keys() if k not in ref or k not in now
                    or not torch.equal(ref[k], now[k]))
    print(f"compared {len(ref)} tensors: "
          + (f"{len(differ)} differ: {', '.join(differ)}" if differ else "all bit-identical"))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
