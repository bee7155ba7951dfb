"""Text data sets for ``calibkit.data.load``: texts -> a fixed split -> a vocabulary -> token ids.

Both readers return a :class:`~calibkit.data.bundle.RawData` with ``modality="text"``: int64 token
ids ``(N, L)`` in every split, a validation split fixed by the data set's definition (per class, seed 0,
so every run and every seed of a bench sees the same validation and test documents), the
:class:`~calibkit.data.tokenizer.Vocabulary` built on the training split only, and a ``record``
that joins the run's split record (vocabulary checksum, for ``debian`` the index snapshot).
``in_channels`` of a text bundle is the vocabulary size (see :mod:`calibkit.models.text`).

=================  =====================================================================================
``debian``         Debian package descriptions by section (:mod:`calibkit.data.debian`): 18 classes,
                   at most 600 documents per class, 20% test, 10% validation, the rest training;
                   128 tokens; words seen at least twice in training, at most 20,000 entries.
``debian-minilm``  the ``debian`` documents and splits, tokenised for the pretrained ``minilm`` model by its
                   own WordPiece tokenizer (:mod:`calibkit.data.wordpiece`, 30,522 entries) instead of
                   calibkit's word vocabulary; 64 ids ([CLS] and [SEP] included).
``20newsgroups``   the ``20news-bydate`` archive (:mod:`calibkit.data.newsgroups`): its own train/test,
                   8% of each group's training messages for validation (~900, the size of the
                   MbLS validation split); 1,000 tokens and the 1,999 most frequent words (+ <pad>,
                   <unk>) as in the MbLS code.
=================  =====================================================================================
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from calibkit.errors import UserError

from . import debian, newsgroups
from .bundle import RawData, Split, index_checksum
from .tokenizer import Vocabulary
from .wordpiece import WordPieceTokenizer


@dataclass(frozen=True)
class TextSettings:
    """Split sizes and tokenizer settings of one text data set."""

    length: int
    min_count: int
    max_size: int | None
    val_frac: float  # fraction of each class for validation
    test_frac: float = 0.0  # fraction of each class for test (data sets without an official test split)
    cap: int | None = None  # documents kept per class at most
    tokenizer: str = "words"  # "words": a Vocabulary built on the training texts; "minilm": WordPiece


DEBIAN = TextSettings(length=128, min_count=2, max_size=20000, val_frac=0.1, test_frac=0.2, cap=600)
# debian-minilm: 64 WordPiece ids ([CLS] and [SEP] included) -- the short description and the start of
# the long one; a transformer's cost grows with the length, and 128 made a CPU epoch 2x longer.
MINILM_LENGTH = 64
NEWSGROUPS = TextSettings(length=1000, min_count=1, max_size=2001, val_frac=0.08)


def _take(texts, labels, index) -> tuple[list[str], list[int]]:
    return [texts[i] for i in index], [int(labels[i]) for i in index]


def encode_splits(train, val, test, class_names, settings: TextSettings, record: dict) -> RawData:
    """``(texts, labels)`` per split -> RawData of token ids, vocabulary built on ``train`` (or the
    pretrained tokenizer that ``settings.tokenizer`` names)."""
    vocab: Vocabulary | WordPieceTokenizer
    if settings.tokenizer == "minilm":
        vocab = WordPieceTokenizer(settings.length)
    else:
        vocab = Vocabulary.build(train[0], settings.length, settings.min_count, settings.max_size)

    def split(part):
        return Split(vocab.encode(part[0]), torch.tensor(part[1], dtype=torch.int64))

    record = {**record, "vocab_size": len(vocab), "vocab_checksum": vocab.checksum(), "length": settings.length}
    return RawData(train=split(train), test=split(test), val=split(val), class_names=list(class_names),
                   modality="text", in_channels=len(vocab), vocab=vocab, record=record)


def read_debian(data_dir: str | None = None, settings: TextSettings | None = None) -> RawData:
    """The ``debian`` data set from the package index in ``data_dir`` (default ``/var/lib/apt/lists``)."""
    folder = data_dir or debian.APT_LISTS
    docs, stats = debian.read_documents(folder, debian.SECTIONS)
    names = list(debian.SECTIONS)
    labels = np.array([names.index(d.section) for d in docs], dtype=np.int64)
    texts = [d.text for d in docs]
    s = settings or DEBIAN
    tr, va, te = debian.class_split(labels, len(names), s.test_frac, s.val_frac, s.cap)
    record = {"rule": f"per section (seed {debian.SPLIT_SEED}): at most {s.cap} documents, {s.test_frac:.0%} test, "
                      f"{s.val_frac:.0%} validation, the rest training",
              "snapshot": debian.snapshot(folder, docs), "documents": stats,
              "test_checksum": index_checksum(te)}
    return encode_splits(_take(texts, labels, tr), _take(texts, labels, va), _take(texts, labels, te), names, s, record)


def read_debian_minilm(data_dir: str | None = None) -> RawData:
    """The ``debian`` documents and splits in the token ids of the ``minilm`` model."""
    return read_debian(data_dir, dataclasses.replace(DEBIAN, tokenizer="minilm", length=MINILM_LENGTH))


def read_20newsgroups(data_dir: str | None = None) -> RawData:
    """The ``20newsgroups`` data set from the extracted ``20news-bydate`` archive in ``data_dir``."""
    if data_dir is None:
        raise UserError(f"20newsgroups needs data_dir: {newsgroups.HOW_TO_GET}")
    (texts, labels), test, groups = newsgroups.read_newsgroup_texts(data_dir)
    s = NEWSGROUPS
    tr, va, _ = debian.class_split(labels, len(groups), 0.0, s.val_frac)
    record = {"rule": f"official bydate train/test; {s.val_frac:.0%} of each group's training messages for "
                      f"validation (seed {debian.SPLIT_SEED})"}
    return encode_splits(_take(texts, labels, tr), _take(texts, labels, va), test, groups, s, record)


TEXT_OOD_SETS = ("debian-heldout", "noise")
OOD_LIMIT = 2000


def load_text_ood(name: str, like, data_dir: str | None = None, seed: int = 0) -> torch.Tensor:
    """Token ids (M, L) of an OOD text set, encoded with the in-distribution bundle's vocabulary.

    * ``"debian-heldout"``: package descriptions of sections that are no class
      (:data:`calibkit.data.debian.OOD_SECTIONS`), built like the ``debian`` documents; at most
      2,000 (a seeded subset). Read from ``data_dir`` when ``like`` is the ``debian`` set itself,
      else from the machine's index (``/var/lib/apt/lists``).
    * ``"noise"``: 2,000 texts of ``L`` uniformly random word ids (seeded), a sanity check.

    Args:
        name: one of :data:`TEXT_OOD_SETS`.
        like: a text ``DataBundle`` (its ``vocab`` and length are used).
        data_dir: where the ``debian`` index is, when ``like`` is ``debian``.
        seed: seed of the subset / of the noise.
    """
    vocab = like.vocab
    if vocab is None:
        raise UserError(f"{like.name}: a text OOD set needs the bundle's vocabulary")
    gen = np.random.default_rng(seed)
    if name == "noise":
        ids = gen.integers(2, len(vocab), size=(OOD_LIMIT, vocab.length)) if len(vocab) > 2 else None
        return torch.ones(OOD_LIMIT, vocab.length, dtype=torch.int64) if ids is None else torch.from_numpy(ids)
    if name != "debian-heldout":
        raise UserError(f"unknown text OOD set {name!r}; choose one of {', '.join(TEXT_OOD_SETS)}")
    folder = (data_dir if like.name in ("debian", "debian-minilm") else None) or debian.APT_LISTS
    docs, _ = debian.read_documents(folder, debian.OOD_SECTIONS)
    if not docs:
        raise UserError(f"{folder}: no package of the held-out sections {', '.join(debian.OOD_SECTIONS)}")
    texts = [d.text for d in docs]
    if len(texts) > OOD_LIMIT:
        keep = np.sort(gen.permutation(len(texts))[:OOD_LIMIT])
        texts = [texts[i] for i in keep]
    return vocab.encode(texts)
