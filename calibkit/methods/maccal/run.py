"""MaC-Cal on run directories: a finished stage-1 run in, a standard MaC-Cal run directory out.

``run_maccal`` is what ``calibkit maccal``, ``calibkit train --method maccal`` and the benchmark
call; it computes the features once and fits a :class:`~calibkit.methods.maccal.MaCCal`.
``load_maccal`` rebuilds the deployed predictor of a saved run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import calibkit.data
from calibkit import rundir
from calibkit.data.inputs import inputs_from_info
from calibkit.errors import UserError
from calibkit.functional import ece
from calibkit.methods.maccal.estimator import MaCCal, extract_features
from calibkit.methods.maccal.masking import MC_SEED_OFFSET, check_int
from calibkit.methods.maccal.stage2 import DEFAULTS

__all__ = ["MACCAL_JSON", "RULE", "STAGE2_FILES", "run_maccal", "load_maccal", "stage1_run"]

MACCAL_JSON = "maccal.json"
# Files a stage-2 run writes, config.json last (an unfinished stage 2 may leave the others).
STAGE2_FILES = ("model.safetensors", "logits.safetensors", "history.json", MACCAL_JSON)
RULE = ("calibkit's own rule (the published MaC-Cal keep-rate rule is not public): after each stage-2 epoch, "
        "r <- clip(r - eta * (c - a), r_min, 1), with c = mean max-probability and a = accuracy of the deployed "
        "predictor on the validation split; the epoch with the lowest validation ECE of that predictor is kept")


def stage1_run(stage1_dir) -> tuple[Path, dict]:
    """Check that ``stage1_dir`` is a finished calibkit run; return its path and config.json."""
    path = Path(stage1_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"stage-1 run directory {path} not found; give a folder that `calibkit train --out` "
                                "wrote")
    if not (path / rundir.CONFIG).is_file():
        raise FileNotFoundError(f"stage-1: {path} is not a calibkit run directory (no {rundir.CONFIG})")
    info = rundir.load_info(path)
    if info.get("method") == "maccal":
        raise UserError(f"stage-1: {path} is itself a MaC-Cal run; pass the stage-1 run it was made from "
                         f"({info.get('stage1', {}).get('path')})")
    if info.get("status") != "done" or not (path / rundir.MODEL).is_file():
        raise UserError(f"stage-1: {path} is not a finished run (status {info.get('status')!r}); "
                         "finish training it first (run the same calibkit train command again)")
    return path, info


def _check_out(out: Path, stage1: Path) -> None:
    """``out`` must be new or empty; it may hold the stage-1 run itself as a subdirectory."""
    if out.resolve() == stage1.resolve():
        raise UserError(f"out: {out} is the stage-1 run itself; choose another directory")
    if out.exists() and not out.is_dir():
        raise UserError(f"out: {out} exists and is not a directory")
    others = [p for p in out.iterdir() if p.resolve() != stage1.resolve()] if out.exists() else []
    if others:
        raise UserError(f"out: {out} exists and is not empty; choose another directory "
                         "(a MaC-Cal run is never overwritten)")


def _device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _stage1_features(stage1: Path, info1: dict, data_dir, dev, batch_size: int | None):
    """The stage-1 model (frozen, on ``dev``), its data bundle and the train/val/test features."""
    model, cfg, _ = rundir.load_run(stage1)
    model.to(dev).eval().requires_grad_(False)
    if not isinstance(getattr(model, "head", None), nn.Linear) or not hasattr(model, "forward_features"):
        raise UserError(f"stage-1 model {cfg.model!r} has no linear `head` / `forward_features`")
    bundle = calibkit.data.load(cfg.data, data_dir=data_dir if data_dir is not None else cfg.data_dir,
                  seed=cfg.seed, val_size=cfg.val_size, train_subset=cfg.train_subset)
    want = info1.get("split", {}).get("val_checksum")
    if want and bundle.split.get("val_checksum") != want:
        raise UserError(f"stage-1: the validation split reloaded for {cfg.data} differs from the one of "
                         f"{stage1} (checksum {bundle.split.get('val_checksum')} != {want})")
    prepare = inputs_from_info(info1)  # the run's own evaluation input pipeline (e.g. image normalisation)

    def features(m, x):
        return m.forward_features(prepare.eval_batch(x))

    t0 = time.perf_counter()
    feats = {name: extract_features(model, (part.images, part.labels), features, batch_size=batch_size,
                                    device=dev)
             for name, part in (("train", bundle.train), ("val", bundle.val), ("test", bundle.test))}
    return model, cfg, bundle, feats, time.perf_counter() - t0


def _progress_logger(log: Callable[[str], None], epochs: int) -> Callable[[dict], None]:
    def progress(rec):
        head = "stage-1 head" if rec["epoch"] == 0 else f"epoch {rec['epoch']:>3}/{epochs}"
        loss = "" if rec["train_loss"] is None else f"  loss {rec['train_loss']:.4f}"
        log(f"{head}  r {rec['keep_rate']:.3f}{loss}  val acc {rec['val_acc']:.2%}  conf {rec['val_conf']:.2%}  "
            f"val ECE {100 * rec['val_ece']:.2f}  -> r {rec['next_keep_rate']:.3f}")
    return progress


def run_maccal(stage1_dir, out_dir, *, r_init: float = DEFAULTS["r_init"], eta: float = DEFAULTS["eta"],
               r_min: float = DEFAULTS["r_min"], epochs: int = DEFAULTS["epochs"], lr: float = DEFAULTS["lr"],
               momentum: float = DEFAULTS["momentum"], weight_decay: float = DEFAULTS["weight_decay"],
               batch_size: int = DEFAULTS["batch_size"], grad_clip: float | None = DEFAULTS["grad_clip"],
               n_bins: int = DEFAULTS["n_bins"], seed: int = DEFAULTS["seed"],
               mc_samples: int = DEFAULTS["mc_samples"], loss: str = "ce", data_dir: str | None = None,
               device: str = "auto", eval_batch_size: int | None = None,
               log: Callable[[str], None] | None = None) -> dict:
    """MaC-Cal stage 2 on a finished stage-1 run; writes a standard run directory ``out_dir``.

    Loads the stage-1 run (best-validation-accuracy weights), reloads its data split (the
    validation checksum must match), computes the train/val/test features once (eval mode, no
    augmentation), fits :class:`MaCCal` with these hyperparameters, and writes ``config.json``
    (last), ``model.safetensors`` (frozen backbone + selected head), ``logits.safetensors``
    (``log`` of the deployed predictor's probabilities, so ``softmax(stored logits)`` is the
    prediction; with ``mc_samples=0`` the plain head logits), ``history.json`` and
    ``maccal.json`` (rule, hyperparameters, keep-rate trajectory, timings). ``docs/maccal.md``
    lists every field.

    Args:
        stage1_dir: a finished ``calibkit train`` run (any loss or training method).
        out_dir: a new or empty directory (it may contain the stage-1 run as a subdirectory).
        r_init, ..., mc_samples: :class:`MaCCal` hyperparameters.
        loss: stage-2 loss spec (default ``"ce"``); ``"stage1"`` reuses the stage-1 run's loss.
        data_dir: where the data set is (default: the stage-1 run's ``data_dir``).
        device: ``auto`` (CUDA if available), ``cpu``, ``cuda`` or ``cuda:N``.
        eval_batch_size: inputs per forward pass when computing features (None: by device).
        log: callable receiving progress lines (default: silent).

    Returns:
        Summary: ``status``, ``out_dir``, ``best_epoch``, ``best_keep_rate``, ``keep_rates``,
        ``val_ece``, ``test_acc``, ``test_ece``, ``wall_time_s`` (stage-2 loop), ``feature_time_s``.
    """
    log = log or (lambda line: None)
    stage1, info1 = stage1_run(stage1_dir)
    out = Path(out_dir)
    _check_out(out, stage1)
    check_int(mc_samples, "mc_samples", 0)
    dev = _device(device)
    model, cfg, bundle, feats, feature_time = _stage1_features(stage1, info1, data_dir, dev, eval_batch_size)
    log(f"features: train {tuple(feats['train'][0].shape)}, val {len(feats['val'][1])}, "
        f"test {len(feats['test'][1])} in {feature_time:.1f}s")
    # Consistency of the cached features with stage 1: head(features) must reproduce its val logits.
    with torch.no_grad():
        stage1_diff = float((model.head(feats["val"][0].to(dev)).float().cpu()
                             - rundir.load_logits(stage1)["val_logits"].float()).abs().max())

    loss_spec = cfg.loss if loss == "stage1" else loss
    hparams: dict[str, Any] = {
        "r_init": r_init, "eta": eta, "r_min": r_min, "epochs": epochs, "lr": lr, "momentum": momentum,
        "weight_decay": weight_decay, "batch_size": batch_size, "grad_clip": grad_clip,
        "n_bins": n_bins, "seed": seed, "mc_samples": mc_samples}
    (train_x, train_y), (val_x, val_y) = feats["train"], feats["val"]
    est = MaCCal(model.head, loss=loss_spec, **hparams).fit(train_x, train_y, val_x, val_y,
                                                            progress=_progress_logger(log, epochs))
    t0 = time.perf_counter()
    with torch.no_grad():
        logits = {name: (est.predict_log_proba(feats[name][0]) if mc_samples else est.head_(
            feats[name][0].to(dev)).float()).cpu() for name in ("val", "test")}
    inference_time = time.perf_counter() - t0
    model.head.load_state_dict(est.head_.state_dict())
    y_test = feats["test"][1]
    test_acc = float((logits["test"].argmax(1) == y_test).double().mean())
    test_ece = float(ece(logits["test"].softmax(1), y_test, n_bins=n_bins))
    hist = est.history_
    record = _record(est, {**hparams, "loss": loss_spec},
                     {"feature_time_s": feature_time, "inference_time_s": inference_time,
                      "stage1_val_logits_max_abs_diff": stage1_diff})
    info = {**info1, **rundir.environment(),
            "config": {**info1["config"], "method": "maccal"}, "method": "maccal",
            "stage1": {"path": str(stage1.resolve()), "config": info1["config"],
                       "git_commit": info1.get("git_commit"), "best_epoch": info1.get("best_epoch"),
                       "wall_time_s": info1.get("wall_time_s")},
            "maccal": record["hparams"], "device": str(dev), "status": "done", "epochs_done": epochs,
            "best_epoch": est.best_epoch_, "best_val_acc": hist["records"][est.best_epoch_]["val_acc"],
            "test_acc": test_acc, "test_ece": test_ece, "wall_time_s": hist["wall_time_s"]}
    _write(out, model, {"val_logits": logits["val"], "val_labels": feats["val"][1],
                        "test_logits": logits["test"], "test_labels": y_test}, hist["records"], record, info)
    log(f"done: best epoch {est.best_epoch_} (r {est.keep_rate_:.3f}, val ECE {100 * hist['best_val_ece']:.2f}), "
        f"test acc {test_acc:.2%}, test ECE {100 * test_ece:.2f}, stage 2 {hist['wall_time_s']:.1f}s")
    return {"status": "done", "out_dir": str(out), "best_epoch": est.best_epoch_, "best_keep_rate": est.keep_rate_,
            "keep_rates": hist["keep_rates"], "val_ece": hist["best_val_ece"], "test_acc": test_acc,
            "test_ece": test_ece, "wall_time_s": hist["wall_time_s"], "feature_time_s": feature_time}


def _record(est: MaCCal, hparams: dict, extra: dict) -> dict:
    """The content of ``maccal.json`` for a fitted estimator."""
    hist, S = est.history_, hparams["mc_samples"]
    return {
        "rule": RULE,
        "hparams": hparams,
        "inference": (f"probabilities averaged over {S} masked heads at keep rate {est.keep_rate_} "
                      f"(masks from a CPU generator seeded with seed + {MC_SEED_OFFSET}); stored as their log"
                      if S else "the deterministic unmasked head (mc_samples = 0)"),
        "keep_rates": hist["keep_rates"],
        "val_ece": [rec["val_ece"] for rec in hist["records"][1:]],
        "stage1_val_ece": hist["records"][0]["unmasked_val_ece"],
        "best_epoch": est.best_epoch_, "best_keep_rate": est.keep_rate_, "best_val_ece": hist["best_val_ece"],
        "stage2_wall_time_s": hist["wall_time_s"], **extra,
    }


def _write(out: Path, model: nn.Module, logits: dict, history: list, record: dict, info: dict) -> None:
    """Write the run directory; ``config.json`` last (its status "done" marks a finished run)."""
    out.mkdir(parents=True, exist_ok=True)
    rundir.write_tensors(out / rundir.MODEL, model.state_dict())
    rundir.write_tensors(out / rundir.LOGITS, logits)
    rundir.write_json(out / rundir.HISTORY, history)
    rundir.write_json(out / MACCAL_JSON, record)
    rundir.write_json(out / rundir.CONFIG, info)


def load_maccal(run_dir) -> tuple[nn.Module, MaCCal]:
    """The model and the deployed predictor of a finished MaC-Cal run.

    Returns:
        ``(model, est)``: the network (backbone + selected head, eval mode, CPU) and a fitted
        :class:`MaCCal` whose ``predict_proba(features)`` reproduces the run's stored predictions
        for ``features = extract_features(model, inputs, ...)`` (same keep rate, masks and seed).
        ``est.history_`` holds the run's ``maccal.json``.
    """
    model, _, info = rundir.load_run(run_dir)
    if info.get("method") != "maccal" or not (Path(run_dir) / MACCAL_JSON).is_file():
        raise UserError(f"{run_dir} is not a MaC-Cal run (method {info.get('method')!r})")
    record = rundir.read_json(Path(run_dir) / MACCAL_JSON)
    hp = dict(record["hparams"])
    est = MaCCal(model.head, loss=hp.pop("loss"), **hp)
    est.head_ = model.head.requires_grad_(False)
    est.keep_rate_, est.best_epoch_, est.history_ = record["best_keep_rate"], record["best_epoch"], record
    est.n_classes_, est.n_features_in_ = model.head.weight.shape
    est.loss_ = None
    return model, est
