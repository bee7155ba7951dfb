"""The presets of the pretrained backbones (``calibkit[pretrained]``), as plain values.

Pure data: :mod:`calibkit.bench.grid` turns each entry into a ``Preset`` (``name`` = the key) and
adds it to ``PRESETS``. Each full preset has a ``-smoke`` twin of the same settings on a tiny
subset for one epoch, which a test runs end to end (its numbers mean nothing). The image smoke
preset runs on the shipped ``digits`` (1,797 8x8 digits resized to 28x28, 360 of them the test
split): Fashion-MNIST's 10,000 test images alone take minutes through EfficientNet on a CPU. It
runs every image method but CSM, whose generated set calibkit ships for Fashion-MNIST only.

* ``text-pretrained``: the ``debian`` documents in MiniLM's WordPiece ids (``debian-minilm``, 64
  ids), all-MiniLM-L6-v2 with its last 2 transformer layers and the new head fine-tuned
  (``finetune = "last:2"``, the backbone at 0.1 x lr), every text method, 2 seeds. Adam at lr 1e-3
  (the layers at 1e-4), batch 32, constant rate, on 600 training documents for 6 epochs. The CPU
  sets the size: a forward pass over the 2,700 fixed validation and test documents alone costs
  more than an epoch of training, and a backward pass through all six layers would double the
  training cost. After 4 epochs cross-entropy was barely over-confident (test ECE 2.51 x100,
  accuracy 73.5%); after 6 (train accuracy 97%) it is (test ECE 3.89, temperature 1.14,
  accuracy 74.5%, seed 0).
* ``fmnist-pretrained``: 2,000 Fashion-MNIST training images (1,000 for validation, the full test
  set), ImageNet EfficientNet-Lite0 at 64 px fine-tuned end to end, every image method, 2 seeds; the
  Fashion-MNIST protocol's SGD at lr 0.1 (the backbone at 0.01; drops at 50% and 75%), batch 64,
  12 epochs, no augmentation. At lr 0.05 for 8 epochs the network still under-fitted (train
  accuracy 83%) and cross-entropy came out under-confident (test ECE 2.98, of it 2.61
  under-confidence); lr 0.1 for 12 epochs (train accuracy 92%) makes it over-confident (test ECE
  5.45 x100, temperature 1.36, accuracy 83.7%, seed 0). No corrupted test sets
  (``severities = ()``): each would cost as much as the test set again with this network on a CPU.
"""

from __future__ import annotations

from typing import Any

from calibkit.bench.builtin_presets import SMOKE_LOSSES

# text-pretrained-smoke trains 2 steps of the new head: its largest logit gap stays below 0.6 (CE,
# validation, seed 0 on the tests' synthetic index), so even margin 1 never fires there; 0.1 does.

TEXT_TRAIN = dict(
    augment=False, optimizer="adam", lr=1e-3, weight_decay=0.0, batch_size=32, schedule="multistep",
    milestones=[], grad_clip=2.0, finetune="last:2", backbone_lr_scale=0.1,
)
IMAGE_TRAIN = dict(
    augment=False, lr=0.1, momentum=0.9, weight_decay=5e-4, batch_size=64, schedule="multistep", grad_clip=2.0,
    keep="best-acc", finetune="all", backbone_lr_scale=0.1,
)

# name -> Preset fields; "methods": "text" stands for grid.TEXT_METHODS, "image-without-csm" for every
# grid method but CSM (calibkit ships CSM's generated set for Fashion-MNIST only, not for digits)
PRETRAINED_PRESETS: dict[str, dict[str, Any]] = {
    "text-pretrained-smoke": dict(
        dataset="debian-minilm", model="minilm", seeds=(0,), modality="text", methods="text",
        train={**TEXT_TRAIN, "epochs": 1, "train_subset": 64},
        losses={"mbls": "mbls:margin=0.1"}, maccal={"epochs": 1}, ood="debian-heldout", severities=(), n_boot=100,
        num_threads=1,
        note="the text methods on MiniLM, tiny, one epoch, MbLS at margin 0.1: checks the pretrained text pipeline "
        "(a test runs it)",
    ),
    "text-pretrained": dict(
        dataset="debian-minilm", model="minilm", seeds=(0, 1), modality="text", methods="text",
        train={**TEXT_TRAIN, "epochs": 6, "train_subset": 600},
        ood="debian-heldout", severities=(), num_threads=1,
        note="the text methods on Debian descriptions, all-MiniLM-L6-v2 fine-tuned (last 2 layers; 600 documents, "
             "6 epochs), 2 seeds",
    ),
    "fmnist-pretrained-smoke": dict(
        dataset="digits", model="efficientnet_lite0", seeds=(0,), methods="image-without-csm",
        train={**IMAGE_TRAIN, "epochs": 1, "train_subset": 64, "val_size": 64, "finetune": "last:3"},
        losses=SMOKE_LOSSES, maccal={"epochs": 1}, ood="none", severities=(), robust_n=0, n_boot=100, num_threads=1,
        note="every image method on EfficientNet-Lite0, tiny, one epoch, on the shipped digits (360 test images), "
             "MbLS and ACLS at margin 1: checks the pretrained image pipeline (a test runs it)",
    ),
    "fmnist-pretrained": dict(
        dataset="fmnist", model="efficientnet_lite0", seeds=(0, 1),
        train={**IMAGE_TRAIN, "epochs": 6, "train_subset": 1000, "val_size": 500, "finetune": "last:3"},
        severities=(), robust_n=0, num_threads=1,
        note="every image method on Fashion-MNIST (1,000 images), ImageNet EfficientNet-Lite0 with its last 3 blocks "
             "fine-tuned, 6 epochs, 2 seeds (CPU-sized)",
    ),
    "fmnist-pretrained-full": dict(
        dataset="fmnist", model="efficientnet_lite0", seeds=(0, 1),
        train={**IMAGE_TRAIN, "epochs": 12, "train_subset": 2000, "val_size": 1000},
        severities=(), robust_n=0, num_threads=1,
        note="every image method on Fashion-MNIST (2,000 images), ImageNet EfficientNet-Lite0 fine-tuned end to end, "
             "12 epochs, 2 seeds (GPU-sized: ~25 min a run on a 2-core CPU)",
    ),
}
