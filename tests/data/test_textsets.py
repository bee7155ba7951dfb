"""calibkit.data.textsets: the split records of the text sets, the vocabulary settings, text OOD sets."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from calibkit.data import debian as D
from calibkit.data import textsets
from calibkit.data.bundle import index_checksum
from calibkit.data.textsets import TextSettings, encode_splits, load_text_ood, read_20newsgroups, read_debian
from calibkit.data.tokenizer import Vocabulary
from tests.helpers.text_index import write_synthetic_index


def test_encode_splits_keeps_the_settings_and_accepts_an_empty_part():
    settings = TextSettings(length=2, min_count=1, max_size=4, val_frac=0.1)
    train = (["b b b a a c", "a b"], [0, 1])
    raw = encode_splits(train, (["c"], [1]), ([], []), ["x", "y"], settings, {"rule": "r"})
    assert raw.vocab.itos == ["<pad>", "<unk>", "b", "a"]  # max_size 4: the two most frequent words
    assert raw.test.images.shape == (0, 2) and raw.test.labels.dtype == torch.int64
    assert raw.record == {"rule": "r", "vocab_size": 4, "vocab_checksum": raw.vocab.checksum(), "length": 2}


def test_the_debian_record_names_its_rule_documents_and_test_split(tmp_path, monkeypatch):
    folder = write_synthetic_index(tmp_path / "lists", per_section=6)  # every section, classes or not
    monkeypatch.setattr(D, "SECTIONS", ("games", "mail", "net"))  # the classes: three of them
    monkeypatch.setattr(textsets, "DEBIAN", TextSettings(length=8, min_count=1, max_size=50, val_frac=0.2,
                                                         test_frac=0.3, cap=10))
    raw = read_debian(str(folder))
    docs, stats = D.read_documents(folder, ("games", "mail", "net"))
    labels = np.array([("games", "mail", "net").index(d.section) for d in docs])
    _, _, te = D.class_split(labels, 3, 0.3, 0.2, 10)
    assert (raw.record["rule"]
            == "per section (seed 0): at most 10 documents, 30% test, 20% validation, the rest training")
    assert raw.record["documents"] == stats and stats["documents"] == 18
    assert raw.record["test_checksum"] == index_checksum(te) and len(raw.test) == len(te) == 6


def _bydate(root):
    for part, n in (("20news-bydate-train", 13), ("20news-bydate-test", 2)):
        for g in ("comp.a", "sci.b"):
            (root / part / g).mkdir(parents=True)
            for i in range(n):
                (root / part / g / str(100 + i)).write_text(f"Subject: s\n\nword{i} {g}\n")
    return root


def test_the_20newsgroups_record_and_its_missing_folder(tmp_path):
    raw = read_20newsgroups(str(_bydate(tmp_path)))
    assert raw.record["rule"] == ("official bydate train/test; 8% of each group's training messages for validation "
                                  "(seed 0)")
    assert (len(raw.train), len(raw.val), len(raw.test)) == (24, 2, 4)  # round(0.08 * 13) = 1 per group
    with pytest.raises(ValueError, match=r"^20newsgroups needs data_dir: pass --data-dir with the extracted "
                                         r"20news-bydate archive"):
        read_20newsgroups(None)


def _like(words, length=5, name="debian"):
    return SimpleNamespace(vocab=Vocabulary(words, length=length), name=name)


def test_text_noise_is_seeded_and_made_of_words():
    like = _like(["w1", "w2", "w3"])  # ids 2, 3, 4
    noise = load_text_ood("noise", like, seed=4)
    assert noise.shape == (2000, 5) and noise.dtype == torch.int64
    assert torch.equal(noise, torch.from_numpy(np.random.default_rng(4).integers(2, 5, size=(2000, 5))))
    assert torch.equal(load_text_ood("noise", like), load_text_ood("noise", like, None, 0)), "the default seed is 0"
    # one word: every id is that word; no word at all: every id is <unk> (1)
    assert torch.equal(load_text_ood("noise", _like(["w"])), torch.full((2000, 5), 2))
    empty = load_text_ood("noise", _like([], length=3))
    assert empty.dtype == torch.int64 and torch.equal(empty, torch.ones(2000, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"^toy: a text OOD set needs the bundle's vocabulary$"):
        load_text_ood("noise", SimpleNamespace(vocab=None, name="toy"))


def test_heldout_sections_come_from_the_data_sets_folder_or_the_machines(tmp_path, monkeypatch):
    ours = write_synthetic_index(tmp_path / "ours", per_section=3, seed=0)
    machine = write_synthetic_index(tmp_path / "machine", per_section=2, seed=1)
    monkeypatch.setattr(D, "APT_LISTS", str(machine))
    like = _like([f"tex{w}" for w in "abcdefghijkl"], length=16)
    assert len(load_text_ood("debian-heldout", like, str(ours))) == 3 * len(D.OOD_SECTIONS)
    # another data set's folder is not a package index: the held-out texts come from the machine's
    other = _like([f"tex{w}" for w in "abcdefghijkl"], length=16, name="20newsgroups")
    assert len(load_text_ood("debian-heldout", other, str(ours))) == 2 * len(D.OOD_SECTIONS)
    # at most OOD_LIMIT texts: a seeded subset, in package-name order
    monkeypatch.setattr(textsets, "OOD_LIMIT", 5)
    docs, _ = D.read_documents(ours, D.OOD_SECTIONS)
    keep = sorted(np.random.default_rng(7).permutation(len(docs))[:5].tolist())
    got = load_text_ood("debian-heldout", like, str(ours), seed=7)
    assert torch.equal(got, like.vocab.encode([docs[i].text for i in keep]))


def test_an_index_without_heldout_sections_is_one_clear_error(tmp_path, monkeypatch):
    folder = write_synthetic_index(tmp_path / "lists", per_section=2)
    monkeypatch.setattr(D, "OOD_SECTIONS", ("nosuchsection", "another"))
    with pytest.raises(ValueError, match=rf"^{folder}: no package of the held-out sections nosuchsection, another$"):
        load_text_ood("debian-heldout", _like(["a"]), str(folder))
