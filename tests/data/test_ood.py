"""calibkit.data.ood: which loader each OOD name and modality reaches, seeds, bounds and messages."""

import warnings

import numpy as np
import pytest
import torch

from calibkit.data import load_ood
from calibkit.data.bundle import DataBundle, Split
from calibkit.data.textsets import load_text_ood
from calibkit.data.tokenizer import Vocabulary
from tests.helpers.formats import fake_fmnist


def _bundle(inputs, modality="image", in_channels=None, vocab=None, name="mine"):
    n = inputs.shape[0]
    split = Split(inputs, torch.arange(n) % 2)
    c = in_channels if in_channels is not None else int(inputs.shape[1])
    return DataBundle(name=name, train=split, val=split, test=split, num_classes=2, in_channels=c, mean=(),
                      std=(), hflip=False, crop_pad=0, class_names=["a", "b"], modality=modality, vocab=vocab)


def _images(n=6, c=1, h=4, w=5):
    return torch.randint(0, 256, (n, c, h, w), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))


def test_none_is_refused_with_its_reason():
    with pytest.raises(ValueError, match=r"^OOD set 'none': there are no OOD inputs to load \(the bench skips OOD "
                                         r"detection\)$"):
        load_ood("none", like=_bundle(_images()))


def test_image_noise_is_seeded_uniform_over_0_to_255():
    b = _bundle(_images(c=1, h=4, w=4))
    noise = load_ood("noise", like=b)
    assert noise.shape == (2000, 1, 4, 4) and noise.dtype == torch.uint8
    # 32,000 uniform draws from 0..255 reach both ends (the chance of missing one is below 1e-50)
    assert int(noise.min()) == 0 and int(noise.max()) == 255
    assert torch.equal(noise, load_ood("noise", like=b, seed=0)), "the default seed is 0"
    assert not torch.equal(noise, load_ood("noise", like=b, seed=1))


def test_only_one_or_three_channels_have_an_ood_image_set():
    b = _bundle(_images(c=2))
    with pytest.raises(ValueError, match=r"^OOD sets are made for 1- or 3-channel data, the bundle has 2 channels$"):
        load_ood("digits", like=b)


def test_features_without_a_vocabulary_get_gaussian_noise_seeded():
    x = torch.randn(50, 3, generator=torch.Generator().manual_seed(0)) * torch.tensor([1.0, 2.0, 0.5]) + 4
    b = _bundle(x, modality="features")
    noise = load_ood("noise", like=b, seed=3)
    assert noise.shape == (2000, 3) and noise.dtype == torch.float32  # features, not uint8 images
    mean, std = x.mean(0), x.std(0)
    assert torch.allclose(noise.mean(0), mean, atol=float(4 * std.max() / 2000 ** 0.5))
    assert torch.allclose(noise.std(0), std, rtol=0.1)
    assert torch.equal(noise, load_ood("noise", like=b, seed=3))
    assert not torch.equal(noise, load_ood("noise", like=b)), "the seed reaches the user-set loader"
    assert torch.equal(load_ood("noise", like=b), load_ood("noise", like=b, seed=0))


def test_token_ids_without_a_vocabulary_get_uniform_ids_of_their_length():
    ids = torch.randint(0, 7, (20, 9), generator=torch.Generator().manual_seed(0))
    b = _bundle(ids, modality="text", in_channels=7)  # the tensors data set: ids, no calibkit vocabulary
    noise = load_ood("noise", like=b, seed=5)
    assert noise.shape == (2000, 9) and noise.dtype == torch.int64
    assert int(noise.min()) == 0 and int(noise.max()) == 6  # every id of the data's 7, none beyond
    assert torch.equal(noise, load_ood("noise", like=b, seed=5))
    assert not torch.equal(noise, load_ood("noise", like=b, seed=0))


def test_text_with_a_vocabulary_gets_its_text_sets_with_the_seed():
    vocab = Vocabulary(["w1", "w2", "w3", "w4", "w5"], length=6)  # 7 ids: <pad>, <unk> and five words
    b = _bundle(vocab.encode(["w1 w2", "w3 w4 w5", "w1", "w5 w5"]), modality="text", in_channels=len(vocab),
                vocab=vocab)
    noise = load_ood("noise", like=b, seed=3)
    assert torch.equal(noise, load_text_ood("noise", b, None, 3)) and noise.shape == (2000, 6)
    assert int(noise.min()) == 2 and int(noise.max()) == 6  # words only: no <pad>, no <unk>
    assert torch.equal(noise, load_ood("noise", like=b, seed=3))
    assert not torch.equal(noise, load_ood("noise", like=b, seed=0))
    assert torch.equal(load_ood("noise", like=b), load_ood("noise", like=b, seed=0))
    with pytest.raises(ValueError, match="unknown text OOD set 'digits'"):
        load_ood("digits", like=b)


def test_the_users_folder_is_read_for_image_data(tmp_path):
    from PIL import Image

    (tmp_path / "ood" / "sub").mkdir(parents=True)
    Image.fromarray(np.full((8, 8), 90, np.uint8)).save(tmp_path / "ood" / "a.png")
    Image.fromarray(np.full((8, 8), 30, np.uint8)).save(tmp_path / "ood" / "sub" / "b.png")
    got = load_ood(str(tmp_path / "ood"), like=_bundle(_images(c=1, h=4, w=5)))
    assert got.shape == (2, 1, 4, 5) and sorted(got[:, 0, 0, 0].tolist()) == [30, 90]


def test_a_data_sets_test_split_is_loaded_without_holding_out_a_validation_split(tmp_path):
    arrays = fake_fmnist(str(tmp_path), n_train=40, n_test=12)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a drawn validation split (val_size > 0) would warn about missing classes
        got = load_ood("fmnist", like=_bundle(_images(c=1, h=28, w=28)), data_dir=str(tmp_path))
    assert torch.equal(got[:, 0], torch.from_numpy(arrays["test_images"].astype(np.uint8)))


def _tinyimagenet(root):
    from PIL import Image

    (root / "wnids.txt").write_text("n01\nn02\n")
    (root / "words.txt").write_text("n01\tgoldfish\nn02\tsalamander\n")
    for k, w in enumerate(["n01", "n02"]):
        d = root / "train" / w / "images"
        d.mkdir(parents=True)
        for i in range(4):
            Image.fromarray(np.full((8, 8, 3), 40 * k + 10 * i, np.uint8)).save(d / f"{w}_{i}.JPEG")
    (root / "val" / "images").mkdir(parents=True)
    lines = []
    for j in range(3):  # flat colours survive JPEG compression almost exactly
        Image.fromarray(np.full((8, 8, 3), 200 + 20 * j, np.uint8)).save(root / "val" / "images" / f"val_{j}.JPEG")
        lines.append(f"val_{j}.JPEG\tn0{1 + j % 2}\t0\t0\t8\t8")
    (root / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")


def test_a_data_set_with_a_fixed_validation_split_keeps_it(tmp_path, monkeypatch):
    import calibkit.data.folders as folders

    monkeypatch.setattr(folders, "TINY_VAL_PER_CLASS", 1)  # the protocol's split; val_size=0 is refused
    _tinyimagenet(tmp_path)
    got = load_ood("tinyimagenet", like=_bundle(_images(c=1, h=4, w=4)), data_dir=str(tmp_path))
    assert got.shape == (3, 1, 4, 4)  # the 3 test images, grey and resized
    assert ((got[:, 0, 2, 2].int() - torch.tensor([200, 220, 240])).abs() <= 3).all()


def test_the_text_set_on_image_data_names_the_choices():
    with pytest.raises(ValueError) as err:
        load_ood("debian-heldout", like=_bundle(_images()))
    msg = str(err.value)
    assert msg.startswith("OOD set 'debian-heldout' is made of texts, the mine data are images; choose one of [")
    for choice in ("'digits'", "'noise'", "'none'", "'fmnist'", "'cifar10'", "'tinyimagenet'"):
        assert choice in msg, choice
