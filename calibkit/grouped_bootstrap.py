"""Paired bootstrap of an ECE difference that resamples *groups* of samples (images of pixels).

Pixels of one image are strongly dependent (neighbours share a prediction and an error), so a
bootstrap that resamples pixels independently gives intervals far too narrow. Here the
resampling unit is the group (the test image a pixel came from): each resample draws ``G``
images with replacement and keeps all their pixels, once per draw. Paired: the same image draw
is applied to both models' probabilities of the same pixels.

With image multiplicities ``w_g`` (how often image ``g`` was drawn) the resampled ECE is

    ECE(w) = sum_b | sum_g w_g S_gb | / sum_g w_g n_g,   S_gb = sum_{i in g, bin(i) = b} (conf_i - correct_i)

(15 equal-width confidence bins ``(lo, hi]``, as :func:`calibkit.functional.ece`), so every
resample is one matrix product over per-image bin sums, whatever the number of pixels.
With every ``w_g = 1`` it is the ECE of all the pixels.
"""

from __future__ import annotations

import numpy as np
import torch

from calibkit.errors import UserError
from calibkit.functional.binning import equal_width_bins


def _image_bin_sums(probs: torch.Tensor, labels: torch.Tensor, group_index: np.ndarray, n_groups: int,
                    n_bins: int) -> np.ndarray:
    """(G, B) sums of ``conf - correct`` per image and confidence bin."""
    conf, pred = probs.double().max(dim=1)
    gap = (conf - (pred == labels.to(pred.device)).double()).cpu().numpy()
    b = equal_width_bins(conf, n_bins).cpu().numpy()
    out = np.zeros((n_groups, n_bins))
    np.add.at(out, (group_index, b), gap)
    return out


def paired_grouped_ece_diff(probs_a, probs_b, labels, groups, n_bins: int = 15, n_resamples: int = 1000,
                            seed: int = 0) -> dict:
    """ECE(a) - ECE(b) and its image-level paired bootstrap samples.

    Args:
        probs_a, probs_b: (P, K) probabilities of the same P pixels from two models.
        labels: (P,) their labels. groups: (P,) the image each pixel belongs to (any integers).
        n_bins: equal-width bins. n_resamples: bootstrap resamples. seed: seed of the image draws
            (the same seed and number of images give the same draws, so runs of different seeds
            can be averaged resample by resample).

    Returns:
        ``{"estimate": float, "samples": float64 tensor (n_resamples,), "groups": G}``.
    """
    probs_a, probs_b = torch.as_tensor(probs_a), torch.as_tensor(probs_b)
    labels = torch.as_tensor(labels).long()
    groups = np.asarray(torch.as_tensor(groups).cpu().numpy())
    if not (probs_a.shape == probs_b.shape and probs_a.dim() == 2 and labels.shape == (probs_a.shape[0],)
            and groups.shape == (probs_a.shape[0],)):
        raise UserError(f"need probs (P, K) twice, labels (P,) and groups (P,), got {tuple(probs_a.shape)}, "
                         f"{tuple(probs_b.shape)}, {tuple(labels.shape)}, {groups.shape}")
    if probs_a.shape[0] == 0:
        raise UserError("no pixels to compare")
    uniq, gi = np.unique(groups, return_inverse=True)
    g = len(uniq)
    sa = _image_bin_sums(probs_a, labels, gi, g, n_bins)
    sb = _image_bin_sums(probs_b, labels, gi, g, n_bins)
    n_g = np.bincount(gi, minlength=g).astype(np.float64)
    rng = np.random.default_rng(seed)
    w = np.stack([np.bincount(rng.integers(0, g, size=g), minlength=g) for _ in range(n_resamples)]).astype(np.float64)

    def ece(weights, s):  # weights (R, G), s (G, B) -> (R,)
        return np.abs(weights @ s).sum(axis=1) / (weights @ n_g)

    ones = np.ones((1, g))
    estimate = float(ece(ones, sa)[0] - ece(ones, sb)[0])
    return {"estimate": estimate, "samples": torch.from_numpy(ece(w, sa) - ece(w, sb)), "groups": g}
