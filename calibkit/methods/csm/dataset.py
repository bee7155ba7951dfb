"""Generated companions of a real batch for CSM training (CSM, ICML 2025, Sec. 3.3).

For each real image of class y, :meth:`CSMCompanion.draw` picks a random group whose pair contains
y and returns two of its images: the pure endpoint on y's side (lam = 1 if y = c1, lam = 0 if
y = c2) and one random interior member (0 < lam < 1), with their annotated soft labels. The trainer
augments and normalises them like the real images and adds ``soft_l2`` on them with weight 1::

    L = CE(real) + mean_gen sum_k (p_k - y_soft_k)^2
"""

from __future__ import annotations

import torch

from calibkit.errors import UserError
from calibkit.methods.csm.store import load_annotations, load_store


class CSMCompanion:
    """Sampler of generated images and soft labels, from an annotated store or from tensors.

    Args:
        source: a store directory (written by ``calibkit csm generate`` and annotated by
            ``calibkit csm annotate``), or a dict of tensors in group order (8 consecutive images
            per group, lam = 0, 1/7, ..., 1), e.g. the output of
            :func:`~calibkit.methods.csm.generate.generate` with ``soft_labels`` from
            :func:`~calibkit.methods.csm.annotate.annotate` added: ``images`` uint8 (G*8, C, H, W),
            ``c1``, ``c2`` int64 (G*8,), ``lam`` (G*8,) and, for ``labels="annotated"``,
            ``soft_labels`` (G*8, K).
        num_classes: K of the classifier being trained (must match the store).
        seed: seed of the default random generator (used when ``draw`` gets none).
        labels: ``"annotated"`` (the calibrated reannotation, the method) or ``"lam"`` (the raw
            mixing coefficient: y[c1] = lam, y[c2] = 1 - lam; an ablation without reannotation).

    Attributes:
        images: uint8 (G, 8, C, H, W); soft_labels: float32 (G, 8, K); c1, c2: int64 (G,).
        encoder: the annotation metadata (which encoder produced the labels), or None for ``"lam"``
            and for tensors.
    """

    def __init__(self, source, num_classes: int, seed: int = 0, labels: str = "annotated"):
        if labels not in ("annotated", "lam"):
            raise UserError(f"labels must be 'annotated' or 'lam', got {labels!r}")
        n = 8
        self.encoder = None
        if isinstance(source, dict):
            missing = [k for k in ("images", "c1", "c2", "lam") + (("soft_labels",) if labels == "annotated" else ())
                       if k not in source]
            if missing:
                raise UserError(f"the tensors lack {missing} (soft_labels come from csm.annotate)")
            images = source["images"]
            c1, c2 = torch.as_tensor(source["c1"]).long(), torch.as_tensor(source["c2"]).long()
            lam = torch.as_tensor(source["lam"]).float()
            if images.dtype != torch.uint8 or images.dim() != 4 or len(images) % n:
                raise UserError(f"images must be uint8 (G*{n}, C, H, W), got {images.dtype} {tuple(images.shape)}")
            g = len(images) // n
            if c1.shape != (g * n,) or c2.shape != (g * n,) or lam.shape != (g * n,):
                raise UserError(f"c1, c2 and lam must have shape ({g * n},)")
            if not (torch.equal(c1.view(g, n), c1.view(g, n)[:, :1].expand(g, n))
                    and torch.equal(c2.view(g, n), c2.view(g, n)[:, :1].expand(g, n))):
                raise UserError(f"images must be in group order: {n} consecutive images share one class pair")
            where = "the tensors"
            annotated = source.get("soft_labels") if labels == "annotated" else None
        else:
            store = load_store(source)
            man = store["manifest"]
            if man["num_classes"] != num_classes:
                raise UserError(f"store {source} has {man['num_classes']} classes, the model {num_classes}")
            g, n = man["num_groups"], man["group_size"]
            images, c1, c2, lam = store["images"], store["c1"], store["c2"], store["lam"]
            where = f"store {source}"
            annotated = None
            if labels == "annotated":
                annot, self.encoder = load_annotations(source)
                if (annot["soft_labels"].shape != (g * n, num_classes)
                        or not torch.equal(annot["group"], store["group"])):
                    raise UserError(f"annotations of {source} do not match its images; "
                                    "run `calibkit csm annotate` again")
                annotated = annot["soft_labels"]
        if labels == "annotated":
            soft = torch.as_tensor(annotated).float()
            if soft.shape != (g * n, num_classes):
                raise UserError(f"soft_labels must have shape ({g * n}, {num_classes}), got {tuple(soft.shape)}")
        else:
            soft = torch.zeros(g * n, num_classes)
            rows = torch.arange(g * n)
            soft[rows, c1] = lam
            soft[rows, c2] = 1 - lam
        self.group_size = n
        self.images = images.reshape(g, n, *images.shape[1:])
        self.soft_labels = soft.reshape(g, n, num_classes)
        self.c1, self.c2 = c1[::n].clone(), c2[::n].clone()
        # Table of the groups containing each class, padded: groups_of[y, :count[y]].
        member = [torch.nonzero((self.c1 == y) | (self.c2 == y)).flatten() for y in range(num_classes)]
        self.count = torch.tensor([len(m) for m in member])
        if (self.count == 0).any():
            missing = torch.nonzero(self.count == 0).flatten().tolist()
            raise UserError(f"{where} has no group for classes {missing}; generate at least "
                             f"{num_classes * (num_classes - 1) // 2} groups so every pair appears")
        self.groups_of = torch.zeros(num_classes, int(self.count.max()), dtype=torch.long)
        for y, m in enumerate(member):
            self.groups_of[y, : len(m)] = m
        self.num_classes = num_classes
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return int(self.images.shape[0] * self.group_size)

    def draw(self, labels: torch.Tensor, generator: torch.Generator | None = None, per_real: int = 2):
        """``per_real`` generated images per real label (2 in the paper).

        Args:
            labels: int64 (B,) real labels (CPU).
            generator: CPU random generator (default: the companion's own).
            per_real: an even number; ``per_real / 2`` independent draws, each giving, per label,
                a random group containing the label, its pure endpoint on the label's side and one
                random interior member.

        Returns:
            ``(images, soft_labels)``: uint8 (per_real B, C, H, W) and float32 (per_real B, K); per
            draw, B rows of pure endpoints (in label order) then B rows of interior members.
        """
        labels = torch.as_tensor(labels).long().cpu()
        if labels.dim() != 1 or (labels < 0).any() or (labels >= self.num_classes).any():
            raise UserError(f"labels must be (B,) class indices in [0, {self.num_classes})")
        if per_real < 2 or per_real % 2:
            raise UserError(f"per_real must be an even number >= 2, got {per_real}")
        gen = generator if generator is not None else self.generator
        b, n = len(labels), self.group_size
        g_all, m_all = [], []
        for _ in range(per_real // 2):
            pick = (torch.rand(b, generator=gen) * self.count[labels]).long()
            groups = self.groups_of[labels, pick]
            # lam = 1 is the last member (pure c1), lam = 0 the first (pure c2).
            end = torch.where(self.c1[groups] == labels, n - 1, 0)
            inner = torch.randint(1, n - 1, (b,), generator=gen)
            g_all += [groups, groups]
            m_all += [end, inner]
        g2, m2 = torch.cat(g_all), torch.cat(m_all)
        return self.images[g2, m2], self.soft_labels[g2, m2]
