"""The ``debian-minilm`` data set: the ``debian`` documents and splits in the minilm tokenizer's ids."""

import numpy as np
import torch

from calibkit.data import debian as D
from calibkit.data import load, textsets
from calibkit.data.textsets import TextSettings, read_debian, read_debian_minilm
from tests.helpers.text_index import write_synthetic_index
from tests.models.pretrained_skip import needs_minilm

SECTIONS = ("games", "mail", "net")


@needs_minilm
def test_same_documents_and_splits_in_wordpiece_ids(tmp_path, monkeypatch):
    from calibkit.data.wordpiece import WordPieceTokenizer

    folder = write_synthetic_index(tmp_path / "lists", per_section=6)
    monkeypatch.setattr(D, "SECTIONS", SECTIONS)
    monkeypatch.setattr(textsets, "DEBIAN", TextSettings(length=16, min_count=1, max_size=50, val_frac=0.2,
                                                         test_frac=0.3, cap=10))
    words, pieces = read_debian(str(folder)), read_debian_minilm(str(folder))
    for part in ("train", "val", "test"):
        assert torch.equal(getattr(words, part).labels, getattr(pieces, part).labels)
    # the test documents, rebuilt independently of textsets, encoded by the tokenizer itself
    docs, _ = D.read_documents(folder, SECTIONS)
    labels = np.array([SECTIONS.index(d.section) for d in docs])
    _, _, te = D.class_split(labels, 3, 0.3, 0.2, 10)
    want = WordPieceTokenizer(64).encode([docs[i].text for i in te])  # debian-minilm: 64 ids
    assert torch.equal(pieces.test.images, want)
    assert pieces.in_channels == 30522 and pieces.modality == "text"
    assert pieces.record["vocab_checksum"] == WordPieceTokenizer(64).checksum()
    assert pieces.record["test_checksum"] == words.record["test_checksum"]


@needs_minilm
def test_load_gives_a_bundle_the_minilm_model_takes(tmp_path, monkeypatch):
    from calibkit.models import build

    folder = write_synthetic_index(tmp_path / "lists", per_section=12)
    monkeypatch.setattr(D, "SECTIONS", SECTIONS)
    bundle = load("debian-minilm", data_dir=str(folder))
    assert bundle.vocab.length == 64 and bundle.train.images.shape[1] == 64
    model = build("minilm", num_classes=bundle.num_classes, in_channels=bundle.in_channels).eval()
    with torch.no_grad():
        assert model(bundle.val.images[:2]).shape == (2, 3)
