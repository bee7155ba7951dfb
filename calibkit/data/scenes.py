"""Fashion-MNIST scenes: an offline semantic-segmentation data set composed from real images.

Each scene is a ``size x size`` (64) grey canvas holding 1 to ``max_items`` (4) Fashion-MNIST
items, each rescaled by a factor in ``scale`` (0.75..1.5, i.e. 21..42 pixels) and pasted at a
uniformly random position that keeps it on the canvas; later items occlude earlier ones. The
per-pixel label is 0 (background) or 1 + the item's Fashion-MNIST class (11 classes):

* an item covers the pixels where its rescaled intensity exceeds ``threshold`` (25 of 255 --
  Fashion-MNIST backgrounds are exactly 0, and 91% of the non-zero pixels of a garment are above
  25); only covered pixels are pasted and labelled, so a darker gap inside an item shows what lies
  beneath and is labelled as such;
* the canvas starts at a per-scene background level drawn from U[0, ``background``] (0..48) and
  Gaussian noise (std ``noise`` = 8 grey levels) is added to the whole composed scene, so dark
  garment regions and the background can look alike (the source of genuine uncertainty);
* "void" (255, ignored by losses and metrics): the 1-pixel inner border of every item region --
  the pixels of an item that touch a differently labelled pixel (4-neighbourhood), where the
  rescaled edge is blended and the label unreliable, as PASCAL VOC marks object borders void.

Sources are disjoint: :func:`read_scenes` builds **test** scenes only from the 10k Fashion-MNIST
test images and training/validation scenes only from the 60k training images, the validation
scenes from a seeded held-out part of them. Everything is drawn from
``numpy.random.default_rng`` seeded by ``SeedSequence([seed, stream])``, so a scene set is a pure
function of its arguments.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from calibkit.errors import UserError

from .bundle import RawData, Split
from .idx import FMNIST_CLASSES, read_fmnist

SCENE_CLASSES = ["background"] + list(FMNIST_CLASSES)
VOID = 255
# Default sizes of the built-in set: scenes per split, and training images held out for the
# validation scenes' items. The test set does not depend on the run's seed.
SCENES_TRAIN, SCENES_VAL, SCENES_TEST = 4000, 500, 500
HOLDOUT_IMAGES = 10000
TEST_SEED = 20240601  # the test scenes are one fixed set, whatever the run's seed
_STREAM = {"train": 1, "val": 2, "test": 3}


def _rescale(item: np.ndarray, side: int) -> np.ndarray:
    """uint8 (28, 28) -> float32 (side, side), bilinear (antialiased when shrinking)."""
    x = torch.from_numpy(item).float()[None, None]
    y = F.interpolate(x, size=(side, side), mode="bilinear", align_corners=False, antialias=side < item.shape[0])
    return y[0, 0].numpy()


def void_borders(labels: np.ndarray, void: int = VOID) -> np.ndarray:
    """Mark the 1-pixel inner border of every non-background region as ``void``.

    A pixel with label ``l > 0`` becomes void when one of its 4 neighbours (inside the canvas)
    has another label. Args: labels uint8 (N, H, W). Returns a new array.
    """
    lab = labels
    edge = np.zeros(lab.shape, dtype=bool)
    edge[:, 1:, :] |= lab[:, 1:, :] != lab[:, :-1, :]
    edge[:, :-1, :] |= lab[:, :-1, :] != lab[:, 1:, :]
    edge[:, :, 1:] |= lab[:, :, 1:] != lab[:, :, :-1]
    edge[:, :, :-1] |= lab[:, :, :-1] != lab[:, :, 1:]
    out = lab.copy()
    out[edge & (lab > 0)] = void
    return out


def compose_scenes(images, labels, n: int, seed, size: int = 64, max_items: int = 4,
                   scale: tuple[float, float] = (0.75, 1.5), threshold: int = 25, background: int = 48,
                   noise: float = 8.0) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """Compose ``n`` scenes from a pool of 28x28 items.

    Args:
        images: uint8 (M, 28, 28) or (M, 1, 28, 28) source items. labels: (M,) their classes in 0..9.
        n: number of scenes. seed: an int or a sequence of ints for ``numpy.random.default_rng``.
        size, max_items, scale, threshold, background, noise: see the module docstring.

    Returns:
        ``(images uint8 (n, 1, size, size), masks uint8 (n, size, size), sources int64 (n, max_items))``;
        mask values 0 (background), 1..10 (class + 1) or 255 (void); ``sources`` lists the pool
        index of each pasted item (-1 for unused slots), so tests can check where items came from.
    """
    pool = np.asarray(images, dtype=np.uint8).reshape(-1, 28, 28)
    pool_y = np.asarray(labels, dtype=np.int64).reshape(-1)
    if len(pool) == 0 or len(pool) != len(pool_y):
        raise UserError(f"need a non-empty pool of items with one label each, "
                        f"got {len(pool)} images, {len(pool_y)} labels")
    lo, hi = int(round(28 * scale[0])), int(round(28 * scale[1]))
    if not (1 <= lo <= hi <= size) or max_items < 1 or n < 0:
        raise UserError(f"invalid scene settings: item sides {lo}..{hi} on a {size}-pixel canvas, "
                         f"max_items={max_items}, n={n}")
    rng = np.random.default_rng(seed)
    canvas = np.zeros((n, size, size), dtype=np.float32)
    lab = np.zeros((n, size, size), dtype=np.uint8)
    sources = np.full((n, max_items), -1, dtype=np.int64)
    for i in range(n):  # everything of scene i is drawn before scene i + 1: the first n scenes are nested
        canvas[i] = rng.uniform(0, background)
        for j in range(int(rng.integers(1, max_items + 1))):
            src = int(rng.integers(len(pool)))
            side = int(rng.integers(lo, hi + 1))
            r, c = rng.integers(0, size - side + 1, size=2)
            item = _rescale(pool[src], side)
            cover = item > threshold
            win = (slice(r, r + side), slice(c, c + side))
            canvas[i][win][cover] = item[cover]
            lab[i][win][cover] = pool_y[src] + 1
            sources[i, j] = src
        canvas[i] += rng.normal(0.0, noise, size=(size, size)).astype(np.float32)
    img = torch.from_numpy(np.clip(np.rint(canvas), 0, 255).astype(np.uint8)).unsqueeze(1)
    return img, torch.from_numpy(void_borders(lab)), sources


def make_scene_splits(data_dir: str, seed: int = 0, n_train: int = SCENES_TRAIN, n_val: int = SCENES_VAL,
                      n_test: int = SCENES_TEST, holdout: int | None = None, **settings) -> dict:
    """Train, validation and test scenes with their source pools (see the module docstring).

    The Fashion-MNIST training images are split by a seeded permutation into ``holdout`` images
    (default ``min(10000, n / 6)``) for the validation scenes and the rest for the training
    scenes; test scenes use the test images and the fixed ``TEST_SEED``.

    Returns:
        ``{split: (images, masks, source_indices)}`` where ``source_indices`` index the official
        Fashion-MNIST split the items came from (training images for train/val, test for test).
    """
    raw = read_fmnist(data_dir)
    train_x, train_y = raw.train.images[:, 0].numpy(), raw.train.labels.numpy()
    holdout = min(HOLDOUT_IMAGES, len(train_y) // 6) if holdout is None else holdout
    if not 0 < holdout < len(train_y):
        raise UserError(f"holdout must be in [1, {len(train_y) - 1}], got {holdout}")
    perm = np.random.default_rng(np.random.SeedSequence([seed, 0])).permutation(len(train_y))
    pools = {"train": np.sort(perm[holdout:]), "val": np.sort(perm[:holdout])}
    out = {}
    for split, n in (("train", n_train), ("val", n_val)):
        idx = pools[split]
        img, mask, src = compose_scenes(train_x[idx], train_y[idx], n, np.random.SeedSequence([seed, _STREAM[split]]),
                                        **settings)
        out[split] = (img, mask, np.where(src >= 0, idx[np.clip(src, 0, None)], -1))
    test_x, test_y = raw.test.images[:, 0].numpy(), raw.test.labels.numpy()
    out["test"] = compose_scenes(test_x, test_y, n_test, np.random.SeedSequence([TEST_SEED, _STREAM["test"]]),
                                 **settings)
    return out


def read_scenes(data_dir: str, seed: int = 0, n_val: int = SCENES_VAL, n_train: int = SCENES_TRAIN) -> RawData:
    """The ``scenes`` data set as :class:`RawData` with its validation split fixed by ``seed``.

    Scenes are drawn one after another from one stream per split, so the first ``n`` training
    scenes do not depend on ``n_train``: smaller training sets are nested in larger ones.
    """
    parts = make_scene_splits(data_dir, seed=seed, n_val=n_val, n_train=n_train)
    split = {k: Split(img, mask) for k, (img, mask, _) in parts.items()}
    return RawData(train=split["train"], val=split["val"], test=split["test"], class_names=list(SCENE_CLASSES))
