"""Reading array files (calibkit.data.tensors): damaged files, pickles, folders and unsigned labels
each give one ValueError naming the file."""

import io
import re

import numpy as np
import pytest
import torch

from calibkit.data import load
from calibkit.data.tensors import read_arrays, read_npz, read_pt


def test_random_bytes_are_not_a_readable_npz_but_object_arrays_stay_refused(tmp_path):
    path = tmp_path / "noise.npz"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 300, dtype=np.uint8).tobytes())
    message = f"{path}: not a readable .npz file (not an intact zip archive: truncated, corrupt or another format)"
    for read in (read_npz, read_arrays):
        with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
            read(str(path))
    good = tmp_path / "good.npz"
    np.savez(good, a=np.arange(3))
    cut = tmp_path / "cut.npz"
    cut.write_bytes(good.read_bytes()[:-30])  # the end of the archive (its central directory) is gone
    with pytest.raises(ValueError, match=re.escape(f"{cut}: not a readable .npz file")):
        read_npz(cut)
    objects = tmp_path / "objects.npz"
    np.savez(objects, x_train=np.arange(3), x_test=np.array([{"a": 1}], dtype=object))
    refusal = (f"{objects}: array 'x_test' holds Python objects (dtype object), which calibkit does not unpickle; "
               "store numeric arrays")
    with pytest.raises(ValueError, match="^" + re.escape(refusal) + "$"):
        read_arrays(str(objects))


def _saved(obj, legacy=False) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf, _use_new_zipfile_serialization=not legacy)
    return buf.getvalue()


@pytest.mark.parametrize("legacy", [False, True])
@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9])
def test_a_truncated_pt_file_is_named_truncated(tmp_path, legacy, fraction):
    data = _saved({"logits": torch.randn(5000, 10), "labels": torch.randint(0, 10, (5000,))}, legacy)
    path = tmp_path / "cut.pt"
    path.write_bytes(data[: int(len(data) * fraction)])  # 10% of the zip format: OSError [Errno 22] from torch
    with pytest.raises(ValueError, match="^" + re.escape(f"{path}: truncated or corrupt .pt file (")):
        read_pt(path)


def test_pickled_objects_in_a_pt_file_are_refused_not_loaded(tmp_path):
    path = tmp_path / "arrays.pt"
    path.write_bytes(_saved({"logits": np.zeros((3, 2))}))  # numpy arrays need numpy's globals: not weights only
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}: holds pickled Python objects other than tensors "
                                         r"\(numpy\..*\), which calibkit does not load \(weights_only\); save a dict "
                                         "of torch tensors$"):
        read_pt(path)
    path.write_bytes(_saved([torch.zeros(2)]))
    with pytest.raises(ValueError, match="holds a list, not a dict of tensors"):
        read_pt(path)
    path.write_bytes(_saved({"logits": torch.zeros(3, 2)}))
    assert torch.equal(read_pt(path)["logits"], torch.zeros(3, 2))


def test_a_folder_is_not_a_tensors_file(tmp_path):
    folder = tmp_path / "data.npz"
    folder.mkdir()
    with pytest.raises(ValueError, match="^" + re.escape(f"{folder} is a directory, not a tensors file") + "$"):
        read_arrays(str(folder))
    with pytest.raises(FileNotFoundError, match="^" + re.escape(f"tensors file {tmp_path / 'none.npz'} not found")):
        read_arrays(str(tmp_path / "none.npz"))


def test_unsigned_labels_are_read_as_int64_unless_above_its_range(tmp_path):
    x = np.random.default_rng(0).normal(size=(12, 3)).astype(np.float32)
    y = np.arange(12) % 3
    path = tmp_path / "u.npz"
    np.savez(path, x_train=x, y_train=y.astype(np.uint32), x_test=x[:6], y_test=y[:6].astype(np.uint64))
    b = load("tensors", data_dir=str(path), val_size=3)
    assert b.num_classes == 3 and b.test.labels.dtype == torch.int64 and b.test.labels.tolist() == y[:6].tolist()
    huge = y[:6].astype(np.uint64)
    huge[2] = 2**63
    np.savez(path, x_train=x, y_train=y.astype(np.uint32), x_test=x[:6], y_test=huge)
    with pytest.raises(ValueError, match="^" + re.escape(f"{path}: y_test: label {2**63} is above the int64 range; "
                                                         "labels are class indices 0..K-1") + "$"):
        load("tensors", data_dir=str(path), val_size=3)


def test_a_huge_label_is_refused_without_walking_up_to_it(tmp_path):
    x = np.zeros((4, 2), np.float32)
    path = tmp_path / "h.npz"
    np.savez(path, x_train=x, y_train=np.array([0, 1, 0, 10**15]), x_test=x, y_test=np.array([0, 1, 0, 1]))
    with pytest.raises(ValueError, match=re.escape("but class(es) [2, 3, 4, 5, 6] have no example in y_train")):
        load("tensors", data_dir=str(path), val_size=1)
