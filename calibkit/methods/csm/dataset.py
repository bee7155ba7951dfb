"""Generated companions of a real batch for CSM training (CSM, ICML 2025, Sec. 3.3).

For each real image of class y, :meth:`CSMCompanion.draw` picks a random group whose pair contains
y and returns two of its images: the pure endpoint on y's side (lam = 1 if y = c1, lam = 0 if
y = c2) and one random interior member (0 < lam < 1), with their annotated soft labels. The trainer
augments and normalises them like the real images and adds ``soft_l2`` on them with weight 1::

    L = CE(real) + mean_gen sum_k (p_k - y_soft_k)^2
"""

from __future__ import annotations

import torch

from calibkit.methods.csm.store import load_annotations, load_store


class CSMCompanion:
    """Sampler of generated images and soft labels from an annotated store.

    Args:
        store_dir: store written by ``calibkit csm generate`` and annotated by ``calibkit csm annotate``.
        num_classes: K of the classifier being trained (must match the store).
        seed: seed of the default random generator (used when ``draw`` gets none).
        labels: ``"annotated"`` (the calibrated reannotation, the method) or ``"lam"`` (the raw
            mixing coefficient: y[c1] = lam, y[c2] = 1 - lam; an ablation without reannotation).

    Attributes:
        images: uint8 (G, 8, C, H, W); soft_labels: float32 (G, 8, K); c1, c2: int64 (G,).
        encoder: the annotation metadata (which encoder produced the labels), or None for ``"lam"``.
    """

    def __init__(self, store_dir, num_classes: int, seed: int = 0, labels: str = "annotated"):
        store = load_store(store_dir)
        man = store["manifest"]
        if man["num_classes"] != num_classes:
            raise ValueError(f"store {store_dir} has {man['num_classes']} classes, the model {num_classes}")
        g, n = man["num_groups"], man["group_size"]
        if labels == "annotated":
            annot, self.encoder = load_annotations(store_dir)
            if annot["soft_labels"].shape != (g * n, num_classes) or not torch.equal(annot["group"], store["group"]):
                raise ValueError(f"annotations of {store_dir} do not match its images; run `calibkit csm annotate` again")
            soft = annot["soft_labels"]
        elif labels == "lam":
            self.encoder = None
            soft = torch.zeros(g * n, num_classes)
            rows = torch.arange(g * n)
            soft[rows, store["c1"]] = store["lam"]
            soft[rows, store["c2"]] = 1 - store["lam"]
        else:
            raise ValueError(f"labels must be 'annotated' or 'lam', got {labels!r}")
        self.group_size = n
        self.images = store["images"].reshape(g, n, *store["images"].shape[1:])
        self.soft_labels = soft.float().reshape(g, n, num_classes)
        self.c1, self.c2 = store["c1"][::n].clone(), store["c2"][::n].clone()
        # Table of the groups containing each class, padded: groups_of[y, :count[y]].
        member = [torch.nonzero((self.c1 == y) | (self.c2 == y)).flatten() for y in range(num_classes)]
        self.count = torch.tensor([len(m) for m in member])
        if (self.count == 0).any():
            missing = torch.nonzero(self.count == 0).flatten().tolist()
            raise ValueError(f"store {store_dir} has no group for classes {missing}; generate at least "
                             f"{num_classes * (num_classes - 1) // 2} groups so every pair appears")
        self.groups_of = torch.zeros(num_classes, int(self.count.max()), dtype=torch.long)
        for y, m in enumerate(member):
            self.groups_of[y, : len(m)] = m
        self.num_classes = num_classes
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return int(self.images.shape[0] * self.group_size)

    def draw(self, labels: torch.Tensor, generator: torch.Generator | None = None):
        """Two generated images per real label.

        Args:
            labels: int64 (B,) real labels (CPU).
            generator: CPU random generator (default: the companion's own).

        Returns:
            ``(images, soft_labels)``: uint8 (2B, C, H, W) and float32 (2B, K); rows [0, B) are the
            pure endpoints on each label's side, rows [B, 2B) the interior members.
        """
        labels = torch.as_tensor(labels).long().cpu()
        if labels.dim() != 1 or (labels < 0).any() or (labels >= self.num_classes).any():
            raise ValueError(f"labels must be (B,) class indices in [0, {self.num_classes})")
        gen = generator if generator is not None else self.generator
        b, n = len(labels), self.group_size
        pick = (torch.rand(b, generator=gen) * self.count[labels]).long()
        groups = self.groups_of[labels, pick]
        # lam = 1 is the last member (pure c1), lam = 0 the first (pure c2).
        end = torch.where(self.c1[groups] == labels, n - 1, 0)
        inner = torch.randint(1, n - 1, (b,), generator=gen)
        g2, m2 = torch.cat([groups, groups]), torch.cat([end, inner])
        return self.images[g2, m2], self.soft_labels[g2, m2]
