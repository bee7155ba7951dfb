"""MaC-Cal on your own model: train a plain PyTorch network, then recalibrate its last layer.

Stage 1 is your ordinary training loop. Stage 2 needs only the network's last linear layer and
the penultimate features of the training and validation splits, computed once:

    feats = extract_features(model, loader, lambda m, x: m.body(x))    # (N, D) and (N,) labels
    est = MaCCal(model.fc).fit(*train_feats, *val_feats)             # validation steers and selects
    probs = est.predict_proba(test_feats[0])                         # the deployed predictor

Run:  python examples/maccal_own_model.py            (Fashion-MNIST, 10k training images)
      python examples/maccal_own_model.py --quick    (3k training images: seconds)
"""

import argparse
import gzip
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from calibkit.methods.maccal import MaCCal, extract_features
from calibkit.metrics import evaluate

FMNIST = Path("/usr/share/datasets/fashion-mnist")


class Net(nn.Module):
    """Any network whose last layer is linear: `body` gives the features, `fc` the logits."""

    def __init__(self, d_in: int, num_classes: int, width: int = 256):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(d_in, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
        self.fc = nn.Linear(width, num_classes)

    def forward(self, x):
        return self.fc(self.body(x))


def load_data(quick: bool):
    """(x, y) tensors of train / validation / test; pixels scaled to [0, 1].

    Fashion-MNIST (10k training images; 3k with ``quick``), or scikit-learn's digits where the
    Fashion-MNIST files are absent."""
    if not FMNIST.is_dir():
        from sklearn.datasets import load_digits

        x, y = load_digits(return_X_y=True)
        x, y = torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y)
        perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
        x, y = x[perm], y[perm]
        return (x[:500], y[:500]), (x[500:1000], y[500:1000]), (x[1000:], y[1000:])

    def read(name, offset):
        with gzip.open(FMNIST / name) as f:
            return torch.tensor(np.frombuffer(f.read(), np.uint8, offset=offset).copy())

    x, y = read("train-images-idx3-ubyte.gz", 16).view(-1, 784) / 255.0, read("train-labels-idx1-ubyte.gz", 8)
    xt, yt = read("t10k-images-idx3-ubyte.gz", 16).view(-1, 784) / 255.0, read("t10k-labels-idx1-ubyte.gz", 8)
    n, m, t = (3000, 2000, 2000) if quick else (10000, 5000, 10000)
    return (x[:n], y[:n].long()), (x[50000:50000 + m], y[50000:50000 + m].long()), (xt[:t], yt[:t].long())


def train(model, train_set, epochs: int):
    """An ordinary cross-entropy training loop (no calibkit in it)."""
    loader = DataLoader(TensorDataset(*train_set), batch_size=128, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for _ in range(epochs):
        model.train()
        for x, y in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y.long()).backward()
            opt.step()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="digits, few epochs: seconds")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    train_set, val_set, test_set = load_data(args.quick)
    model = Net(train_set[0].shape[1], 10)
    train(model, train_set, epochs=40)

    # Stage 2: features once (eval mode, no gradients), then MaC-Cal on the last layer.
    body = lambda m, x: m.body(x)  # noqa: E731  (everything before the last linear layer)
    feats = [extract_features(model, DataLoader(TensorDataset(*s), batch_size=512), body)
             for s in (train_set, val_set, test_set)]
    est = MaCCal(model.fc).fit(*feats[0], *feats[1])

    x_test, y_test = feats[2]
    with torch.no_grad():
        before = torch.softmax(model.fc(x_test), dim=1)
    after = est.predict_proba(x_test)
    print(f"MaC-Cal: best epoch {est.best_epoch_}, keep rate {est.keep_rate_:.3f}, {est.mc_samples} masked heads")
    print(f"{'test (%)':<10} {'acc':>6} {'ECE':>6} {'O-ECE':>6} {'U-ECE':>6} {'conf':>6}")
    for name, p in (("stage 1", before), ("MaC-Cal", after)):
        m = evaluate(p.double(), y_test)
        conf = 100 * float(p.max(1).values.mean())
        print(f"{name:<10} {100 * m['acc']:6.2f} {100 * m['ece']:6.2f} {100 * m['o_ece']:6.2f} "
              f"{100 * m['u_ece']:6.2f} {conf:6.2f}")


if __name__ == "__main__":
    main()
