"""Swap cross-entropy for calibkit's losses in your own training loop: MbLS, FeDLaS, AdaFocal.

A plain PyTorch program: your model (here a small MLP whose ``forward`` returns the logits
*and* the penultimate features), your ``DataLoader``, your loop. What changes per loss:

* MbLS: nothing but the constructor, ``loss_fn(logits, targets)``;
* FeDLaS: it needs the penultimate features (``loss_fn.needs_features`` is True), so the model
  returns them and the loop passes ``features=``; it owns a small gate network whose parameters
  must go to the optimizer with the model's, and running feature statistics (buffers) that it
  updates in training mode;
* AdaFocal: after every epoch, ``loss_fn.update(val_logits, val_labels)`` re-bins the validation
  confidences and adapts its per-bin gammas.

Data: 10 overlapping Gaussian clusters in 20 dimensions with 15% of the labels flipped (a
network that fits the training noise becomes over-confident). Run ``python examples/losses_own_loop.py``
(``--quick``: a few seconds).
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from calibkit.losses import AdaFocal, FeDLaS, MbLS
from calibkit.metrics import evaluate

K, D = 10, 20


class Net(nn.Module):
    """Your model: ``forward`` returns ``(logits, features)``; ``features`` feed FeDLaS."""

    def __init__(self, width: int = 128):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(D, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
        self.head = nn.Linear(width, K)

    def forward(self, x):
        features = self.body(x)  # (N, width) penultimate features
        return self.head(features), features


def make_data(n: int, seed: int, noise: float):
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(K, D, generator=torch.Generator().manual_seed(123)) * 0.6
    y = torch.randint(0, K, (n,), generator=g)
    x = centres[y] + torch.randn(n, D, generator=g)
    flip = torch.rand(n, generator=g) < noise
    y = torch.where(flip, torch.randint(0, K, (n,), generator=g), y)
    return x, y


@torch.no_grad()
def predict(model, x):
    model.eval()
    return model(x)[0]


def train(loss_fn, train_loader, val, epochs: int, seed: int = 0):
    torch.manual_seed(seed)
    model = Net()
    # The loss's own parameters (FeDLaS's gate) are trained with the model's; others have none.
    params = list(model.parameters()) + list(loss_fn.parameters())
    opt = torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=5e-4)
    needs_features = getattr(loss_fn, "needs_features", False)
    for _ in range(epochs):
        model.train()
        loss_fn.train()  # FeDLaS updates its running feature statistics in training mode only
        for x, y in train_loader:
            logits, features = model(x)
            loss = loss_fn(logits, y, features=features) if needs_features else loss_fn(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if hasattr(loss_fn, "update"):  # AdaFocal: per-epoch update from validation logits
            loss_fn.update(predict(model, val[0]), val[1])
    return model


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small data, few epochs (a few seconds)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    n_train, epochs = (2000, 3) if args.quick else (3000, 40)
    train_set = TensorDataset(*make_data(n_train, seed=0, noise=0.15))
    val = make_data(1000, seed=1, noise=0.15)  # same distribution as training, noisy labels included
    test = make_data(4000, seed=2, noise=0.15)
    loader = DataLoader(train_set, batch_size=128, shuffle=True, generator=torch.Generator().manual_seed(0))

    losses = {
        "cross-entropy": nn.CrossEntropyLoss(),
        "MbLS": MbLS(margin=10.0, lam=0.1),
        "FeDLaS": FeDLaS(num_classes=K, variant="ls"),
        "AdaFocal": AdaFocal(num_classes=K),
    }
    print(f"{'loss':14s} {'acc':>6s} {'ECE':>6s} {'NLL':>6s}")
    for name, loss_fn in losses.items():
        model = train(loss_fn, loader, val, epochs)
        out = evaluate(torch.softmax(predict(model, test[0]).double(), 1), test[1])
        print(f"{name:14s} {100 * out['acc']:6.2f} {100 * out['ece']:6.2f} {out['nll']:6.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
