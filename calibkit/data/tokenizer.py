"""calibkit's word tokenizer and vocabulary: text -> fixed-length int64 token ids.

Deliberately simple and fully determined by its settings and the training texts, so that a run
records everything needed to rebuild its inputs (``Vocabulary.to_dict``, saved as ``vocab.json``
in the run directory):

1. **Tokens**: the text is lower-cased (``str.lower``) and split into words with
   :data:`WORD_PATTERN` -- maximal runs of letters and digits (any script), optionally joined by
   internal apostrophes (``don't``, ``o'reilly``); everything else (punctuation, ``_``, symbols)
   separates words. ``"GNU's C++ compiler, v2.0!"`` -> ``["gnu's", "c", "compiler", "v2", "0"]``.
2. **Vocabulary** (built on the training texts only): every word occurring at least ``min_count``
   times, most frequent first, ties broken alphabetically (so the order is deterministic), cut to
   ``max_size`` entries in total. Id 0 is ``<pad>``, id 1 is ``<unk>`` (any other word).
3. **Encoding**: the first ``length`` token ids of a text (longer texts are truncated at the end);
   shorter texts are padded with ``<pad>`` (0) at the end. Output: int64 ``(N, length)``.

This is the same kind of preprocessing as the Keras ``Tokenizer`` + ``pad_sequences`` pipeline of
the MbLS text experiment (lower-case, punctuation-split words, the most frequent words only), with
two documented differences: calibkit maps rare words to ``<unk>`` instead of dropping them, and
it pads and truncates at the end (Keras's default is at the front).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence

import torch

from calibkit.errors import UserError

WORD_PATTERN = r"[^\W_]+(?:'[^\W_]+)*"
PAD, UNK = "<pad>", "<unk>"
_WORD = re.compile(WORD_PATTERN)


def tokenize(text: str) -> list[str]:
    """Lower-cased words of ``text`` (see the module docstring)."""
    return _WORD.findall(text.lower())


class Vocabulary:
    """A word -> id table with ``<pad>`` = 0 and ``<unk>`` = 1, and a fixed encoding length.

    Args:
        tokens: the words of ids 2, 3, ... (without ``<pad>``/``<unk>``); no duplicates.
        length: L, the number of ids per encoded text.
        min_count, max_size: the settings it was built with (recorded, not re-applied).

    Attributes:
        itos: every entry, ``itos[i]`` is the word of id i (``itos[0] == "<pad>"``).
    """

    def __init__(self, tokens: Sequence[str], length: int, min_count: int = 1, max_size: int | None = None):
        if int(length) < 1:
            raise UserError(f"length must be >= 1, got {length}")
        tokens = list(tokens)
        if len(set(tokens)) != len(tokens) or PAD in tokens or UNK in tokens:
            raise UserError("tokens must be distinct and must not contain <pad> or <unk>")
        self.itos = [PAD, UNK, *tokens]
        self.stoi = {w: i for i, w in enumerate(self.itos)}
        self.length = int(length)
        self.min_count = int(min_count)
        self.max_size = None if max_size is None else int(max_size)

    @classmethod
    def build(cls, texts: Iterable[str], length: int, min_count: int = 2, max_size: int | None = 20000) -> Vocabulary:
        """The vocabulary of ``texts`` (the training split): words seen >= ``min_count`` times.

        Args:
            texts: the training texts.
            length: L of :meth:`encode`.
            min_count: minimum number of occurrences (over all texts) of a kept word.
            max_size: total entries including ``<pad>`` and ``<unk>`` (None: no limit); the most
                frequent words are kept, ties in alphabetical order.
        """
        if int(min_count) < 1:
            raise UserError(f"min_count must be >= 1, got {min_count}")
        if max_size is not None and int(max_size) < 3:
            raise UserError(f"max_size must be >= 3 (<pad>, <unk> and one word), got {max_size}")
        counts = Counter(w for t in texts for w in tokenize(t))
        words = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
        if max_size is not None:
            words = words[: int(max_size) - 2]
        return cls(words, length, min_count, max_size)

    def __len__(self) -> int:
        return len(self.itos)

    def ids(self, text: str) -> list[int]:
        """All token ids of one text (no padding or truncation)."""
        return [self.stoi.get(w, 1) for w in tokenize(text)]

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        """int64 ``(N, length)``: the first ``length`` ids of each text, ``<pad>`` (0) after it."""
        out = torch.zeros(len(texts), self.length, dtype=torch.int64)
        for i, text in enumerate(texts):
            ids = self.ids(text)[: self.length]
            if ids:
                out[i, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
        return out

    def decode(self, ids: Sequence[int]) -> str:
        """The words of ``ids`` joined by spaces, padding left out (for inspection)."""
        return " ".join(self.itos[int(i)] for i in ids if int(i) != 0)

    def to_dict(self) -> dict:
        """JSON-ready: everything :meth:`from_dict` needs (the word list and the settings)."""
        return {"kind": "calibkit-words", "pattern": WORD_PATTERN, "lowercase": True, "length": self.length,
                "min_count": self.min_count, "max_size": self.max_size, "itos": list(self.itos)}

    @classmethod
    def from_dict(cls, d: dict) -> Vocabulary:
        """Rebuild from :meth:`to_dict` output; a file of another tokenizer is refused."""
        if d.get("kind") != "calibkit-words" or d.get("pattern") != WORD_PATTERN:
            raise UserError("vocabulary: not a calibkit word vocabulary (kind or word pattern differs)")
        itos = d.get("itos") or []
        if itos[:2] != [PAD, UNK]:
            raise UserError("vocabulary: ids 0 and 1 must be <pad> and <unk>")
        return cls(itos[2:], d["length"], d.get("min_count", 1), d.get("max_size"))

    def checksum(self) -> str:
        """Short SHA-256 of :meth:`to_dict`: equal checksums mean identical encodings."""
        blob = json.dumps(self.to_dict(), sort_keys=True, ensure_ascii=False).encode("utf-8")
        return hashlib.sha256(blob).hexdigest()[:16]

    def __eq__(self, other) -> bool:
        return isinstance(other, Vocabulary) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"Vocabulary({len(self)} entries, length={self.length}, min_count={self.min_count})"
