"""Fashion-MNIST scenes against a reference composition written from the documented rules."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from calibkit.data.scenes import compose_scenes, make_scene_splits, read_scenes, void_borders
from tests.helpers.formats import fake_fmnist


def _reference(pool, pool_y, n, seed, size=64, max_items=4, scale=(0.75, 1.5), threshold=25, background=48,
               noise=8.0):
    """The module docstring's scene, drawn in its documented order: background level, item count,
    then per item its pool index, side and position, then the noise."""
    rng = np.random.default_rng(seed)
    lo, hi = round(28 * scale[0]), round(28 * scale[1])
    images, masks, sources = [], [], np.full((n, max_items), -1)
    for i in range(n):
        canvas = np.full((size, size), rng.uniform(0, background), np.float32)
        lab = np.zeros((size, size), np.int64)
        for j in range(int(rng.integers(1, max_items + 1))):
            src, side = int(rng.integers(len(pool))), int(rng.integers(lo, hi + 1))
            r, c = rng.integers(0, size - side + 1, size=2)
            x = torch.tensor(pool[src], dtype=torch.float32)[None, None]
            item = F.interpolate(x, size=(side, side), mode="bilinear", align_corners=False,
                                 antialias=side < 28)[0, 0].numpy()
            on = item > threshold
            canvas[r:r + side, c:c + side][on] = item[on]
            lab[r:r + side, c:c + side][on] = pool_y[src] + 1
            sources[i, j] = src
        canvas += rng.normal(0.0, noise, size=(size, size)).astype(np.float32)
        images.append(np.clip(np.rint(canvas), 0, 255).astype(np.uint8))
        masks.append(lab)
    return np.stack(images)[:, None], np.stack(masks), sources


def _pool(m=7):
    rng = np.random.default_rng(1)
    pool = rng.integers(0, 256, (m, 28, 28)).astype(np.uint8)
    pool[:, :4] = 255  # bright rows: with the noise, values above 255 are clipped
    pool[:, 4:6] = 25  # exactly the threshold: not covered
    return pool, np.arange(m) % 10


def test_scenes_follow_the_documented_composition_with_the_defaults():
    pool, y = _pool()
    img, mask, src = compose_scenes(pool, y, 6, seed=5)
    ref_img, ref_lab, ref_src = _reference(pool, y, 6, 5)
    assert np.array_equal(src, ref_src) and (src == -1).any()  # unused slots are -1
    assert np.array_equal(img.numpy(), ref_img)
    assert (img == 0).any() and (img == 255).any()  # the noise is clipped at both ends
    assert np.array_equal(mask.numpy(), void_borders(ref_lab.astype(np.uint8)))
    # shrunk (antialiased), unscaled, and the extremes of the sides: 1 pixel and the whole canvas
    for scale, size in (((0.5, 0.6), 32), ((1.0, 1.0), 40), ((1 / 28, 1 / 28), 8), ((2.0, 2.0), 56)):
        got = compose_scenes(pool, y, 3, seed=2, size=size, scale=scale, max_items=2, background=10, noise=3.0)
        want = _reference(pool, y, 3, 2, size=size, scale=scale, max_items=2, background=10, noise=3.0)
        assert np.array_equal(got[0].numpy(), want[0]) and np.array_equal(got[2], want[2]), scale
    assert compose_scenes(pool, y.reshape(1, -1), 2, seed=5)[1].equal(compose_scenes(pool, y, 2, seed=5)[1])
    empty = compose_scenes(pool, y, 0, seed=5)
    assert empty[0].shape == (0, 1, 64, 64) and empty[2].shape == (0, 4)


def test_bad_pools_and_settings_are_refused_with_the_reason():
    pool, y = _pool(3)
    with pytest.raises(ValueError,
                       match=r"^need a non-empty pool of items with one label each, got 3 images, 2 labels$"):
        compose_scenes(pool, y[:2], 1, seed=0)
    msg = r"^invalid scene settings: item sides {}\.\.{} on a {}-pixel canvas, max_items={}, n={}$"
    with pytest.raises(ValueError, match=msg.format(21, 42, 64, 0, 1)):
        compose_scenes(pool, y, 1, seed=0, max_items=0)
    with pytest.raises(ValueError, match=msg.format(21, 42, 40, 4, 1)):
        compose_scenes(pool, y, 1, seed=0, size=40)
    with pytest.raises(ValueError, match=msg.format(21, 42, 64, 4, -1)):
        compose_scenes(pool, y, -1, seed=0)


def test_borders_of_the_first_class_are_void_too():
    lab = np.zeros((1, 5, 5), np.uint8)
    lab[0, 1:4, 1:4] = 1  # class 0 of Fashion-MNIST, label 1
    out = void_borders(lab)
    assert out[0, 2, 2] == 1 and (out[0, 1, 1:4] == 255).all() and out[0, 0, 0] == 0


def test_the_validation_pool_is_the_seeded_holdout(tmp_path):
    fake_fmnist(str(tmp_path), n_train=60, n_test=12)
    kw = dict(n_train=2, n_val=5, n_test=1)
    default = make_scene_splits(str(tmp_path), **kw)
    zero = make_scene_splits(str(tmp_path), seed=0, **kw)
    assert all(np.array_equal(a, b) for a, b in zip(default["val"], zero["val"])), "the default seed is 0"
    perm = np.random.default_rng(np.random.SeedSequence([0, 0])).permutation(60)
    used = default["val"][2]
    assert set(used[used >= 0].tolist()) <= set(perm[:10].tolist())  # 60 // 6 images held out
    assert set(used[used >= 0].tolist()) - set(perm[:8].tolist())  # ... not 60 // 7
    one = make_scene_splits(str(tmp_path), holdout=1, **kw)["val"][2]  # every item is pool item 0
    assert set(one[one >= 0].tolist()) == {int(perm[0])} and (one == -1).any()
    assert -2 not in one
    for bad in (0, 60):
        with pytest.raises(ValueError, match=rf"^holdout must be in \[1, 59\], got {bad}$"):
            make_scene_splits(str(tmp_path), holdout=bad, **kw)
    raw = read_scenes(str(tmp_path), n_val=2, n_train=1)
    assert torch.equal(raw.val.images, read_scenes(str(tmp_path), seed=0, n_val=2, n_train=1).val.images)
