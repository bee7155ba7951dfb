"""Where ``calibkit calibrate`` reads its validation and test scores from.

Three sources, exactly one per call:

* ``--val FILE --test FILE``: two files, each with logits (or probabilities) and labels;
* ``--from FILE``: one file, either with ``val_*`` and ``test_*`` entries (``val_logits``,
  ``val_labels``, ``test_logits``, ``test_labels``: what a calibkit run writes), or with plain
  entries split by ``--split FRACTION`` (the share of rows that goes to validation);
* ``--run DIR``: a finished calibkit run (``calibkit train`` or one run of a bench), whose
  ``DIR/logits.safetensors`` holds the validation and test logits and labels of its kept weights.

Decisions where the spec is silent:

* ``--split`` is **stratified**: each class's rows are permuted (a generator seeded with
  ``--seed``, the bootstrap seed, so one number reproduces a whole call) and the first
  ``round(FRACTION * n_c)`` (halves rounded up) of class ``c`` go to validation (at least one row
  of a class with two or more rows goes to each side; a class of one row goes to validation).
  Stratifying keeps every class on both sides, which the per-class calibrators (vector, matrix,
  Dirichlet scaling) and classwise ECE need, and makes the two splits' class frequencies equal up
  to rounding; the validation size is then within K rows of ``FRACTION * N``.
* ``--split`` splits the file's plain entries (``logits``/``probs``, ``labels``, or the names of the
  key options); a file without them is refused with the entries it holds. Without ``--split``,
  ``--from`` reads the ``val_*``/``test_*`` entries, and a file without them is refused with a
  message that names ``--split``.
* ``--out`` defaults to ``DIR/calibration`` for ``--run DIR`` (the results stay with the run; no
  file of the run is touched), and to ``STEM-calibration`` beside ``--from STEM.npz`` or ``--val``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from calibkit.commands import check_paths_given
from calibkit.commands.scorefile import Keys, found, read_entries, read_scores, scores_of
from calibkit.data.tensors import check_is_file
from calibkit.errors import UserError
from calibkit.rundir import LOGITS


@dataclass
class Scores:
    """The validation and test scores of one call and where they came from."""

    val: tuple  # (logits, labels)
    test: tuple
    val_name: str  # what the messages call each side
    test_name: str
    val_src: str  # the entry read
    test_src: str
    same_file: bool = False  # both sides read from one file (by entries or by a split): never the same rows


def check_sources(args) -> None:
    """Refuse a call without exactly one source, or with options that do not belong to its source."""
    check_paths_given(val=args.val, test=args.test, out=args.out, run=args.run, **{"from": args.from_file})
    given = [flag for flag, on in (("--val/--test", args.val is not None or args.test is not None),
                                   ("--from", args.from_file is not None), ("--run", args.run is not None)) if on]
    if len(given) != 1:
        what = "none was given" if not given else f"got {' and '.join(given)}"
        raise UserError(f"give exactly one input: --val FILE --test FILE, --from FILE [--split FRACTION], or --run "
                         f"DIR ({what})")
    if given == ["--val/--test"] and (args.val is None or args.test is None):
        missing = "--test" if args.test is None else "--val"
        raise UserError(f"{missing} is missing: --val and --test go together (or use --from FILE --split FRACTION "
                         "for one file)")
    if args.split is not None:
        if args.from_file is None:
            raise UserError("--split goes with --from FILE (one file to split into validation and test rows)")
        if not 0 < args.split < 1:  # also refuses NaN
            raise UserError(f"--split must be a fraction in (0, 1) (the share of rows for validation), got "
                             f"{args.split}")
    if args.logits_key is not None and args.probs_key is not None:
        raise UserError("give --logits-key or --probs-key, not both (one entry holds the scores)")


def keys_of(args) -> Keys:
    return Keys(logits=args.logits_key, probs=args.probs_key, labels=args.labels_key)


def default_out(args) -> Path:
    """``--out``'s default (module docstring)."""
    if args.run is not None:
        return Path(args.run) / "calibration"
    src = Path(args.from_file if args.from_file is not None else args.val)
    return src.with_name(f"{src.stem}-calibration")


def read_sources(args, read=read_scores) -> Scores:
    """The validation and test scores of ``args`` (``read``: the reader of one plain file)."""
    keys = keys_of(args)
    if args.val is not None:
        vx, vy, vs = read(args.val, keys=keys)
        tx, ty, ts = read(args.test, keys=keys)
        return Scores((vx, vy), (tx, ty), str(args.val), str(args.test), vs, ts)
    if args.run is not None:
        return _prefixed(run_logits(args.run), keys, "--run")
    path = Path(args.from_file)
    if args.split is None:
        return _prefixed(path, keys, "--from")
    x, y, src = read(path, keys=keys)
    vi, ti = split_rows(y, args.split, args.seed)
    return Scores((x[vi], y[vi]), (x[ti], y[ti]), f"{path} (validation part)", f"{path} (test part)", src, src,
                  same_file=True)


def run_logits(run) -> Path:
    """``RUN/logits.safetensors``, or an error saying what ``run`` is instead."""
    run = Path(run)
    if not run.is_dir():
        raise UserError(f"--run {run}: not a directory; give a calibkit run directory (it holds {LOGITS})")
    path = run / LOGITS
    if path.is_file():
        return path
    inside = sorted(p.parent for p in run.glob(f"*/*/*/{LOGITS}"))[:3]  # OUT/runs: PRESET/METHOD/seedS
    inside = inside or sorted(p.parent for p in run.glob(f"**/{LOGITS}"))[:3]
    hint = (f"; runs found below it: {', '.join(map(str, inside))}" if inside else
            "; a run writes it when its training finishes (calibkit train, calibkit bench)")
    raise UserError(f"--run {run}: no {LOGITS} there, so not a finished calibkit run{hint}")


def _prefixed(path: Path, keys: Keys, flag: str) -> Scores:
    """The ``val_*`` and ``test_*`` entries of one file."""
    check_is_file(path)
    data = read_entries(path)
    val_keys, test_keys = keys.with_prefix("val_"), keys.with_prefix("test_")
    if not any(n in data for n, _ in val_keys.score_names() + test_keys.score_names()):
        split = " or give --split FRACTION to split its rows into validation and test" if flag == "--from" else ""
        raise UserError(f"{path}: no val_*/test_* entries such as 'val_logits' and 'test_logits' (found: "
                         f"{found(data)}); name them with --logits-key/--labels-key (without the prefix){split}")
    vx, vy, vs = scores_of(data, f"{path} (validation)", keys=val_keys)
    tx, ty, ts = scores_of(data, f"{path} (test)", keys=test_keys)
    return Scores((vx, vy), (tx, ty), f"{path} (val_*)", f"{path} (test_*)", vs, ts, same_file=True)


def split_rows(labels, fraction: float, seed: int):
    """``(val_rows, test_rows)``: a stratified, seeded split of the rows (module docstring), each sorted.

    Raises :class:`UserError` when a side would be empty.
    """
    g = torch.Generator().manual_seed(seed)
    val, test = [], []
    for c in torch.unique(labels).tolist():
        rows = torch.nonzero(labels == c).squeeze(1)
        rows = rows[torch.randperm(len(rows), generator=g)]
        n_val = int(fraction * len(rows) + 0.5)
        if len(rows) >= 2:
            n_val = min(max(n_val, 1), len(rows) - 1)
        val.append(rows[:n_val])
        test.append(rows[n_val:])
    vi, ti = torch.cat(val).sort().values, torch.cat(test).sort().values
    if len(vi) == 0 or len(ti) == 0:
        raise UserError(f"--split {fraction}: {len(labels)} rows leave the {'validation' if len(vi) == 0 else 'test'} "
                         "side empty; use more rows or a fraction nearer 0.5")
    return vi, ti
