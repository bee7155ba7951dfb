"""The user's own data and model: the tensors data set, user OOD sets, module:factory models."""

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from calibkit.data import load, load_ood
from calibkit.data.inputs import inputs_for
from calibkit.models import resolve
from calibkit.models.custom import check_contract


def _write(path, **arrays):
    if str(path).endswith(".npz"):
        np.savez(path, **arrays)
    else:
        from safetensors.numpy import save_file

        save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(path))
    return str(path)


def _features(n, d=5, k=3, seed=0):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % k
    return (rng.normal(size=(n, d)) + y[:, None]).astype(np.float32), y.astype(np.int64)


@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_features_file_loads_as_stored(tmp_path, suffix):
    xtr, ytr = _features(30)
    xte, yte = _features(9, seed=1)
    path = _write(tmp_path / f"f{suffix}", x_train=xtr, y_train=ytr, x_test=xte, y_test=yte)
    b = load("tensors", data_dir=path, seed=0, val_size=6)
    assert ((b.modality, b.num_classes, b.in_channels, len(b.train), len(b.val), len(b.test))
            == ("features", 3, 5, 24, 6, 9))
    assert torch.equal(b.test.images, torch.from_numpy(xte)) and torch.equal(b.test.labels, torch.from_numpy(yte))
    # the validation and training splits are a partition of x_train (rows matched exactly)
    rows = {tuple(r) for r in xtr.tolist()}
    got = [tuple(r) for r in torch.cat([b.train.images, b.val.images]).tolist()]
    assert sorted(got) == sorted(rows) and len(set(got)) == 30
    x = inputs_for(b).train_batch(b.train.images[:4], b.train.labels[:4])[0]
    assert torch.equal(x, b.train.images[:4])  # features are used as stored


def test_images_tokens_and_a_fixed_validation_split(tmp_path):
    rng = np.random.default_rng(0)
    img = lambda n: rng.integers(0, 256, (n, 6, 7), dtype=np.uint8)  # noqa: E731  (N, H, W): one channel
    y = lambda n: np.arange(n) % 2  # noqa: E731
    path = _write(tmp_path / "i.npz", x_train=img(10), y_train=y(10), x_test=img(4), y_test=y(4),
                  x_val=img(4), y_val=y(4), class_names=np.array(["cat", "dog"]))
    b = load("tensors", data_dir=path)
    assert ((b.modality, b.in_channels, b.image_size, b.class_names, len(b.val))
            == ("image", 1, (6, 7), ["cat", "dog"], 4))
    assert b.split["rule"] == "fixed by the protocol" and len(b.mean) == 1
    ids = lambda n: rng.integers(0, 50, (n, 8)).astype(np.int32)  # noqa: E731
    path = _write(tmp_path / "t.npz", x_train=ids(10), y_train=y(10), x_test=ids(4), y_test=y(4))
    b = load("tensors", data_dir=path, val_size=2)
    vocab = 1 + max(int(s.images.max()) for s in (b.train, b.val, b.test))
    assert (b.modality, b.train.images.dtype, b.in_channels) == ("text", torch.int64, vocab)


@pytest.mark.parametrize("change, message", [
    ({"y_test": None}, "missing array(s) y_test"),
    ({"x_tset": np.zeros((2, 5), np.float32)}, "unknown array 'x_tset' (nearest valid name: x_test)"),
    ({"x_val": np.zeros((2, 5), np.float32)}, "give both x_val and y_val"),
    ({"y_train": np.arange(30) % 3 + 0.0}, "y_train: labels must be integers"),
    ({"y_train": np.arange(29) % 3}, "y_train: expected 30 labels"),
    ({"y_test": -np.ones(9, np.int64)}, "y_test: labels must be >= 0"),
    ({"y_test": np.full(9, 7)}, "y_test holds label 7, but y_train's classes run 0..2; every label of y_test must be "
                                "a class with examples in y_train"),
    ({"x_val": np.zeros((4, 5), np.float32), "y_val": np.array([0, 1, 2, 3])},
     "y_val holds label 3, but y_train's classes run 0..2"),
    ({"x_test": np.zeros((0, 5), np.float32), "y_test": np.zeros(0, np.int64)}, "x_test holds 0 rows; nothing to "
                                                                               "evaluate"),
    ({"x_val": np.zeros((0, 5), np.float32), "y_val": np.zeros(0, np.int64)}, "x_val holds 0 rows; give validation "
                                                                             "rows, or leave x_val and y_val out"),
    ({"x_test": np.zeros((9, 4), np.float32)}, "x_test: float32 (9, 4) does not match x_train's float32 (N, 5)"),
    ({"x_train": np.full((30, 5), np.nan, np.float32)}, "x_train: 30 example(s) hold NaN or infinite values"),
])
def test_a_bad_tensors_file_is_one_clear_error(tmp_path, change, message):
    xtr, ytr = _features(30)
    xte, yte = _features(9, seed=1)
    arrays = {"x_train": xtr, "y_train": ytr, "x_test": xte, "y_test": yte, **change}
    path = _write(tmp_path / "bad.npz", **{k: v for k, v in arrays.items() if v is not None})
    with pytest.raises(ValueError) as err:
        load("tensors", data_dir=path, val_size=3)
    assert message in str(err.value) and str(tmp_path) in str(err.value)
    with pytest.raises(FileNotFoundError, match="tensors.*file .*none.npz does not exist"):
        load("tensors", data_dir=str(tmp_path / "none.npz"))
    with pytest.raises(ValueError, match="ends in .npz or .safetensors"):
        (tmp_path / "a.txt").write_text("x")
        load("tensors", data_dir=str(tmp_path / "a.txt"))


def test_user_ood_sets(tmp_path):
    from PIL import Image

    xtr, ytr = _features(30)
    b = load("tensors", data_dir=_write(tmp_path / "f.npz", x_train=xtr, y_train=ytr, x_test=xtr[:6], y_test=ytr[:6]),
             val_size=3)
    ood = np.full((4, 5), 2.5, np.float32)
    assert torch.equal(load_ood(_write(tmp_path / "o.npz", x=ood), like=b), torch.from_numpy(ood))
    noise = load_ood("noise", like=b)  # Gaussian with the training split's per-feature mean and std
    mean, std = b.train.images.mean(0), b.train.images.std(0)
    assert noise.shape == (2000, 5) and torch.allclose(noise.mean(0), mean, atol=4 * float(std.max()) / 2000 ** 0.5)
    assert torch.allclose(noise.std(0), std, rtol=0.1)
    with pytest.raises(ValueError, match="shape \\(N, 4\\) differs from the data's \\(N, 5\\)"):
        load_ood(_write(tmp_path / "o4.npz", x=np.zeros((3, 4), np.float32)), like=b)
    with pytest.raises(ValueError, match="expected one array named x or x_ood or x_test"):
        load_ood(_write(tmp_path / "o5.npz", y=np.zeros(3)), like=b)
    with pytest.raises(ValueError, match="does not fit features inputs"):
        load_ood("digits", like=b)
    with pytest.raises(FileNotFoundError, match="no such folder or file"):
        load_ood(str(tmp_path / "missing"), like=b)
    with pytest.raises(ValueError, match="unknown OOD set .places.; choose one of"):
        load_ood("places", like=b)
    with pytest.raises(ValueError, match="there are no OOD inputs"):
        load_ood("none", like=b)
    # images: a folder with sub-folders, read in the data's channels and resized to its size
    imgs = load("digits")
    (tmp_path / "oodimg" / "a").mkdir(parents=True)
    Image.fromarray(np.full((10, 10, 3), 200, np.uint8)).save(tmp_path / "oodimg" / "x.png")
    Image.fromarray(np.full((10, 10, 3), 200, np.uint8)).save(tmp_path / "oodimg" / "a" / "y.png")
    got = load_ood(str(tmp_path / "oodimg"), like=imgs)
    assert got.shape == (2, 1, *imgs.image_size) and got.dtype == torch.uint8
    assert int(got.min()) == int(got.max()) == 200  # a constant grey image stays that grey after resizing


class _Good(nn.Module):
    def __init__(self, k, c):
        super().__init__()
        self.body, self.head = nn.Linear(c, 4), nn.Linear(4, k)

    def forward_features(self, x):
        return self.body(x)

    def forward(self, x):
        return self.head(self.forward_features(x))


def test_the_model_contract_names_what_is_missing(tmp_path, monkeypatch):
    x = torch.zeros(2, 5)
    check_contract(_Good(3, 5), x, 3)
    with pytest.raises(ValueError, match="head has 3 outputs, the data has 4 classes"):
        check_contract(_Good(3, 5), x, 4)
    no_feats = nn.Sequential(nn.Linear(5, 3))
    with pytest.raises(ValueError,
                       match="no forward_features.*; head must be an nn.Linear\\(D, 3\\) attribute, got none"):
        check_contract(no_feats, x, 3)

    class Twice(_Good):
        def forward(self, x):
            return 2 * super().forward(x)

    with pytest.raises(ValueError, match="differs from model.head\\(model.forward_features\\(x\\)\\)"):
        check_contract(Twice(3, 5), x, 3)
    with pytest.raises(ValueError, match="not a torch.nn.Module"):
        check_contract(object(), x, 3)
    # module:factory and file.py:factory
    (tmp_path / "usermods.py").write_text("from torch import nn\ndef net(num_classes, in_channels):\n"
                                         "    return nn.Linear(in_channels, num_classes)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert resolve("usermods:net")(3, 5).out_features == 3
    assert resolve(str(tmp_path / "usermods.py") + ":net")(2, 4).in_features == 4
    with pytest.raises(ValueError, match="has no callable 'nett'"):
        resolve("usermods:nett")
    with pytest.raises(ValueError, match="cannot import nomodule_xyz"):
        resolve("nomodule_xyz:net")
    with pytest.raises(ValueError, match="unknown model 'mpl' \\(nearest valid name: mlp\\)"):
        resolve("mpl")



@pytest.mark.parametrize("where,bad", [("features", float("nan")), ("features", float("inf")), ("head", float("nan"))])
def test_a_model_with_nan_or_infinite_outputs_is_named_as_such(where, bad):
    class Broken(_Good):
        def forward_features(self, x):
            h = super().forward_features(x)
            return h * bad if where == "features" else h

        def forward(self, x):
            out = super().forward(x)
            return out * bad if where == "head" else out

    which = "forward_features(x) and model(x)" if where == "features" else "model(x)"
    with pytest.raises(ValueError) as err:
        check_contract(Broken(3, 5), torch.ones(2, 5), 3, name="model 'mine:broken'")
    assert str(err.value) == (f"model 'mine:broken': the outputs are not finite: {which} hold NaN or infinite values "
                              "on 2 training inputs (torch.float32 (2, 5)); check the model's forward and its "
                              "initialisation")


def test_preflight_on_the_users_data(tmp_path):
    from calibkit.bench.grid import PRESETS
    from calibkit.bench.overrides import with_flags
    from calibkit.bench.preflight import check_bench

    xtr, ytr = _features(40)
    path = _write(tmp_path / "f.npz", x_train=xtr, y_train=ytr, x_test=xtr[:9], y_test=ytr[:9])
    preset = with_flags(PRESETS["default"], dataset="tensors")
    # what the file holds is read from its header, before the data are loaded
    with pytest.raises(ValueError, match="tensors holds features, not images: mixup, regmixup, csm mix or generate "
                                         "images; set modality = \"features\""):
        check_bench(with_flags(preset, batch_size=8), tmp_path / "out", data_dir=path)
    preset = dataclasses.replace(preset, modality="features")
    with pytest.raises(ValueError, match="batch_size 128 exceeds the 36 training images of tensors"):
        check_bench(preset, tmp_path / "out", data_dir=path)
    small = with_flags(preset, batch_size=8)  # the shipped MLP pools images: it cannot take (N, 5) features
    with pytest.raises(ValueError, match="model 'mlp': a forward pass on inputs torch.float32 \\(2, 5\\) failed"):
        check_bench(small, tmp_path / "out", data_dir=path)
    with pytest.raises(ValueError, match="unknown data set 'tensor' \\(nearest valid name: tensors\\)"):
        check_bench(with_flags(small, dataset="tensor"), tmp_path / "out", data_dir=path)
    assert not (tmp_path / "out").exists()
