"""``calibkit maccal STAGE1_DIR --out DIR``: MaC-Cal stage 2 on a finished run; and the two-stage
``calibkit train --method maccal`` (stage 1 into ``DIR/stage1``, then stage 2 into ``DIR``)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

import calibkit.methods.maccal
import calibkit.train
from calibkit import rundir
from calibkit.errors import UserError
from calibkit.methods.maccal import DEFAULTS
from calibkit.methods.maccal.run import STAGE2_FILES


def set_threads(n: int | None) -> None:
    if n is not None:
        if n < 1:
            raise UserError(f"--num-threads must be >= 1, got {n}")

        torch.set_num_threads(n)


def run(args) -> int:
    set_threads(args.num_threads)
    log = (lambda line: None) if args.quiet else (lambda line: print(line, flush=True))
    summary = calibkit.methods.maccal.run_maccal(
        args.stage1, args.out, r_init=args.r_init, eta=args.eta, r_min=args.r_min, epochs=args.epochs,
        lr=args.lr, batch_size=args.batch_size, weight_decay=args.weight_decay, loss=args.loss,
        seed=args.seed, mc_samples=args.mc_samples, data_dir=args.data_dir, device=args.device, log=log)
    print(_result_line(summary), flush=True)
    return 0 if summary["status"] == "done" else 1


def _result_line(summary: dict) -> str:
    return (f"MaC-Cal run written to {summary['out_dir']} (best epoch {summary['best_epoch']}, keep rate "
            f"{summary['best_keep_rate']:.3f}, test acc {summary['test_acc']:.2%}, "
            f"test ECE {100 * summary['test_ece']:.2f})")


# --- calibkit train --method maccal ----------------------------------------------------------------
STAGE1_SUBDIR = "stage1"


def parse_stage2_spec(text: str | None) -> dict:
    """``"eta=2,mc_samples=64,loss=stage1"`` -> ``{"eta": 2.0, "mc_samples": 64, "loss": "stage1"}``.

    Keys: the ``run_maccal`` hyperparameters (``DEFAULTS``, named as there, plus ``loss``); values
    take the type of the default. ``None`` or ``""`` gives ``{}``.
    """
    out: dict = {}
    for item in filter(None, (s.strip() for s in (text or "").split(","))):
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not value.strip():
            raise UserError(f"--maccal: expected KEY=VALUE, got {item!r}")
        if key == "loss":
            out[key] = value.strip()
            continue
        if key not in DEFAULTS:
            raise UserError(f"--maccal: unknown key {key!r}; valid: {', '.join([*DEFAULTS, 'loss'])}")
        kind = type(DEFAULTS[key])
        try:
            out[key] = kind(value) if kind is float else int(value)
        except ValueError:
            raise UserError(f"--maccal: {key} expects {kind.__name__}, got {value!r}") from None
    return out


def train_two_stage(cfg, out_dir, stage2: dict, progress: bool = True, verbose: bool = True) -> dict:
    """Stage 1 (``calibkit.train.train`` with ``cfg``) into ``OUT/stage1``, then MaC-Cal stage 2
    into ``OUT``. Resumable: rerunning resumes an unfinished stage 1 and redoes an unfinished
    stage 2 (whose leftover files, written before its ``config.json``, are replaced); a finished
    run is reported, never overwritten. ``cfg.method`` is stage 1's training method."""
    out = Path(out_dir)
    stage1 = out / STAGE1_SUBDIR
    say = (lambda line: print(line, flush=True)) if verbose else (lambda line: None)
    if (out / rundir.CONFIG).is_file():
        info = rundir.load_info(out)
        if info.get("method") != "maccal" or info.get("status") != "done":
            raise UserError(f"out: {out} holds another run (method {info.get('method')!r}); choose another directory")
        asked = {**info["maccal"], **stage2}
        if asked.get("loss") == "stage1":  # recorded resolved, as the stage-1 loss spec
            asked["loss"] = cfg.loss
        if asked != info["maccal"]:
            changed = sorted(k for k in asked if asked[k] != info["maccal"].get(k))
            raise UserError(f"out: {out} holds a MaC-Cal run with other stage-2 settings ({', '.join(changed)}); "
                             "choose another directory")
        calibkit.train.train(cfg, stage1, progress=False, verbose=False)  # refuses a different stage-1 config
        say(f"{out}: MaC-Cal run already finished; nothing to do")
        return {k: info.get(k) for k in ("status", "best_epoch", "test_acc", "test_ece")} | {"out_dir": str(out)}
    if out.exists():
        unknown = [p.name for p in out.iterdir() if p.name != STAGE1_SUBDIR and p.name not in STAGE2_FILES]
        if not out.is_dir() or unknown:
            raise UserError(f"out: {out} is not empty and holds no MaC-Cal run ({', '.join(unknown[:3])}); "
                             "choose another directory")
    summary1 = calibkit.train.train(cfg, stage1, progress=progress, verbose=verbose)
    if int(os.environ.get("RANK", "0")) != 0:
        return summary1  # under torchrun, stage 2 (seconds, one process) runs on rank 0 only
    for name in STAGE2_FILES:  # an interrupted stage 2 left these before its config.json
        (out / name).unlink(missing_ok=True)
    say(f"stage 2 (MaC-Cal) on {stage1}")
    return calibkit.methods.maccal.run_maccal(stage1, out, device=cfg.device, log=say if verbose else None, **stage2)


def train_command(cfg, args) -> int:
    """``calibkit train --method maccal``: called by the train command with the stage-1 config."""
    summary = train_two_stage(cfg, args.out, parse_stage2_spec(args.maccal),
                              progress=not (args.no_progress or args.quiet), verbose=not args.quiet)
    if summary.get("best_keep_rate") is not None:
        print(_result_line(summary), flush=True)
    return 0
