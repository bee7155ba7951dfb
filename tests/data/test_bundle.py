"""The containers of a loaded data set and the seeded split (calibkit.data.bundle), checked by hand."""

import hashlib
import re
import struct

import numpy as np
import pytest
import torch

from calibkit.data.bundle import Split, channel_stats, index_checksum, stratified_quotas, stratified_split


def labels(n):
    return torch.zeros(n, dtype=torch.int64)


def test_split_accepts_each_modality_and_nothing_else():
    # accepted: uint8 images (N, C, H, W), int64 token ids (N, L), float32 features (N, d) and (N, a, b)
    for inputs in (torch.zeros(3, 1, 2, 2, dtype=torch.uint8), torch.zeros(3, 7, dtype=torch.int64),
                   torch.zeros(3, 5), torch.zeros(3, 2, 2, 2)):
        assert len(Split(inputs, labels(3))) == 3
    message = ("images must be a uint8 tensor (N, C, H, W) (or int64 token ids (N, L), or float32 inputs "
               "(N, ...) of the features modality), got {}")
    refused = {
        "torch.uint8 (3, 7)": torch.zeros(3, 7, dtype=torch.uint8),  # uint8 but not 4-D
        "torch.float64 (3, 1, 2, 2)": torch.zeros(3, 1, 2, 2, dtype=torch.float64),  # 4-D but not uint8
        "torch.int64 (3, 2, 2)": torch.zeros(3, 2, 2, dtype=torch.int64),  # token ids of rank 3
        "torch.float64 (3, 5)": torch.zeros(3, 5, dtype=torch.float64),  # features of another float type
        "torch.float32 (3,)": torch.zeros(3),  # features without a feature axis
    }
    for got, inputs in refused.items():
        with pytest.raises(ValueError, match="^" + re.escape(message.format(got)) + "$"):
            Split(inputs, labels(3))


def test_split_count_mismatch_names_both_counts():
    with pytest.raises(ValueError, match="^3 images but 2 labels$"):
        Split(torch.zeros(3, 1, 4, 4, dtype=torch.uint8), labels(2))
    with pytest.raises(ValueError, match="^2 images but 5 labels$"):
        Split(torch.zeros(2, 9, dtype=torch.int64), labels(5))


def test_subset_takes_rows_in_index_order_and_an_empty_index():
    split = Split(torch.arange(4 * 3, dtype=torch.int64).reshape(4, 3), torch.tensor([0, 1, 2, 3]))
    part = split.subset(np.array([3, 1], dtype=np.int32))
    assert part.labels.tolist() == [3, 1] and part.images.tolist() == [[9, 10, 11], [3, 4, 5]]
    empty = split.subset([])  # an index list with no entries: an empty split of the same inputs' shape
    assert len(empty) == 0 and tuple(empty.images.shape) == (0, 3) and empty.labels.dtype == torch.int64


def test_index_checksum_is_sha256_of_little_endian_int64():
    expected = hashlib.sha256(struct.pack("<3q", 4, 0, 70000)).hexdigest()[:16]
    assert index_checksum([4, 0, 70000]) == expected
    assert index_checksum(np.array([4, 0, 70000], dtype=np.int32)) == expected  # the index type never matters
    assert index_checksum(torch.tensor([4, 0, 70000])) == expected
    assert len(index_checksum([])) == 16 and index_checksum([]) == hashlib.sha256(b"").hexdigest()[:16]


def test_stratified_quotas_edges():
    assert stratified_quotas([0, 0], 0).tolist() == [0, 0]  # nothing to draw from
    assert stratified_quotas([0, 1], 0).tolist() == [0, 0]
    assert stratified_quotas([0, 1], 1).tolist() == [0, 1]
    none = stratified_quotas([], 0)
    assert none.dtype == np.int64 and none.shape == (0,)
    # counts given as a small integer type: 200 * 150 overflows uint8, the quotas must not
    assert stratified_quotas(np.array([200, 100], dtype=np.uint8), 150).tolist() == [100, 50]
    with pytest.raises(ValueError, match=r"^cannot draw 3 of 2 items$"):
        stratified_quotas([1, 1], 3)
    with pytest.raises(ValueError, match=r"^cannot draw -1 of 2 items$"):
        stratified_quotas([1, 1], -1)


def test_stratified_split_message_and_sizes():
    with pytest.raises(ValueError, match=r"^val_size must be in \[0, 9\] for a training set of 10 images, got 10$"):
        stratified_split(np.zeros(10, dtype=np.int64), 10, 0)
    rest, drawn = stratified_split(np.zeros(10, dtype=np.int64), 0, 0)
    assert rest.tolist() == list(range(10)) and drawn.tolist() == [] and drawn.dtype == np.int64


def reference_stats(images):
    x = images.double() / 255
    return x.mean(dim=(0, 2, 3)), x.std(dim=(0, 2, 3), unbiased=False)


def test_channel_stats_sums_every_chunk():
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (5, 3, 4, 4), generator=g, dtype=torch.uint8)
    images[4] = 255  # the last chunk differs from the others
    mean_ref, std_ref = reference_stats(images)
    for chunk in (1, 2, 4096):
        mean, std = channel_stats(images, chunk=chunk)
        assert mean == pytest.approx(mean_ref.tolist(), rel=1e-12) and std == pytest.approx(std_ref.tolist(), rel=1e-12)


def test_channel_stats_is_exact_beyond_float32_counts():
    # 4097^2 = 16,785,409 pixels, more than 2^24: a float32 histogram could not count them exactly
    images = torch.zeros(1, 1, 4097, 4097, dtype=torch.uint8)
    images[0, 0, -1, -1] = 255
    n = 4097 * 4097
    p = 1 / n
    (mean,), (std,) = channel_stats(images)
    assert mean == pytest.approx(p, rel=1e-12, abs=0) and std == pytest.approx((p * (1 - p)) ** 0.5, rel=1e-12, abs=0)
    (_,), (flat,) = channel_stats(torch.full((2, 1, 3, 3), 7, dtype=torch.uint8))
    assert flat == 1e-6  # a constant channel gets the floor instead of a zero std
