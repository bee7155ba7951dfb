"""The CIFAR readers: the pickles of both Python versions, the globals they may name, the checks."""

import os
import pickle
import struct

import numpy as np
import pytest
import torch

from calibkit.data import load
from calibkit.data.cifar import read_cifar10, read_cifar100, read_cifar_batch
from tests.helpers.formats import cifar_rows, fake_cifar10, write_pickle


class _Py2Pickler(pickle._Pickler):
    """Protocol 2 as Python 2 wrote it (the distributed files): bytes as 8-bit strings, not
    ``_codecs.encode`` calls."""

    dispatch = pickle._Pickler.dispatch.copy()

    def _save_str8(self, obj):
        if len(obj) < 256:
            head = pickle.SHORT_BINSTRING + bytes([len(obj)])
        else:
            head = pickle.BINSTRING + struct.pack("<i", len(obj))
        self.write(head + obj)
        self.memoize(obj)

    dispatch[bytes] = _save_str8


def _py2_pickle(path, obj):
    import io

    buf = io.BytesIO()
    _Py2Pickler(buf, protocol=2).dump(obj)
    # numpy 1.x, which wrote the files, named its implementation module numpy.core
    path.write_bytes(buf.getvalue().replace(b"numpy._core.multiarray\n", b"numpy.core.multiarray\n"))


def test_a_python2_batch_with_numpy_1_names_is_read_exactly(tmp_path):
    data = cifar_rows(3, 120)  # values up to 200: bytes a plain ASCII decoding cannot read
    _py2_pickle(tmp_path / "b", {b"data": data, b"labels": [2, 0, 1], b"batch_label": b"x"})
    assert b"numpy.core.multiarray\n_reconstruct" in (tmp_path / "b").read_bytes()
    assert b"_codecs" not in (tmp_path / "b").read_bytes()
    images, labels = read_cifar_batch(str(tmp_path / "b"), b"labels")
    assert images.shape == (3, 3, 32, 32) and np.array_equal(images.reshape(3, -1), data)
    assert labels.dtype == np.int64 and labels.tolist() == [2, 0, 1]


@pytest.mark.parametrize("module", [b"numpy._core.multiarray", b"numpy.core.multiarray"])
def test_numpy_scalars_arrays_and_dtypes_of_either_numpy_are_allowed(tmp_path, module):
    labels = np.array([3, 1], np.uint8)  # a uint8 array of labels, as a user's own batches may hold
    obj = {b"data": cifar_rows(2, 0), b"labels": labels, b"first": np.int64(7)}  # a numpy scalar
    raw = pickle.dumps(obj, protocol=2)
    assert b"_codecs\nencode" in raw and b"numpy._core.multiarray\nscalar" in raw
    (tmp_path / "b").write_bytes(raw.replace(b"numpy._core.multiarray\n", module + b"\n"))
    images, got = read_cifar_batch(str(tmp_path / "b"), b"labels")
    assert got.dtype == np.int64 and got.tolist() == [3, 1] and images[1, 2, 0, 0] == 21


def test_the_structure_checks_name_the_file_and_what_was_found(tmp_path):
    path = tmp_path / "b"

    def error(obj):
        write_pickle(path, obj)
        with pytest.raises(ValueError) as err:
            read_cifar_batch(str(path), b"labels")
        return str(err.value)

    want = f"{path}: expected a dict with b'data' and b'labels', found "
    assert error({b"data": cifar_rows(2, 0), b"batch_label": b"x"}) == want + "[b'batch_label', b'data']"
    assert error({b"labels": [0, 1]}) == want + "[b'labels']"
    assert error([3, 1]) == want + "list"
    assert error({b"data": np.zeros((2, 3072), np.int64), b"labels": [0, 1]}) == (
        f"{path}: b'data' must be uint8 (N, 3072), got int64 (2, 3072)")
    assert error({b"data": cifar_rows(4, 0), b"labels": [0, 1, 2]}) == f"{path}: 4 images but 3 labels"
    path.write_bytes(pickle.dumps({b"data": cifar_rows(4, 0)}, protocol=2)[:50])
    with pytest.raises(ValueError, match=r"b: not a readable CIFAR pickle \((EOFError|UnpicklingError): \w"):
        read_cifar_batch(str(path), b"labels")


def test_the_folder_or_its_parent_and_the_error_naming_both(tmp_path):
    (tmp_path / "cifar-10-batches-py").mkdir()
    fake_cifar10(tmp_path / "cifar-10-batches-py")
    assert len(read_cifar10(str(tmp_path)).test) == 6  # the parent, where the archive was extracted
    with pytest.raises(FileNotFoundError) as err:
        read_cifar10(str(tmp_path / "elsewhere"))
    d = tmp_path / "elsewhere"
    assert str(err.value) == (f"no test_batch in {d} or {d / 'cifar-10-batches-py'}: point data_dir at the extracted "
                              "'cifar-10-batches-py' folder of the python version of the data set")


def test_class_names_without_meta_and_from_either_kind_of_string(tmp_path):
    fake_cifar10(tmp_path)
    os.remove(tmp_path / "batches.meta")
    names = read_cifar10(str(tmp_path)).class_names
    assert len(names) == 10 and names[0] == "airplane" and names[9] == "truck"  # CIFAR-10's own names
    write_pickle(tmp_path / "batches.meta", {b"label_names": [f"n{k}" for k in range(10)]})  # str, not bytes
    assert read_cifar10(str(tmp_path)).class_names[3] == "n3"
    _py2_pickle(tmp_path / "batches.meta", {b"label_names": [f"caf\u00e9{k}".encode() for k in range(10)]})
    assert read_cifar10(str(tmp_path)).class_names[4] == "caf\u00e94"  # 8-bit strings, decoded as UTF-8
    (tmp_path / "batches.meta").write_bytes(b"\x80\x02}q")
    with pytest.raises(ValueError, match=r"batches.meta: not a readable CIFAR meta pickle"):
        read_cifar10(str(tmp_path))


@pytest.mark.parametrize("bad, found", [(-1, "-1..5"), (10, "1..10")])
def test_cifar10_labels_outside_0_to_9_are_refused(tmp_path, bad, found):
    fake_cifar10(tmp_path)
    write_pickle(tmp_path / "test_batch", {b"data": cifar_rows(6, 0), b"labels": [bad, 1, 2, 3, 4, 5]})
    with pytest.raises(ValueError) as err:
        read_cifar10(str(tmp_path))
    assert str(err.value) == f"{tmp_path}: labels must lie in [0, 9], found {found}"


def _cifar100(root, test_labels=(99, 0, 42), meta=True):
    root.mkdir(exist_ok=True)
    write_pickle(root / "train", {b"data": cifar_rows(12, 0), b"fine_labels": [7 * i % 100 for i in range(12)]})
    write_pickle(root / "test", {b"data": cifar_rows(3, 50), b"fine_labels": list(test_labels)})
    if meta:
        write_pickle(root / "meta", {b"fine_label_names": [f"f{k}".encode() for k in range(100)]})


def test_cifar100_names_without_meta_and_the_checks(tmp_path):
    _cifar100(tmp_path, meta=False)
    names = read_cifar100(str(tmp_path)).class_names
    assert len(names) == 100 and names[0] == "0" and names[42] == "42" and names[99] == "99"
    write_pickle(tmp_path / "meta", {b"fine_label_names": [b"x"] * 99})
    with pytest.raises(ValueError, match=rf"^{tmp_path}/meta lists 99 fine label names, expected 100$"):
        read_cifar100(str(tmp_path))
    _cifar100(tmp_path, test_labels=(100, 0, 42))
    with pytest.raises(ValueError) as err:
        read_cifar100(str(tmp_path))
    assert str(err.value) == f"{tmp_path}: labels must lie in [0, 99], found 0..100"
    _cifar100(tmp_path / "cifar-100-python")
    b = load("cifar100", data_dir=str(tmp_path / "cifar-100-python"), val_size=2)
    assert b.test.labels.dtype == torch.int64 and b.test.labels.tolist() == [99, 0, 42]
