"""The run directory: atomic writes, safe loading, and reading a finished run back.

Layout (see ``docs/design.md``): ``config.json``, ``model.safetensors``, ``checkpoint.pt``,
``logits.safetensors``, ``history.json`` and, after ``calibkit eval``, ``metrics.json``.

Every write goes to a temporary file in the same directory and is moved into place with
``os.replace``, so a run killed mid-write leaves the previous version intact, never half a file
(:func:`calibkit.diskio.atomic_write`, re-exported here with :class:`~calibkit.diskio.DiskFull`
and :func:`~calibkit.diskio.disk_full`).
Nothing is unpickled: checkpoints are read with ``torch.load(..., weights_only=True)`` and any
unreadable file raises ``ValueError`` naming it.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import safetensors
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

import calibkit
from calibkit.config import TrainConfig
from calibkit.data.inputs import ImageInputs, inputs_for, inputs_from_info
from calibkit.data.tokenizer import Vocabulary
from calibkit.data.wordpiece import KIND, WordPieceTokenizer
from calibkit.diskio import DiskFull as DiskFull  # re-exported: where callers have always found them
from calibkit.diskio import atomic_write
from calibkit.diskio import disk_full as disk_full
from calibkit.distributed import eval_batch_size
from calibkit.errors import UserError
from calibkit.models import resolve

CONFIG = "config.json"
MODEL = "model.safetensors"
CHECKPOINT = "checkpoint.pt"
LOGITS = "logits.safetensors"
HISTORY = "history.json"
VOCAB = "vocab.json"  # text runs: the vocabulary (calibkit.data.tokenizer.Vocabulary.to_dict)
METRICS = "metrics.json"
# A bench's own files around its runs (its database, who owns a directory, the records of a
# scheduler's attempts, paths recorded relative to the bench directory): calibkit.bench.paths.

def write_json(path, obj: Any) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=2, sort_keys=False)
            f.write("\n")

    atomic_write(path, write)


def read_json(path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found")
    try:
        with open(path) as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not valid JSON ({exc})") from exc


def write_tensors(path, tensors: dict[str, torch.Tensor]) -> None:
    """Save a flat dict of tensors as safetensors (contiguous CPU copies)."""
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    atomic_write(path, lambda tmp: save_file(tensors, tmp))


def read_tensors(path) -> dict[str, torch.Tensor]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise UserError(f"{path}: corrupt or truncated safetensors file ({exc})") from exc


def write_checkpoint(path, state: dict) -> None:
    atomic_write(path, lambda tmp: torch.save(state, tmp))


def read_checkpoint(path) -> dict:
    """Load a checkpoint with ``weights_only=True`` (tensors and plain Python types only)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises RuntimeError, EOFError, UnpicklingError, ... for bad files
        # torch's own text runs to several lines of advice about unpickling; one short reason is enough.
        reason = (str(exc).strip().splitlines() or [""])[0][:80]
        raise UserError(f"{path} is corrupt or truncated ({type(exc).__name__}: {reason}); {_RECOVER}") from exc
    if not isinstance(state, dict) or "epoch" not in state:
        raise UserError(f"{path} is not a calibkit checkpoint (no 'epoch' entry); {_RECOVER}")
    return state


_RECOVER = ("the run cannot resume from it: put back a good copy of that file (e.g. from a backup) and run "
            "the same command again, or start the run again with a new --out")


def environment() -> dict:
    """Git commit of the checkout (if any) and versions of the packages a result depends on."""
    root = Path(calibkit.__file__).resolve().parent.parent
    commit = dirty = None
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=root, capture_output=True, text=True, timeout=10, check=True,
            ).stdout.strip()
        )
    except (OSError, subprocess.SubprocessError):
        pass  # not a git checkout (installed package) or no git: recorded as null
    return {
        "git_commit": commit,
        "git_dirty": dirty,
        "versions": {
            "calibkit": calibkit.__version__,
            "python": platform.python_version(),
            "torch": torch.__version__,
            "numpy": np.__version__,
            "safetensors": safetensors.__version__,
        },
        "host": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads()},
    }


def _check_run_dir(run_dir) -> Path:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {run_dir} not found; give a folder that `calibkit train --out` wrote")
    if not (run_dir / CONFIG).is_file():
        raise FileNotFoundError(f"{run_dir} is not a calibkit run directory (no {CONFIG})")
    return run_dir


def load_info(run_dir) -> dict:
    """The parsed ``config.json`` of a run."""
    return read_json(_check_run_dir(run_dir) / CONFIG)


def load_vocab(run_dir):
    """The :class:`~calibkit.data.tokenizer.Vocabulary` (or, for ``debian-minilm`` runs, the
    :class:`~calibkit.data.wordpiece.WordPieceTokenizer`) of a text run (``vocab.json``), to encode new
    texts exactly as its training texts were: ``predict_logits(model, vocab.encode(texts), info)``."""
    path = _check_run_dir(run_dir) / VOCAB
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (only text runs have a vocabulary)")
    try:
        values = read_json(path)
        if values.get("kind") == KIND:  # the pretrained minilm tokenizer (calibkit[pretrained])
            return WordPieceTokenizer.from_dict(values)
        return Vocabulary.from_dict(values)
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"{path}: not a valid vocabulary ({exc})") from exc


def load_logits(run_dir) -> dict[str, torch.Tensor]:
    """``val_logits``, ``val_labels``, ``test_logits``, ``test_labels`` of a finished run."""
    run_dir = _check_run_dir(run_dir)
    path = run_dir / LOGITS
    if not path.is_file():
        status = load_info(run_dir).get("status")
        if status == "done":
            raise FileNotFoundError(
                f"{path} not found although the run finished (was it deleted?); run the same `calibkit train "
                f"... --out {run_dir}` again to recompute it from the saved checkpoint")
        raise FileNotFoundError(f"{path} not found (run status: {status}; finish training first: run the same "
                                f"`calibkit train ... --out {run_dir}` again to resume it)")
    out = read_tensors(path)
    missing = {"val_logits", "val_labels", "test_logits", "test_labels"} - set(out)
    if missing:
        raise UserError(f"{path}: missing entries {sorted(missing)}")
    return out


def load_run(run_dir):
    """Rebuild a trained model with its best-validation weights.

    Returns:
        ``(model, cfg, info)``: the model in eval mode on CPU, its :class:`calibkit.config.TrainConfig`,
        and the full ``config.json`` dict (split, ``num_classes``, ``in_channels``, mean/std, ...).
    """
    run_dir = _check_run_dir(run_dir)
    info = load_info(run_dir)
    cfg = TrainConfig.from_dict(info["config"])
    try:
        builder = resolve(cfg.model)
    except ValueError as exc:
        raise UserError(f"{run_dir / CONFIG}: {exc}") from None
    model = builder(num_classes=info["num_classes"], in_channels=info["in_channels"])
    path = run_dir / MODEL
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (run status: {info.get('status')})")
    try:
        model.load_state_dict(read_tensors(path))
    except RuntimeError as exc:
        raise UserError(f"{path}: weights do not match model {cfg.model!r} ({exc})") from exc
    return model.eval(), cfg, info


@torch.no_grad()
def predict_logits(model, images: torch.Tensor, norm, batch_size: int | None = None, device=None) -> torch.Tensor:
    """Logits of ``model`` (eval mode) for stored inputs, prepared exactly as in training.

    Args:
        model: a classifier; it is put in eval mode.
        images: the inputs as stored (uint8 images ``(N, C, H, W)``, or the modality's own form).
        norm: how inputs are prepared: an input pipeline (:mod:`calibkit.data.inputs`), a
            ``DataBundle``, a run's ``config.json`` dict, or a ``(mean, std)`` pair for images.
        batch_size: inputs per forward pass (None: by device, :func:`calibkit.distributed.eval_batch_size`).
        device: where to compute (default: the model's device).

    Returns:
        float32 logits ``(N, K)`` (or ``(N, K, ...)`` for dense models) on CPU.
    """
    if hasattr(norm, "eval_batch"):
        inputs = norm
    elif isinstance(norm, dict):
        inputs = inputs_from_info(norm)
    elif isinstance(norm, (tuple, list)):
        inputs = ImageInputs(*norm)
    else:
        inputs = inputs_for(norm, augment=False)
    if device is None:
        device = next(model.parameters()).device
    batch_size = eval_batch_size(device, batch_size)
    model.eval()
    out = [
        model(inputs.eval_batch(images[i : i + batch_size].to(device))).float().cpu()
        for i in range(0, len(images), batch_size)
    ]
    return torch.cat(out) if out else torch.empty(0, 0)
