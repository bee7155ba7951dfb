"""Data loaders on files written in the exact on-disk formats, splits, augmentation and mixing."""

import dataclasses
import gzip
import os
import pickle
import re

import numpy as np
import pytest
import torch

from calibkit.data import DATASETS, augment, check_dataset, load, mixup, normalize, regmixup, resize
from calibkit.data.bundle import channel_stats, stratified_quotas, stratified_split
from calibkit.data.idx import FMNIST_DIR, FMNIST_FILES
from tests.conftest import ROOT
from tests.helpers.formats import cifar_rows, fake_cifar10, fake_fmnist, write_idx, write_pickle

FMNIST_PRESENT = os.path.isfile(os.path.join(FMNIST_DIR, "train-images-idx3-ubyte.gz"))


# ------------------------------------------------------------------------------ writers


def save_image(path, array):
    from PIL import Image

    Image.fromarray(array).save(path)


# ------------------------------------------------------------------------- Fashion-MNIST


@pytest.mark.skipif(not FMNIST_PRESENT,
                    reason=f"Fashion-MNIST not installed in {FMNIST_DIR} (apt-get install dataset-fashion-mnist)")
def test_fmnist_real_files():
    b = load("fmnist")
    assert (len(b.train), len(b.val), len(b.test)) == (55000, 5000, 10000)
    assert b.train.images.shape[1:] == (1, 28, 28) and b.train.images.dtype == torch.uint8
    assert b.train.labels.dtype == torch.int64 and b.num_classes == 10 and b.in_channels == 1
    # the official splits are balanced: 6000 images per class in train+val, 1000 in test
    counts = torch.bincount(torch.cat([b.train.labels, b.val.labels]), minlength=10)
    assert counts.tolist() == [6000] * 10
    assert torch.bincount(b.test.labels).tolist() == [1000] * 10
    assert b.mean[0] == pytest.approx(0.2860, abs=2e-3) and b.std[0] == pytest.approx(0.3530, abs=2e-3)
    assert b.class_names[9] == "Ankle boot"
    # stratified: the balanced data set gives exactly 500 validation and 1000 subset images per class
    assert torch.bincount(b.val.labels).tolist() == [500] * 10
    sub = load("fmnist", train_subset=10000, seed=0)
    assert torch.bincount(sub.train.labels).tolist() == [1000] * 10
    assert sub.split["val_checksum"] == b.split["val_checksum"] and torch.equal(sub.val.images, b.val.images)
    assert sub.split["train_checksum"] != load("fmnist", train_subset=10000, seed=1).split["train_checksum"]


def test_train_subset_is_the_second_draw_of_the_seed(tmp_path):
    # validation = draw 0 of SeedSequence([seed, stream]), training subset = draw 1 (of the images
    # left after validation): independent draws, so a subset is not the validation split's shadow
    arrays = fake_fmnist(tmp_path)
    b = load("fmnist", data_dir=str(tmp_path), val_size=8, seed=3, train_subset=16)
    rest, _ = stratified_split(arrays["train_labels"], 8, 3, stream=0)
    left = arrays["train_labels"][rest]
    _, keep = stratified_split(left, 16, 3, stream=1)
    _, same_stream = stratified_split(left, 16, 3, stream=0)
    assert not np.array_equal(keep, same_stream)  # the two streams draw different subsets here
    assert torch.equal(b.train.images[:, 0], torch.from_numpy(arrays["train_images"][rest][keep].astype(np.uint8)))
    assert torch.equal(b.train.labels, torch.from_numpy(left[keep]))


def test_fmnist_written_files(tmp_path):
    arrays = fake_fmnist(tmp_path)
    b = load("fmnist", data_dir=str(tmp_path), val_size=8, seed=3)
    assert (len(b.train), len(b.val), len(b.test)) == (32, 8, 12)
    train_idx, val_idx = stratified_split(arrays["train_labels"], 8, 3)
    assert torch.equal(b.val.images[:, 0], torch.from_numpy(arrays["train_images"][val_idx].astype(np.uint8)))
    assert torch.equal(b.train.labels, torch.from_numpy(arrays["train_labels"][train_idx]))
    assert torch.equal(b.test.labels, torch.from_numpy(arrays["test_labels"]))
    assert b.data_dir == os.path.abspath(tmp_path) and b.split["seed"] == 3
    # un-gzipped idx files are read as well
    gz = os.path.join(tmp_path, FMNIST_FILES["test_images"] + ".gz")
    with gzip.open(gz) as src, open(gz[:-3], "wb") as dst:
        dst.write(src.read())
    os.remove(gz)
    assert torch.equal(load("fmnist", data_dir=str(tmp_path), val_size=8, seed=3).test.images, b.test.images)


def test_fmnist_missing_says_how_to_get(tmp_path):
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        load("fmnist", data_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"or pass --data-dir / data_dir= pointing to a folder with the four "
                                                r"idx \.gz files$"):
        load("fmnist", data_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load("fmnist", data_dir=str(tmp_path / "nowhere"))


def test_read_idx_header_rules_and_messages_in_full(tmp_path):
    from calibkit.data.idx import read_idx

    def plain(name, data):
        path = os.path.join(tmp_path, name)
        with open(path, "wb") as f:
            f.write(bytes(data))
        return path

    with pytest.raises(FileNotFoundError, match=r"^idx file not found: .*nothing$"):
        read_idx(os.path.join(tmp_path, "nothing"), 2049)
    # the shortest valid file: magic and one size of 0 (8 bytes), an empty label file
    assert read_idx(plain("empty", [0, 0, 8, 1, 0, 0, 0, 0]), 2049).shape == (0,)
    with pytest.raises(ValueError, match=r"short: only 7 bytes, too short for an idx header$"):
        read_idx(plain("short", [0, 0, 8, 1, 0, 0, 0]), 2049)
    for want, kind in ((2049, "label"), (2051, "image")):
        with pytest.raises(ValueError, match=rf"magic number 2050, expected {want} for an idx {kind} file$"):
            read_idx(plain("odd", [0, 0, 8, 2, 0, 0, 0, 0, 0, 0, 0, 0]), want)
    # sizes are big-endian int32: 2 x 300 labels of a 3-dim file read back in order
    data = [0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 1, 44, 0, 0, 0, 1] + [i % 256 for i in range(600)]
    arr = read_idx(plain("big", data), 2051)
    assert arr.shape == (2, 300, 1) and arr.reshape(-1).tolist() == [i % 256 for i in range(600)]
    wide = read_idx(plain("wide", [0, 0, 8, 3, 0, 0, 0, 1, 0, 0, 0, 1, 0, 1, 0, 0] + [7] * 65536), 2051)
    assert wide.shape == (1, 1, 65536)  # every byte of every size counts


def test_fmnist_pair_checks_name_the_split(tmp_path):
    arrays = fake_fmnist(tmp_path)
    write_idx(os.path.join(tmp_path, FMNIST_FILES["test_labels"] + ".gz"), arrays["test_labels"][:5], 2049)
    with pytest.raises(ValueError, match=r"^Fashion-MNIST test: \(12, 28, 28\) images do not match \(5,\) labels in "):
        load("fmnist", data_dir=str(tmp_path), val_size=4)
    labels = arrays["test_labels"].copy()
    labels[3] = 10  # one past the last class
    write_idx(os.path.join(tmp_path, FMNIST_FILES["test_labels"] + ".gz"), labels, 2049)
    with pytest.raises(ValueError, match=r"^Fashion-MNIST test: label 10 out of range 0..9 in "):
        load("fmnist", data_dir=str(tmp_path), val_size=4)
    labels[3] = 9
    write_idx(os.path.join(tmp_path, FMNIST_FILES["test_labels"] + ".gz"), labels, 2049)
    assert load("fmnist", data_dir=str(tmp_path), val_size=4).test.labels.max() == 9


def test_fmnist_corrupt_files(tmp_path):
    fake_fmnist(tmp_path)
    path = os.path.join(tmp_path, FMNIST_FILES["train_images"] + ".gz")
    raw = open(path, "rb").read()
    with open(path, "wb") as f:  # truncated gzip stream
        f.write(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match="train-images-idx3-ubyte.gz.*(corrupt|truncated)"):
        load("fmnist", data_dir=str(tmp_path), val_size=4)
    write_idx(path, np.zeros((40, 28, 28)), 2049)  # a label magic on an image file
    with pytest.raises(ValueError, match="magic number 2049, expected 2051"):
        load("fmnist", data_dir=str(tmp_path), val_size=4)
    with gzip.open(path, "wb") as f:  # header promises 40 images, data holds 39
        f.write((2051).to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in (40, 28, 28)) + bytes(39 * 784))
    with pytest.raises(ValueError, match="truncated or corrupt"):
        load("fmnist", data_dir=str(tmp_path), val_size=4)


# --------------------------------------------------------------------------- splits, digits


def test_stratified_quotas_by_hand():
    # exact shares 3.0, 1.5, 0.5 of 5 -> floors 3, 1, 0; one left for the largest remainder (0.5,
    # a tie between classes 1 and 2 broken by the lower index)
    assert stratified_quotas([6, 3, 1], 5).tolist() == [3, 2, 0]
    assert stratified_quotas([10, 10, 10], 30).tolist() == [10, 10, 10]
    assert stratified_quotas([5, 0, 5], 3).tolist() == [2, 0, 1]
    with pytest.raises(ValueError, match="cannot draw"):
        stratified_quotas([1, 1], 3)


def test_stratified_split_is_disjoint_sorted_seeded_and_proportional():
    labels = np.repeat(np.arange(4), [40, 30, 20, 10])  # stored class by class, like an image folder
    tr, va = stratified_split(labels, 10, seed=1)
    assert len(set(tr) & set(va)) == 0 and sorted(set(tr) | set(va)) == list(range(100))
    assert (np.diff(tr) > 0).all() and (np.diff(va) > 0).all()
    assert np.bincount(labels[va], minlength=4).tolist() == [4, 3, 2, 1]
    assert np.array_equal(va, stratified_split(labels, 10, seed=1)[1])
    assert not np.array_equal(va, stratified_split(labels, 10, seed=2)[1])
    assert not np.array_equal(va, stratified_split(labels, 10, seed=1, stream=1)[1])
    with pytest.raises(ValueError, match="val_size"):
        stratified_split(labels[:10], 10, 0)


def test_digits_bundle():
    b = load("digits", seed=0)
    assert (len(b.train), len(b.val), len(b.test)) == (1237, 200, 360)
    assert b.train.images.shape[1:] == (1, 28, 28) and b.train.images.dtype == torch.uint8
    assert not b.hflip and b.num_classes == 10 and b.class_names[3] == "3"
    assert int(b.train.images.max()) == 255 and int(b.train.images.min()) == 0
    again, other = load("digits", seed=0), load("digits", seed=1)
    assert torch.equal(b.val.images, again.val.images) and b.split == again.split
    assert b.split["val_checksum"] != other.split["val_checksum"]
    assert torch.equal(b.test.images, other.test.images), "the test split does not depend on the seed"
    # train and val are disjoint: no validation image appears in the training split
    flat_train = {bytes(x) for x in b.train.images.flatten(1).numpy()}
    assert not any(bytes(x) in flat_train for x in b.val.images.flatten(1).numpy())
    mean, std = channel_stats(b.train.images)
    ref = b.train.images.double() / 255
    assert (mean[0] == pytest.approx(ref.mean().item(), abs=1e-9)
            and std[0] == pytest.approx(ref.std(unbiased=False).item(), abs=1e-9))


def test_digits_file_checks_in_full(tmp_path):
    from calibkit.data.digits import read_digits_file

    images, labels = read_digits_file()
    assert images.shape == (1797, 8, 8) and int(images.max()) == 16 and int(labels.max()) == 9

    def npz(name, **arrays):
        path = tmp_path / name
        np.savez(path, **arrays)
        return path

    unreadable = r"unreadable digits file \(.*\); reinstall calibkit$"
    with pytest.raises(ValueError, match=r"^.*objects.npz: " + unreadable):  # a pickled object array is refused
        read_digits_file(npz("objects.npz", images=np.array([{"a": 1}], dtype=object), labels=labels))
    with pytest.raises(ValueError, match=r"^.*nolabels.npz: " + unreadable):
        read_digits_file(npz("nolabels.npz", images=images))
    bad = {
        "bright.npz": (np.where(images == 16, 17, images), labels),  # a grey level above 16
        "label10.npz": (images, np.where(labels == 9, 10, labels)),  # a label above 9
        "fewlabels.npz": (images, labels[:-1]),
        "smallimages.npz": (images[:, :7], labels),
    }
    for name, (im, lab) in bad.items():
        with pytest.raises(ValueError, match=rf"^.*{name}: unexpected arrays \(.*\) / \(.*\); reinstall calibkit$"):
            read_digits_file(npz(name, images=im, labels=lab))


def test_val_size_fraction_and_train_subset_checks():
    b = load("digits", val_size=0.25, train_subset=100)
    assert len(b.val) == round(0.25 * 1437) and len(b.train) == 100 and b.split["train_subset"] == 100
    with pytest.raises(ValueError, match="train_subset"):
        load("digits", train_subset=5000)
    with pytest.raises(ValueError, match="val_size"):
        load("digits", val_size=1437)


def test_unknown_dataset_and_missing_dir():
    with pytest.raises(ValueError, match="fmnist"):
        load("mnist-fashion")
    with pytest.raises(ValueError, match="needs data_dir"):
        load("cifar10")


def _documented_datasets() -> list[str]:
    """The first column of the table under "Data sets" in docs/data.md, in order."""
    with open(os.path.join(ROOT, "docs", "data.md")) as f:
        text = f.read().split("## Data sets (`DATASETS`)", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([^`]+)`", text, flags=re.M)


def test_every_registered_data_set_is_documented_in_order():
    assert _documented_datasets() == list(DATASETS)


@pytest.mark.parametrize("name", list(DATASETS))
def test_check_dataset_asks_for_the_packages_of_the_entry(name, monkeypatch):
    import calibkit.extras as extras

    spec = DATASETS[name]
    assert set(spec.needs) <= set(extras.PACKAGES), f"{name}: needs a package calibkit.extras does not know"
    monkeypatch.setattr(extras, "available", lambda module: False)  # every optional package missing
    if not spec.needs:
        check_dataset(name)  # the base install reads it: nothing asked
        return
    pips = ", ".join(extras.PACKAGES[m][0] for m in spec.needs)
    installs = " ".join(f"'calibkit[{e}]'" for e in sorted({extras.PACKAGES[m][1] for m in spec.needs}))
    with pytest.raises(extras.MissingExtra) as err:
        check_dataset(name)
    assert str(err.value) == f"the data set {name!r} needs {pips}: pip install {installs}"
    monkeypatch.setattr(extras, "available", lambda module: True)
    check_dataset(name)


def test_check_dataset_ignores_names_outside_the_registry(monkeypatch):
    import calibkit.extras as extras

    monkeypatch.setattr(extras, "available", lambda module: False)
    for name in ("digits-heldout", "/some/folder", "noise"):
        assert name not in DATASETS
        check_dataset(name)


# ------------------------------------------------------------------------------- CIFAR, SVHN


def test_cifar10_pickles(tmp_path):
    fake_cifar10(tmp_path)
    b = load("cifar10", data_dir=str(tmp_path), val_size=5, seed=0)
    assert (len(b.train), len(b.val), len(b.test)) == (15, 5, 6)
    assert b.test.images.shape == (6, 3, 32, 32) and b.class_names[2] == "c2"
    img = b.test.images[4]  # test image 4: channel c holds 10*c + 4 + 100, red pixel (1, 2) = 200
    assert img[0, 0, 0] == 104 and img[1, 5, 5] == 114 and img[2, 31, 31] == 124 and img[0, 1, 2] == 200
    assert b.test.labels.tolist() == list(range(6))
    # training order is batch 1..5: every image's red value = image index in batch + batch number
    all_labels = np.array([(1 + i // 4 + i % 4) % 10 for i in range(20)])
    train_idx, val_idx = stratified_split(all_labels, 5, 0)
    expect = torch.tensor([(i % 4) + 1 + i // 4 for i in train_idx], dtype=torch.uint8)
    assert torch.equal(b.train.images[:, 0, 0, 0], expect)
    assert b.train.labels.tolist() == [(1 + i // 4 + i % 4) % 10 for i in train_idx]
    assert b.hflip and b.crop_pad == 4
    ref = b.train.images.double() / 255  # per-channel statistics of the training split
    assert b.mean == pytest.approx(tuple(ref.mean(dim=(0, 2, 3)).tolist()), abs=1e-9)
    assert b.std == pytest.approx(tuple(ref.std(dim=(0, 2, 3), unbiased=False).tolist()), abs=1e-9)


def test_cifar_pickle_refuses_other_globals_and_garbage(tmp_path):
    fake_cifar10(tmp_path)
    # a pickle naming a function global (os.getcwd): must be refused, never resolved
    write_pickle(tmp_path / "data_batch_3", {b"data": cifar_rows(4, 0), b"labels": [0] * 4, b"f": os.getcwd})
    with pytest.raises(ValueError, match="refusing to unpickle global"):
        load("cifar10", data_dir=str(tmp_path), val_size=2)
    (tmp_path / "data_batch_3").write_bytes(pickle.dumps({b"data": cifar_rows(4, 0)}, protocol=2)[:50])
    with pytest.raises(ValueError, match="data_batch_3"):
        load("cifar10", data_dir=str(tmp_path), val_size=2)
    write_pickle(tmp_path / "data_batch_3", {b"data": np.zeros((4, 100), np.uint8), b"labels": [0] * 4})
    with pytest.raises(ValueError, match=r"\(N, 3072\)"):
        load("cifar10", data_dir=str(tmp_path), val_size=2)
    os.remove(tmp_path / "data_batch_3")
    with pytest.raises(FileNotFoundError, match="data_batch_3"):
        load("cifar10", data_dir=str(tmp_path), val_size=2)


def test_cifar100_pickles(tmp_path):
    root = tmp_path / "cifar-100-python"  # data_dir may be the parent folder
    root.mkdir()
    write_pickle(root / "train", {b"data": cifar_rows(12, 0), b"fine_labels": [7 * i % 100 for i in range(12)],
                                  b"coarse_labels": [0] * 12})  # fmt: skip
    write_pickle(root / "test", {b"data": cifar_rows(3, 50), b"fine_labels": [99, 0, 42], b"coarse_labels": [0] * 3})
    write_pickle(root / "meta", {b"fine_label_names": [f"f{k}".encode() for k in range(100)]})
    b = load("cifar100", data_dir=str(tmp_path), val_size=2)
    assert b.num_classes == 100 and b.class_names[42] == "f42" and b.test.labels.tolist() == [99, 0, 42]
    assert len(b.train) == 10 and b.test.images[2, 1, 0, 0] == 10 + 2 + 50


def test_svhn_mat(tmp_path):
    from scipy.io import savemat

    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (32, 32, 3, 9)).astype(np.uint8)
    y = np.array([[10], [1], [2], [3], [4], [5], [6], [7], [10]])
    savemat(tmp_path / "train_32x32.mat", {"X": x, "y": y})
    savemat(tmp_path / "test_32x32.mat", {"X": x[..., :4], "y": y[:4]})
    b = load("svhn", data_dir=str(tmp_path), val_size=3, seed=0)
    assert b.test.labels.tolist() == [0, 1, 2, 3], "label 10 means digit 0"
    assert torch.equal(b.test.images[2], torch.from_numpy(x[..., 2].transpose(2, 0, 1).copy()))
    assert len(b.train) == 6 and not b.hflip and b.class_names == [str(k) for k in range(10)]
    (tmp_path / "test_32x32.mat").write_bytes(b"MATLAB 5.0 MAT-file, garbage")
    with pytest.raises(ValueError, match="test_32x32.mat"):
        load("svhn", data_dir=str(tmp_path), val_size=3)


def test_svhn_file_checks_in_full(tmp_path):
    from scipy.io import savemat

    from calibkit.data.svhn import read_svhn_mat

    x = np.zeros((32, 32, 3, 4), np.uint8)
    y = np.array([[1], [2], [10], [3]])

    def mat(name, **arrays):
        path = str(tmp_path / name)
        savemat(path, arrays)
        return path

    assert read_svhn_mat(mat("ok.mat", X=x, y=y)).labels.tolist() == [1, 2, 0, 3]
    import calibkit.extras

    asked = []

    def require(*args):
        asked.append(args)
        raise RuntimeError("stop")

    with pytest.MonkeyPatch.context() as mp:  # scipy is an extra: named with what needs it
        mp.setattr(calibkit.extras, "require", require)
        with pytest.raises(RuntimeError, match="stop"):
            read_svhn_mat(str(tmp_path / "ok.mat"))
    assert asked == [("scipy", "reading SVHN")]
    with pytest.raises(FileNotFoundError, match=r"^SVHN file not found: .*none.mat; data_dir must contain "
                                                r"train_32x32.mat and test_32x32.mat$"):
        read_svhn_mat(str(tmp_path / "none.mat"))
    (tmp_path / "garbage.mat").write_bytes(b"MATLAB 5.0 MAT-file, garbage")
    with pytest.raises(ValueError, match=r"garbage.mat: not a readable MATLAB file \([A-Za-z]+Error: "):
        read_svhn_mat(str(tmp_path / "garbage.mat"))
    for name, arrays in (("noy.mat", {"X": x, "z": y}), ("nox.mat", {"y": y, "w": x})):
        found = sorted(arrays)
        with pytest.raises(ValueError, match=rf"{name}: expected variables X and y, found \{found}$".replace("'", "'")):
            read_svhn_mat(mat(name, **arrays))
    for name, bad in (("float.mat", x.astype(np.float32)), ("grey.mat", x[:, :, :1]), ("flat.mat", x[:, :, :, 0])):
        with pytest.raises(ValueError, match=rf"{name}: X must be uint8 \(H, W, 3, N\), got "):
            read_svhn_mat(mat(name, X=bad, y=y[:1] if bad.ndim == 3 else y))
    with pytest.raises(ValueError, match=r"count.mat: 4 images but 3 labels$"):
        read_svhn_mat(mat("count.mat", X=x, y=y[:3]))
    for lo_hi, labels in (("0..3", [[1], [0], [2], [3]]), ("1..11", [[1], [11], [2], [3]])):
        with pytest.raises(ValueError, match=rf"SVHN labels must lie in 1..10, found {lo_hi}$"):
            read_svhn_mat(mat("labels.mat", X=x, y=np.array(labels)))


# ------------------------------------------------------------------------ image files


def test_tinyimagenet_layout(tmp_path, monkeypatch):
    import calibkit.data.folders as folders

    monkeypatch.setattr(folders, "TINY_VAL_PER_CLASS", 2)  # the real protocol holds out 50 of 500
    wnids = ["n01", "n02", "n03"]
    (tmp_path / "wnids.txt").write_text("\n".join(wnids) + "\n")
    (tmp_path / "words.txt").write_text("n01\tgoldfish\nn02\tsalamander\n")
    for k, w in enumerate(wnids):
        d = tmp_path / "train" / w / "images"
        d.mkdir(parents=True)
        for i in range(12):  # flat colours survive JPEG compression almost exactly
            save_image(str(d / f"{w}_{i}.JPEG"), np.full((8, 8, 3), 40 * k + 10 * i, np.uint8))
    (tmp_path / "val" / "images").mkdir(parents=True)
    lines = []
    for j, k in enumerate([2, 0, 1, 2]):
        save_image(str(tmp_path / "val" / "images" / f"val_{j}.JPEG"), np.full((8, 8, 3), 200, np.uint8))
        lines.append(f"val_{j}.JPEG\t{wnids[k]}\t0\t0\t8\t8")
    (tmp_path / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    b = load("tinyimagenet", data_dir=str(tmp_path))
    assert (len(b.train), len(b.val), len(b.test)) == (30, 6, 4)
    assert b.test.labels.tolist() == [2, 0, 1, 2] and b.class_names == ["goldfish", "salamander", "n03"]
    # validation = the last 2 files of each class in natural name order (i = 10, 11, not 8, 9)
    assert b.val.labels.tolist() == [0, 0, 1, 1, 2, 2]
    vals = b.val.images[:, 0, 4, 4].int()
    assert ((vals - torch.tensor([100, 110, 140, 150, 180, 190])).abs() <= 2).all()
    assert b.train.images.shape[1:] == (3, 8, 8) and b.split["rule"] == "fixed by the protocol"
    with pytest.raises(ValueError, match="fixed validation split"):
        load("tinyimagenet", data_dir=str(tmp_path), val_size=10)


def test_imagefolder_flat_grey_and_bad_sizes(tmp_path):
    for k, cls in enumerate(["cat", "dog"]):
        (tmp_path / cls).mkdir()
        for i in range(10):
            save_image(str(tmp_path / cls / f"{i}.png"), np.full((6, 5), 100 * k + i, np.uint8))
    b = load("imagefolder", data_dir=str(tmp_path), val_size=2)
    assert (len(b.train), len(b.val), len(b.test)) == (14, 2, 4) and b.in_channels == 1
    assert b.class_names == ["cat", "dog"] and b.train.images.shape[1:] == (1, 6, 5)
    # PNG is lossless: pixel value 100*k + i identifies the file, so labels must match values
    for split in (b.train, b.val, b.test):
        assert torch.equal(split.labels, (split.images[:, 0, 0, 0] >= 100).long())
    save_image(str(tmp_path / "dog" / "odd.png"), np.zeros((7, 7), np.uint8))
    with pytest.raises(ValueError, match="odd.png.*7x7"):
        load("imagefolder", data_dir=str(tmp_path))


def test_imagefolder_train_test_rgb(tmp_path):
    for part, n in (("train", 6), ("test", 2)):
        for k, cls in enumerate(["a", "b", "c"]):
            (tmp_path / part / cls).mkdir(parents=True)
            for i in range(n):
                arr = np.zeros((4, 4, 3), np.uint8)
                arr[..., k] = 50 + i
                save_image(str(tmp_path / part / cls / f"{i}.png"), arr)
    b = load("imagefolder", data_dir=str(tmp_path), val_size=3)
    assert (len(b.train), len(b.val), len(b.test)) == (15, 3, 6) and b.in_channels == 3
    for split in (b.train, b.val, b.test):  # the non-zero channel is the class
        assert torch.equal(split.images[:, :, 0, 0].argmax(1), split.labels)


# ---------------------------------------------------------------------------- augmentation


def test_flip_is_exact_mirror(gen):
    x = torch.randint(0, 256, (64, 3, 5, 7), dtype=torch.uint8, generator=gen)
    out = augment(x, crop_pad=0, hflip=True, generator=gen)
    same = (out == x).flatten(1).all(1)
    mirrored = (out == x.flip(-1)).flatten(1).all(1)
    assert (same | mirrored).all() and same.any() and mirrored.any()
    assert out.dtype == torch.uint8 and out.shape == x.shape


def test_crop_keeps_content_shifted(gen):
    p = 2
    x = torch.randint(1, 256, (40, 1, 6, 6), dtype=torch.uint8, generator=gen)  # no zeros: padding is visible
    out = augment(x, crop_pad=p, hflip=False, generator=gen)
    padded = torch.nn.functional.pad(x, (p, p, p, p))
    seen = set()
    for n in range(x.shape[0]):
        matches = [(dy, dx) for dy in range(2 * p + 1) for dx in range(2 * p + 1)
                   if torch.equal(out[n], padded[n, :, dy:dy + 6, dx:dx + 6])]  # fmt: skip
        assert len(matches) == 1, "each output is exactly one shifted window of the zero-padded image"
        seen.add(matches[0])
    assert len(seen) > 10, "offsets are spread over the (2p+1)^2 possibilities"


def test_augment_is_seeded():
    x = torch.randint(0, 256, (16, 3, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    a = augment(x, 4, True, torch.Generator().manual_seed(7))
    b = augment(x, 4, True, torch.Generator().manual_seed(7))
    c = augment(x, 4, True, torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(augment(x, 0, False, None), x)
    with pytest.raises(ValueError, match="crop_pad"):
        augment(x, -1, True)


def test_normalize_values():
    x = torch.tensor([0, 51, 255], dtype=torch.uint8).reshape(1, 1, 1, 3).expand(1, 3, 1, 3).contiguous()
    mean, std = (0.5, 0.2, 0.0), (0.25, 0.5, 1.0)
    out = normalize(x, mean, std)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out[0, 0, 0], torch.tensor([-2.0, -1.2, 2.0]))
    torch.testing.assert_close(out[0, 2, 0], torch.tensor([0.0, 0.2, 1.0]))
    b = load("digits")
    z = normalize(b.train.images, b.mean, b.std)
    assert abs(z.mean().item()) < 1e-4 and z.std(unbiased=False).item() == pytest.approx(1.0, abs=1e-4)
    with pytest.raises(ValueError, match="uint8"):
        normalize(x.float(), mean, std)
    with pytest.raises(ValueError, match="channels"):
        normalize(x, (0.5,) * 2, (1.0,) * 2)


def test_resize_channels_and_size():
    x = torch.full((2, 1, 8, 8), 90, dtype=torch.uint8)
    y = resize(x, (28, 28), 3)
    assert y.shape == (2, 3, 28, 28) and (y == 90).all()
    rgb = torch.zeros(1, 3, 4, 4, dtype=torch.uint8)
    rgb[:, 1] = 200
    assert (resize(rgb, (4, 4), 1) == round(0.587 * 200)).all()


# ----------------------------------------------------------------------------- Mixup


def test_mixup_is_a_convex_combination_of_pairs(gen):
    n, k = 12, 5
    x = torch.arange(n, dtype=torch.float32).reshape(n, 1, 1, 1).expand(n, 2, 3, 3).contiguous()  # image i == i
    labels = torch.arange(n) % k
    x_mix, soft = mixup(x, labels, k, alpha=1.0, generator=gen)
    assert soft.shape == (n, k)
    torch.testing.assert_close(soft.sum(1), torch.ones(n))
    assert (soft >= 0).all()
    # recover t from a row whose partner has another label, then the partner of every row
    t = None
    for i in range(n):
        vals = soft[i][soft[i] > 0]
        if len(vals) == 2:
            t = float(soft[i, labels[i]])
            break
    assert t is not None and 0 < t < 1
    partners = ((x_mix[:, 0, 0, 0] - t * torch.arange(n)) / (1 - t)).round().long()
    assert sorted(partners.tolist()) == list(range(n)), "partners form a permutation"
    expect_x = t * x + (1 - t) * x[partners]
    torch.testing.assert_close(x_mix, expect_x)
    onehot = torch.nn.functional.one_hot(labels, k).float()
    torch.testing.assert_close(soft, t * onehot + (1 - t) * onehot[partners])


def test_mixup_alpha_controls_the_mixing_weight():
    # two images 1 and 0: when the permutation swaps them, x_mix[0] = t exactly
    x, labels = torch.tensor([1.0, 0.0]).reshape(2, 1, 1, 1), torch.tensor([0, 1])
    g = torch.Generator().manual_seed(0)
    weights = {}
    for alpha in (0.2, 20.0):
        ts = []
        for _ in range(300):
            x_mix, soft = mixup(x, labels, 2, alpha, g)
            if x_mix[1, 0, 0, 0] != 0 or x_mix[0, 0, 0, 0] != 1:  # swapped (identity leaves x unchanged)
                t = float(x_mix[0, 0, 0, 0])
                assert soft[0].tolist() == pytest.approx([t, 1 - t], abs=1e-6)  # float32
                ts.append(t)
        assert len(ts) > 100
        weights[alpha] = torch.tensor(ts)
    # Beta(20, 20) concentrates at 1/2 (sd 0.078); Beta(0.2, 0.2) at the ends
    assert (weights[20.0] - 0.5).abs().mean() < 0.1
    assert (weights[0.2] - 0.5).abs().mean() > 0.3


def test_mixup_cpu_draw_is_numpy_beta_of_a_seed_from_the_generator():
    # the CPU path (which fixes training results on the CPU): seed from the generator, then
    # NumPy's Beta; the permutation comes next from the same generator
    x = torch.randn(5, 1, 2, 2, generator=torch.Generator().manual_seed(3))
    labels = torch.tensor([0, 1, 2, 0, 1])
    x_mix, _ = mixup(x, labels, 3, 0.4, torch.Generator().manual_seed(9))
    g = torch.Generator().manual_seed(9)
    seed = int(torch.randint(0, 2**62, (1,), generator=g))
    t = float(np.random.default_rng(seed).beta(0.4, 0.4))
    perm = torch.randperm(5, generator=g)
    assert torch.equal(x_mix, t * x + (1 - t) * x[perm])


def test_beta_on_device_has_the_beta_moments_and_is_seeded():
    from calibkit.data.transforms import beta_on_device

    for alpha in (0.2, 2.0, 20.0):
        g = torch.Generator().manual_seed(1)
        t = torch.stack([beta_on_device(alpha, g) for _ in range(4000)])
        assert t.dtype == torch.float64 and ((t >= 0) & (t <= 1)).all() and torch.isfinite(t).all()
        # Beta(a, a): mean 1/2, variance 1 / (4 (2a + 1)); 4000 draws: mean sd <= 0.008
        assert abs(float(t.mean()) - 0.5) < 0.03
        var = 1 / (4 * (2 * alpha + 1))
        assert abs(float(t.var()) - var) < 0.1 * var
    a, b = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    assert float(beta_on_device(0.4, a)) == float(beta_on_device(0.4, b))


def test_mixup_label_check_is_skipped_only_under_trusted_inputs():
    from calibkit._validation import trusted_inputs

    x, bad = torch.zeros(2, 1, 2, 2), torch.tensor([0, 5])
    with pytest.raises(ValueError, match="labels out of range"):
        mixup(x, bad, 3, 0.4, torch.Generator().manual_seed(0))
    with trusted_inputs(), pytest.raises(ValueError, match="must have shape"):
        mixup(x, torch.tensor([0]), 3, 0.4, torch.Generator().manual_seed(0))  # shapes still checked


def test_regmixup_concatenates_clean_and_mixed():
    x = torch.randn(6, 3, 4, 4, generator=torch.Generator().manual_seed(2))
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    x_cat, soft = regmixup(x, labels, 3, 20.0, torch.Generator().manual_seed(5))
    x_mix, soft_mix = mixup(x, labels, 3, 20.0, torch.Generator().manual_seed(5))
    assert x_cat.shape == (12, 3, 4, 4) and soft.shape == (12, 3)
    assert torch.equal(x_cat[:6], x) and torch.equal(soft[:6], torch.nn.functional.one_hot(labels, 3).float())
    assert torch.equal(x_cat[6:], x_mix) and torch.equal(soft[6:], soft_mix)
    with pytest.raises(ValueError, match="normalize"):
        regmixup(x.to(torch.uint8), labels, 3)


def test_registry_entries_are_complete():
    for name, spec in DATASETS.items():
        assert callable(spec.read) and spec.crop_pad >= 0 and spec.how_to_get, name


# -------------------------------------------------------------------------------- OOD sets


def test_ood_digits_shaped_like_the_bundle(tmp_path):
    from calibkit.data import load_ood
    from calibkit.data.digits import digits_images

    fake_fmnist(tmp_path)
    fm = load("fmnist", data_dir=str(tmp_path), val_size=4)
    ood = load_ood("digits", like=fm)
    assert ood.shape == (1797, 1, 28, 28) and ood.dtype == torch.uint8
    assert torch.equal(ood, digits_images()[0]), "for 28x28 grey data the OOD set is the digits data set itself"
    fake_cifar10(tmp_path)
    c10 = load("cifar10", data_dir=str(tmp_path), val_size=4)
    ood3 = load_ood("digits", like=c10)
    assert ood3.shape == (1797, 3, 32, 32)
    assert torch.equal(ood3[:, 0], ood3[:, 1]) and torch.equal(ood3[:, 1], ood3[:, 2])
    # a data set's test split as OOD (Fashion-MNIST for CIFAR-10): resized, grey -> RGB
    assert load_ood("fmnist", like=c10, data_dir=str(tmp_path)).shape == (12, 3, 32, 32)
    noise = load_ood("noise", like=c10, seed=1)
    assert noise.shape[1:] == (3, 32, 32) and torch.equal(noise, load_ood("noise", like=c10, seed=1))
    with pytest.raises(ValueError, match="unknown OOD set"):
        load_ood("places", like=c10)
    with pytest.raises(ValueError, match="must differ"):
        load_ood("cifar10", like=c10, data_dir=str(tmp_path))


def test_a_process_reads_the_files_once_while_they_are_unchanged(tmp_path, monkeypatch):
    from calibkit.data import datasets as ds

    fake_fmnist(str(tmp_path), n_train=60, n_test=12, seed=0)
    reads = []
    real = ds.DATASETS["fmnist"].read
    monkeypatch.setitem(ds.DATASETS, "fmnist", dataclasses.replace(
        ds.DATASETS["fmnist"], read=lambda folder: reads.append(folder) or real(folder)))
    a = load("fmnist", data_dir=str(tmp_path), seed=0, val_size=10)
    b = load("fmnist", data_dir=str(tmp_path), seed=1, val_size=10)
    assert len(reads) == 1 and torch.equal(a.test.images, b.test.images)
    assert a.split["val_checksum"] != b.split["val_checksum"]  # the seeds still draw their own splits
    a.test.images.zero_()  # a caller editing its bundle in place does not edit what the next load gets
    c = load("fmnist", data_dir=str(tmp_path), seed=0, val_size=10)
    assert len(reads) == 1 and torch.equal(c.test.images, b.test.images) and c.test.images.any()
    arrays = fake_fmnist(str(tmp_path), n_train=60, n_test=14, seed=1)  # new files: read again
    d = load("fmnist", data_dir=str(tmp_path), seed=0, val_size=10)
    assert len(reads) == 2 and torch.equal(d.test.images[:, 0], torch.from_numpy(arrays["test_images"]).to(torch.uint8))


# --------------------------------------------------------------------------- load, in full


def fake_spec(raw, **kw):
    """A registry entry whose reader returns ``raw`` (no files), to drive ``load`` directly."""
    from calibkit.data.datasets import DatasetSpec

    fields = dict(read=lambda folder: raw, default_dir=None, needs_dir=False, val_size=2, hflip=True, crop_pad=3,
                  how_to_get="built for the test")
    return DatasetSpec(**{**fields, **kw})


def small_raw(n=8, k=2, val=None, **kw):
    from calibkit.data.bundle import RawData, Split

    images = torch.arange(n * 4, dtype=torch.int64).reshape(n, 1, 2, 2).to(torch.uint8)
    split = Split(images, torch.arange(n) % k)
    return RawData(train=split, test=Split(images[:3].clone(), torch.arange(3) % k),
                   class_names=[f"c{i}" for i in range(k)],
                   val=val, **kw)


@pytest.fixture
def fake(monkeypatch):
    from calibkit.data import datasets as ds

    def register(raw, **kw):
        monkeypatch.setitem(ds.DATASETS, "fake", fake_spec(raw, **kw))
        ds._RAW.clear()
        return "fake"
    yield register
    ds._RAW.clear()


def test_load_record_and_fields(fake):
    b = load(fake(small_raw()), seed=3)
    assert (b.name, b.num_classes, b.in_channels, b.hflip, b.crop_pad, b.data_dir, b.modality) == (
        "fake", 2, 1, True, 3, None, "image")
    assert b.class_names == ["c0", "c1"] and (len(b.train), len(b.val), len(b.test)) == (6, 2, 3)
    from calibkit.data.bundle import index_checksum

    _, val_idx = stratified_split(np.arange(8) % 2, 2, 3, stream=0)
    assert b.split == {"seed": 3, "rule": "class-stratified seeded draw from the official training split", "train": 6,
                       "val": 2, "test": 3, "train_subset": None, "val_checksum": index_checksum(val_idx),
                       "train_checksum": None}
    ref = b.train.images.double() / 255
    assert b.mean == pytest.approx([ref.mean().item()]) and b.std == pytest.approx([ref.std(unbiased=False).item()])
    whole = load("fake", seed=3, train_subset=6)  # a subset of the whole training split draws nothing
    assert whole.split["train_checksum"] is None and torch.equal(whole.train.images, b.train.images)
    text = load(fake(small_raw(modality="text", in_channels=50, vocab="V", record={"vocab_size": 50})))
    assert (text.mean, text.std, text.in_channels, text.vocab, text.modality) == ((), (), 50, "V", "text")
    assert text.split["vocab_size"] == 50


def test_load_fixed_validation_split(fake):
    import hashlib

    from calibkit.data.bundle import Split

    val = Split(torch.full((3, 1, 2, 2), 7, dtype=torch.uint8), torch.tensor([0, 1, 1]))
    name = fake(small_raw(val=val))
    b = load(name, val_size=3)
    h = hashlib.sha256(val.images.numpy().tobytes())
    h.update(np.array([0, 1, 1], dtype="<i8").tobytes())
    assert b.split["rule"] == "fixed by the protocol" and b.split["val_checksum"] == h.hexdigest()[:16]
    assert len(b.train) == 8 and torch.equal(b.val.images, val.images)
    b.train.images.zero_()  # the bundle holds copies: editing it leaves the next load intact
    assert load(name).train.images.any()
    with pytest.raises(ValueError, match=r"^fake has a fixed validation split of 3 images; got val_size=2$"):
        load(name, val_size=2)


def test_load_sizes_and_labels_in_full(fake):
    name = fake(small_raw(n=10))
    assert len(load(name, val_size=0.2).val) == 2 and len(load(name, val_size=4.0).val) == 4  # 4.0 is a count
    for bad in (1.5, -0.5):
        with pytest.raises(ValueError,
                           match=rf"^val_size must be an image count or a fraction in \(0, 1\), got {bad}$"):
            load(name, val_size=bad)
    with pytest.raises(ValueError, match=r"^train_subset: 1 images cannot hold one image of each of the 2 classes "
                                         r"of fake; use at least 2$"):
        load(name, train_subset=1)
    for bad in (0, 9):
        with pytest.raises(ValueError, match=rf"^train_subset must be in \[1, 8\] for fake, got {bad}$"):
            load(name, train_subset=bad)
    from calibkit.data.bundle import RawData, Split

    raw = small_raw(n=10)
    for part in ("train", "test"):
        labels = getattr(raw, part).labels.clone()
        labels[0] = 2  # a label of a third class the data set does not name
        bad_raw = RawData(**{**raw.__dict__, part: Split(getattr(raw, part).images, labels)})
        with pytest.raises(ValueError, match=rf"^fake {part}: label 2 >= 2 classes$"):
            load(fake(bad_raw), val_size=0 if part == "train" else None)


def test_a_validation_split_missing_classes_warns(fake):
    name = fake(small_raw(n=12, k=4))
    with pytest.warns(UserWarning) as caught:
        load(name, val_size=2)
    assert str(caught[0].message) == (
        "val_size: the validation split of 2 images holds no image of 2 of the 4 classes of fake; model selection "
        "and calibration see only the others (at least 4 images give every class one)")
    assert not caught[0].filename.endswith(os.path.join("calibkit", "data", "datasets.py"))  # points at a caller
    with pytest.warns(UserWarning, match="holds no image of 1 of the 3 classes"):  # one class missing is enough
        load(fake(small_raw(n=9, k=3)), val_size=2)


def test_load_refusals_in_full(tmp_path):
    from calibkit.data.datasets import DATASETS as REGISTRY

    with pytest.raises(ValueError, match="^"
                       + re.escape(f"unknown data set 'mnist-fashion'; choose one of {sorted(REGISTRY)}") + "$"):
        load("mnist-fashion")
    how = REGISTRY["cifar10"].how_to_get
    with pytest.raises(ValueError, match="^" + re.escape(f"data set 'cifar10' needs data_dir (--data-dir): {how}")
                       + "$"):
        load("cifar10")
    (tmp_path / "f.npz").write_bytes(b"")  # a path that exists, but of the other kind, is said to be one
    with pytest.raises(ValueError, match="^"
                       + re.escape(f"data set 'cifar10': {tmp_path / 'f.npz'} is a file, not a folder. {how}") + "$"):
        load("cifar10", data_dir=str(tmp_path / "f.npz"))
    with pytest.raises(FileNotFoundError, match="^"
                       + re.escape(f"data set 'cifar10': folder {tmp_path / 'gone'} does not exist. {how}") + "$"):
        load("cifar10", data_dir=str(tmp_path / "gone"))
    how = REGISTRY["tensors"].how_to_get
    with pytest.raises(ValueError, match="^"
                       + re.escape(f"data set 'tensors': {tmp_path} is a folder, not a file. {how}") + "$"):
        load("tensors", data_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="^"
                       + re.escape(f"data set 'tensors': file {tmp_path / 'gone.npz'} does not exist. {how}") + "$"):
        load("tensors", data_dir=str(tmp_path / "gone.npz"))


def test_folder_stamp(tmp_path):
    from calibkit.data.datasets import _folder_stamp

    (tmp_path / "b").write_text("12345")
    (tmp_path / "a").mkdir()
    st_a, st_b = os.stat(tmp_path / "a"), os.stat(tmp_path / "b")
    assert _folder_stamp(str(tmp_path)) == (("a", st_a.st_size, st_a.st_mtime_ns), ("b", 5, st_b.st_mtime_ns))
    assert _folder_stamp(str(tmp_path / "b")) == (5, st_b.st_mtime_ns)
    assert _folder_stamp(str(tmp_path / "missing")) is None and _folder_stamp(None) is None


def test_load_edges_of_the_sizes_and_modalities(fake):
    assert len(load(fake(small_raw(n=10)), train_subset=2).train) == 2  # as many images as classes
    assert len(load(fake(small_raw(n=10, k=1)), train_subset=1).train) == 1  # one image of a single class
    from calibkit.data.bundle import Split

    features = small_raw(n=10, modality="features")
    features.train = Split(torch.randn(10, 3), features.train.labels)
    features.test = Split(torch.randn(3, 3), features.test.labels)
    b = load(fake(features))
    assert (b.mean, b.std, b.in_channels, b.modality) == ((), (), 3, "features")
    val = Split(torch.zeros(2, 1, 2, 2, dtype=torch.uint8), torch.tensor([0, 2]))
    with pytest.raises(ValueError, match=r"^fake val: label 2 >= 2 classes$"):
        load(fake(small_raw(val=val)))


def test_the_cache_is_per_folder_and_hands_out_copies(fake, tmp_path):
    from calibkit.data.bundle import Split

    reads = []
    raw = small_raw(val=None)
    name = fake(raw, read=lambda folder: reads.append(folder) or raw)
    for d in ("a", "b"):  # two folders whose entries have the same names, sizes and times
        (tmp_path / d).mkdir()
        (tmp_path / d / "x").write_text("same")
        os.utime(tmp_path / d / "x", ns=(1_000_000_000, 1_000_000_000))
    load(name, data_dir=str(tmp_path / "a"))
    load(name, data_dir=str(tmp_path / "b"))
    assert reads == [str(tmp_path / "a"), str(tmp_path / "b")]
    b = load(name, data_dir=str(tmp_path / "b"))
    b.test.labels.fill_(1)  # a caller editing its bundle's labels in place does not edit the next load
    assert load(name, data_dir=str(tmp_path / "b")).test.labels.tolist() == [0, 1, 0] and len(reads) == 2
    fixed = Split(torch.full((2, 1, 2, 2), 5, dtype=torch.uint8), torch.tensor([0, 1]))
    name = fake(small_raw(val=fixed))
    load(name).val.images.zero_()
    assert (load(name).val.images == 5).all()


def test_own_data_without_a_test_example_or_a_second_class_is_refused(tmp_path):
    from PIL import Image

    def tensors(path, y_train, n_test):
        np.savez(path, x_train=np.zeros((len(y_train), 3), np.float32), y_train=np.asarray(y_train, np.int64),
                 x_test=np.zeros((n_test, 3), np.float32), y_test=np.zeros(n_test, np.int64))
        return str(path)

    path = tensors(tmp_path / "t.npz", [0, 1] * 5, 0)
    with pytest.raises(ValueError, match="^" + re.escape(f"{path}: x_test holds 0 rows; nothing to evaluate") + "$"):
        load("tensors", data_dir=path)
    path = tensors(tmp_path / "one.npz", [0] * 10, 2)
    with pytest.raises(ValueError, match="^" + re.escape(f"data set tensors ({path}): 1 class ('0'); a classifier to "
                                                         "calibrate needs at least 2 classes") + "$"):
        load("tensors", data_dir=path)
    for i in range(5):
        (tmp_path / "img" / "cats").mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((4, 4), i, np.uint8)).save(tmp_path / "img" / "cats" / f"{i}.png")
    with pytest.raises(ValueError, match=re.escape(": 1 class ('cats'); a classifier to calibrate needs at least 2")):
        load("imagefolder", data_dir=str(tmp_path / "img"))
