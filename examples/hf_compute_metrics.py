"""calibkit's metric panel inside a Hugging Face ``Trainer``: ``compute_metrics=compute_metrics``.

The Trainer passes an ``EvalPrediction`` (logits and label ids, numpy) to ``compute_metrics``
after each evaluation; :func:`calibkit.integrations.huggingface.compute_metrics` applies the
softmax (sigmoid for a one-logit head) and returns the panel, which the Trainer logs as
``eval_ece``, ``eval_aece``, ... Token-classification logits ``(N, T, K)`` are scored per token,
skipping label -100.

Here a small classifier (any ``nn.Module`` whose ``forward`` returns ``{"loss", "logits"}``
works with the Trainer) is trained and evaluated on synthetic data. Needs ``transformers`` and
``accelerate``; without ``accelerate`` the Trainer cannot be built, and the script calls
``compute_metrics`` on an ``EvalPrediction`` from a plain evaluation loop instead.
Run ``python examples/hf_compute_metrics.py`` (``--quick``: seconds).
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile

import torch
from torch import nn

from calibkit.integrations.huggingface import compute_metrics

K, D = 5, 16


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(D, 64), nn.ReLU(), nn.Linear(64, K))

    def forward(self, x, labels=None):
        logits = self.net(x)
        loss = None if labels is None else nn.functional.cross_entropy(logits, labels)
        return {"loss": loss, "logits": logits}


class Blobs(torch.utils.data.Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        centres = torch.randn(K, D, generator=torch.Generator().manual_seed(9))
        self.y = torch.randint(0, K, (n,), generator=g)
        self.x = centres[self.y] + 1.5 * torch.randn(n, D, generator=g)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one short epoch")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    train, test = Blobs(800 if args.quick else 5000, 0), Blobs(1000, 1)
    model = Classifier()
    if importlib.util.find_spec("transformers") and importlib.util.find_spec("accelerate"):
        from transformers import Trainer, TrainingArguments

        with tempfile.TemporaryDirectory() as out:
            targs = TrainingArguments(output_dir=out, num_train_epochs=1 if args.quick else 5, learning_rate=1e-2,
                                      per_device_train_batch_size=32, per_device_eval_batch_size=256,
                                      report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no",
                                      disable_tqdm=True, seed=0)
            trainer = Trainer(model=model, args=targs, train_dataset=train, eval_dataset=test,
                              compute_metrics=compute_metrics)
            trainer.train()
            metrics = trainer.evaluate()
    else:  # the same function on an EvalPrediction-shaped pair from a plain loop
        with torch.no_grad():
            logits = model(test.x)["logits"]
        metrics = {f"eval_{k}": v for k, v in compute_metrics((logits.numpy(), test.y.numpy())).items()}
    for key in ("eval_acc", "eval_ece", "eval_aece", "eval_nll", "eval_brier"):
        print(f"{key:12s} {metrics[key]:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
