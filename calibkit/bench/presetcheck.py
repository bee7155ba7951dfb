"""Every value of a preset that can be checked without training, in one function.

:func:`check_values` is what ``calibkit preset check`` runs and what the bench's (and the
tuner's) preflight runs before anything is written (:func:`calibkit.bench.preflight.check_bench`
calls it), so a preset that passes the one passes the other's value checks.
:func:`calibkit.bench.presetfile.parse_preset` has checked every name; here every value is
checked against the rule of the code that later reads it. Each refusal is one line
``<file>: <key>: <rule>, got <value>`` (the bench names the preset, ``preset <name>:``, and a
command-line flag by itself, ``--seeds:``).

The rules (calibkit's decisions where the code that reads a value has none):

* ``seeds``: a non-empty list of distinct integers >= 0 (the preset's, and ``--seeds`` when given);
  ``tune_seed`` an integer >= 0, and a warning when it is one of the ``seeds`` (:func:`warn_tune_seed`).
* ``n_boot`` >= 1; ``robust_n`` >= 0 (0: every test image); ``severities`` each one of
  :data:`SEVERITY_LEVELS`, none repeated; ``num_threads`` left out or >= 1; ``checkpoint_every`` >= 1.
* ``report_calibrators``: left out, or a non-empty list of distinct names of
  ``calibkit.calibrators.CALIBRATORS`` holding ``temperature`` (the report's reference calibrator:
  the CE + TS baseline, the selection rule's default and the TS columns all read it);
  ``report_figures`` one of :data:`calibkit.bench.grid.REPORT_FIGURES`.
* Paths must exist: ``data_dir`` (``--data-dir``) where the data set reads files (a file for
  ``tensors``, a folder otherwise); an ``ood`` that is no built-in set or data set name (a folder
  of images or a tensors file), which must also differ from the data set; ``[csm] store`` (a folder).
  A data set whose files are looked for in its default place is not checked here: the bench's
  preflight loads it.
* ``[csm] sharpness``: a finite number > 0 (a negative one inverts CSM's soft labels); ``encoder``
  one of ``classifier``, ``efficientnet_lite0``.
  ``[maccal]``: each keyword in its domain (:data:`MACCAL_RULES`).
* Every method that runs: its ``TrainConfig`` validates and its loss spec builds.
* ``[space.<method>]``: each address one that the method reads (:func:`unused_reason`: a loss
  parameter or ``TrainConfig`` field for a trained method, a ``[maccal]`` keyword for MaC-Cal, CSM
  settings for CSM; the mixing ``train.mix_alpha`` only for Mixup and RegMixup, ``train.csm_*``
  only for CSM, no field the bench sets per run); each value finite, inside the address's hard
  bound (:data:`calibkit.bench.grid.BOUNDS`) and valid when the method runs with it alone (the
  same ``TrainConfig``, loss, MaC-Cal and CSM checks, value by value); the default one of the values.
* ``modality``: ``"text"`` or ``"features"`` must be what the data hold, where that is known
  without loading them (:func:`data_modality`: a shipped data set's registry entry, images for
  ``imagefolder``, the header of a ``tensors`` file's ``x_train``). ``"image"``, the default, on
  text or feature data is refused only where a method that mixes or generates images would run
  (:func:`check_modality`); the bench's preflight checks that rule again on the loaded data.
  ``augment = true`` (``--augment``) on text or feature data is refused: augmentation moves
  pixels, and those inputs are used as stored (the run would be the unaugmented one under
  another name).
"""

from __future__ import annotations

import json
import math
import os
import struct
import warnings
import zipfile
from pathlib import Path

import numpy as np

from calibkit import losses
from calibkit.bench.grid import BENCH_METHODS, IMAGE_ONLY, REPORT_FIGURES, Bound, bound_for, grid_methods
from calibkit.bench.presetfile import CSM_ENCODERS, PER_RUN, check_name, nearest
from calibkit.bench.presetpower import warn_small_validation
from calibkit.bench.runner import train_config
from calibkit.bench.space import apply_values, candidates
from calibkit.calibrators.registry import CALIBRATORS
from calibkit.data import DATASETS, check_dataset
from calibkit.data.ood import NO_OOD, OOD_SETS
from calibkit.data.ood_user import is_user_set
from calibkit.data.tensors import input_kind
from calibkit.errors import UserError, UserFileNotFoundError
from calibkit.models import resolve

# The severities calibkit.data.corruptions.corrupt accepts.
SEVERITY_LEVELS = (1, 2, 3, 4, 5)
# TrainConfig fields read only by some trainers (TrainConfig.method): elsewhere they change nothing.
TRAINER_FIELDS = {"mix_alpha": ("mixup", "regmixup"), "csm_weight": ("csm",), "csm_per_real": ("csm",),
                  "csm_loss": ("csm",)}
# The search-space targets each kind of method reads (MethodSpec.kind).
TARGETS_OF = {"train": ("loss", "train"), "csm": ("loss", "train", "csm"), "maccal": ("maccal",)}
# run_maccal's keywords: (kind, low, low excluded, high, high excluded); the estimator's own domains.
MACCAL_RULES = {
    "r_init": ("number", 0, True, 1, False), "eta": ("number", 0, False, None, False),
    "r_min": ("number", 0, True, 1, False), "epochs": ("int", 1, False, None, False),
    "lr": ("number", 0, True, None, False), "momentum": ("number", 0, False, 1, True),
    "weight_decay": ("number", 0, False, None, False), "batch_size": ("int", 1, False, None, False),
    "grad_clip": ("number", 0, False, None, False), "n_bins": ("int", 1, False, None, False),
    "seed": ("int", 0, False, None, False), "mc_samples": ("int", 0, False, None, False),
}


def check_preset(preset, source: str | None = None) -> str:
    """Raise naming the first problem (:func:`check_values`); return a one-paragraph summary."""
    where = f"{source or preset.name}: "
    methods = check_values(preset, where)
    warn_tune_seed(preset, preset.tune_seed, preset.seeds, f"{where}tune_seed")
    warn_small_validation(preset, where)

    skipped = grid_methods(preset)[1]
    n_cands = sum(len(candidates(m, preset)) for m in methods if m != "ce" and preset.space_for(m))
    tuned = [m for m in methods if preset.space_for(m)]
    custom = ", ".join(sorted(preset.spaces)) or "none"
    return (f"{where}preset {preset.name} is valid: data {preset.dataset}"
            f"{' (' + preset.data_dir + ')' if preset.data_dir else ''}, model {preset.model}, OOD {preset.ood}; "
            f"{len(methods)} methods x {len(preset.seeds)} seed(s) = {len(methods) * len(preset.seeds)} bench runs"
            f"{'; skipped: ' + ', '.join(skipped) if skipped else ''}; tune: {n_cands + 1} candidates over "
            f"{len(tuned)} methods (own search spaces: {custom}). Not checked here: the data files' contents and "
            f"the model on them (the bench checks both before it starts).")


def check_values(preset, where: str = "", seeds=None, methods=None, data_dir=None, seeds_flag: str = "--seeds",
                 data_modality: str | None = None) -> list[str]:
    """Raise one line for the first value of ``preset`` that breaks its rule (module docstring);
    return the methods that run.

    Args:
        preset: a :class:`calibkit.bench.grid.Preset`.
        where: the prefix naming the preset (``"mine.toml: "``).
        seeds: the seeds given on the command line (checked as ``seeds_flag``), besides the preset's.
        methods: the methods given on the command line (default: the preset's, else all).
        data_dir: ``--data-dir`` (default: the preset's ``data_dir``).
        data_modality: what the data hold, when known (the bench's loaded data); None: read cheaply
            where possible (:func:`data_modality`).

    Raises:
        ValueError: a value out of its domain; FileNotFoundError: a path that does not exist;
        calibkit.extras.MissingExtra: a package the data set or the OOD set needs.
    """
    check_name(preset.name, where)  # a Preset made in Python skips the file's check; the name makes folders
    if preset.dataset not in DATASETS:
        raise UserError(f"{where}dataset: unknown data set {preset.dataset!r}{nearest(preset.dataset, DATASETS)}; "
                         f"valid: {', '.join(DATASETS)}")
    check_dataset(preset.dataset)
    if preset.ood in DATASETS:
        check_dataset(preset.ood)
    check_seeds(preset.seeds, f"{where}seeds")
    if seeds is not None:
        check_seeds(seeds, seeds_flag)
    _check_numbers(preset, where)
    chosen, _ = grid_methods(preset, methods)  # unknown names raise here
    _check_paths(preset, where, data_dir)

    try:
        resolve(preset.model)
    except (ValueError, ImportError) as exc:
        raise UserError(f"{where}{exc}") from None
    check_csm(preset.csm, f"{where}[csm] ")
    check_maccal(preset.maccal, f"{where}[maccal] ")
    for m in chosen:
        _check_method(preset, m, f"{where}method {m}: ")
    for m, space in preset.spaces.items():
        _check_space(preset, m, space, f"{where}[space.{m}] ")
    known = data_modality or data_modality_of(preset.dataset, data_dir if data_dir is not None else preset.data_dir)
    check_modality(preset, known, chosen, where)
    return chosen


MAX_SEED = 2**63 - 1  # the largest seed a SQLite or PostgreSQL integer column holds


def check_seeds(seeds, label: str) -> None:
    """A non-empty list of distinct integers >= 0; ``label`` names the key or the flag."""
    seeds = list(seeds)
    bad = [s for s in seeds if not _is_int(s) or s < 0]
    if bad:
        raise UserError(f"{label}: every seed must be an integer >= 0, got {bad[0]!r}")
    huge = [s for s in seeds if s > MAX_SEED]
    if huge:
        raise UserError(f"{label}: every seed must be at most 2**63 - 1 (the results database stores 64-bit "
                        f"integers), got {huge[0]!r}")
    if len(set(seeds)) != len(seeds):
        raise UserError(f"{label}: repeated seed in {seeds}")
    if not seeds:
        raise UserError(f"{label}: give at least one seed")


def warn_tune_seed(preset, seed: int, seeds, label: str = "tune_seed") -> None:
    """Warn when the selection seed ``seed`` is one of the evaluation seeds ``seeds``: the selection
    then sees the randomness (initialisation, data order, validation split) of a run whose test
    numbers the bench reports, so those numbers are no longer free of the selection."""
    if int(seed) in {int(s) for s in seeds}:
        warnings.warn(f"{label} {seed} is also an evaluation seed of preset {preset.name} (seeds "
                      f"{', '.join(map(str, seeds))}): the selection sees the randomness of a run whose test numbers "
                      f"are reported; choose a seed outside them (the shipped presets tune on 100)", stacklevel=2)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_numbers(preset, where: str) -> None:
    for key, low, why in (("tune_seed", 0, ""), ("n_boot", 10, " (bootstrap resamples; fewer give no interval)"),
                          ("robust_n", 0, " (test images corrupted; 0: all)"), ("checkpoint_every", 1, "")):
        value = getattr(preset, key)
        if not _is_int(value) or value < low:
            raise UserError(f"{where}{key}: must be an integer >= {low}{why}, got {value!r}")
    if preset.num_threads is not None and (not _is_int(preset.num_threads) or preset.num_threads < 1):
        raise UserError(f"{where}num_threads: must be an integer >= 1 (leave it out for torch's default), "
                         f"got {preset.num_threads!r}")
    _check_report_calibrators(preset.report_calibrators, where)
    if preset.report_figures not in REPORT_FIGURES:
        raise UserError(f"{where}report_figures: one of {', '.join(REPORT_FIGURES)}, got {preset.report_figures!r}")
    levels = list(preset.severities)
    bad = [s for s in levels if not _is_int(s) or s not in SEVERITY_LEVELS]
    if bad:
        raise UserError(f"{where}severities: every severity must be one of "
                         f"{', '.join(map(str, SEVERITY_LEVELS))}, got {bad[0]!r}")
    if len(set(levels)) != len(levels):
        raise UserError(f"{where}severities: repeated severity in {levels}")


def _check_report_calibrators(names, where: str) -> None:
    if names is None:
        return
    names = list(names)
    unknown = [n for n in names if n not in CALIBRATORS]
    if unknown:
        close = nearest(unknown[0], CALIBRATORS)
        raise UserError(f"{where}report_calibrators: unknown calibrator {unknown[0]!r}{close}; "
                         f"valid: {', '.join(CALIBRATORS)}")
    if len(set(names)) != len(names) or "temperature" not in names:
        raise UserError(f"{where}report_calibrators: a list of distinct calibrator names holding 'temperature' "
                         f"(the report's reference calibrator), or left out for every calibrator; got {names}")


def _check_paths(preset, where: str, data_dir) -> None:
    spec = DATASETS[preset.dataset]
    folder = data_dir if data_dir is not None else preset.data_dir
    label = "--data-dir" if data_dir is not None else f"{where}data_dir"
    if folder is not None and spec.needs_dir:
        path = Path(folder)
        if spec.is_file and path.is_dir():  # "no such file" would mislead: it exists, as a folder
            raise UserError(f"{label}: {str(folder)!r} is a folder, not a file ({preset.dataset} reads one .npz or "
                             ".safetensors file)")
        if spec.is_file and not path.is_file():
            raise UserFileNotFoundError(f"{label}: no such file {str(folder)!r} ({preset.dataset} reads one .npz or "
                                    ".safetensors file)")
        if not spec.is_file and path.exists() and not path.is_dir():
            raise UserError(f"{label}: {str(folder)!r} is a file, not a folder ({preset.dataset} reads a folder)")
        if not spec.is_file and not path.is_dir():
            raise UserFileNotFoundError(f"{label}: no such folder {str(folder)!r}")
    if preset.ood == preset.dataset and preset.ood not in OOD_SETS + (NO_OOD,):  # as load_ood refuses it
        raise UserError(f"{where}ood: the OOD set must differ from the data set, got {preset.ood!r}")
    if is_user_set(preset.ood) and not os.path.exists(preset.ood):
        raise UserFileNotFoundError(f"{where}ood: no such folder or file {preset.ood!r} (an OOD set is none, noise, "
                                "digits, a data set name, a folder of images or an .npz/.safetensors file)")


def check_csm(csm: dict, where: str) -> None:
    """``[csm]``: ``sharpness`` a finite number > 0, ``encoder`` a bench encoder, ``store`` an existing folder."""
    if "sharpness" in csm:
        _number(csm["sharpness"], f"{where}sharpness", 0, True, None, False)

    if "encoder" in csm and csm["encoder"] not in CSM_ENCODERS:
        raise UserError(f"{where}encoder: expected one of {', '.join(CSM_ENCODERS)}, got {csm['encoder']!r}"
                        f"{nearest(csm['encoder'], CSM_ENCODERS)}")
    store = csm.get("store")
    if store is not None and (not isinstance(store, str) or not Path(store).is_dir()):
        raise UserFileNotFoundError(f"{where}store: no such folder {store!r} (a generated set of "
                                    "`calibkit csm generate`)")


def check_maccal(values: dict, where: str) -> None:
    """``[maccal]``: each keyword in its domain (:data:`MACCAL_RULES`); ``loss`` a loss spec or ``stage1``."""
    for key, value in values.items():
        if key == "loss":
            if value != "stage1":
                _loss(value, f"{where}loss")
            continue
        if key not in MACCAL_RULES:
            continue  # an unknown keyword is refused when the file is read
        kind, low, low_open, high, high_open = MACCAL_RULES[key]
        if kind == "int":
            if not _is_int(value) or value < low:
                raise UserError(f"{where}{key}: must be an integer >= {low}, got {value!r}")
        else:
            _number(value, f"{where}{key}", low, low_open, high, high_open)


def _number(value, label: str, low, low_open: bool, high, high_open: bool) -> None:
    bound = Bound(low, high, low_open, high_open)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not bound.admits(value):
        raise UserError(f"{label}: must be a finite number in {bound.text()}, got {value!r}")


def _loss(spec, label: str) -> None:
    try:
        losses.build(spec, num_classes=10)
    except (ValueError, TypeError, KeyError) as exc:
        raise UserError(f"{label}: {exc.args[0] if exc.args else exc}") from None


def _check_method(preset, method: str, where: str) -> None:
    """The run of ``method``: its TrainConfig validates and its loss builds."""
    try:
        train_config(preset, method, preset.seeds[0] if preset.seeds else 0, csm_data="-")
    except (ValueError, TypeError) as exc:
        raise UserError(f"{where}{exc}") from None
    _loss(preset.loss_for(method), f"{where}loss {preset.loss_for(method)!r}")


def unused_reason(method: str, address: str) -> str | None:
    """Why ``method`` does not read search-space ``address`` (None: it does)."""
    spec = BENCH_METHODS[method]
    target, _, name = address.partition(".")
    if target not in TARGETS_OF[spec.kind]:
        readers = [m for m, s in BENCH_METHODS.items() if target in TARGETS_OF[s.kind]]
        return f"{method} does not read {target}.* (read by: {', '.join(readers)})"
    if target == "train" and name in PER_RUN:
        return f"{name} is set per run, not searched (use {PER_RUN[name]})"
    if target == "train" and name in TRAINER_FIELDS and spec.method not in TRAINER_FIELDS[name]:
        readers = [m for m, s in BENCH_METHODS.items() if s.method in TRAINER_FIELDS[name]]
        return f"{method} does not read train.{name} (read by: {', '.join(readers)})"
    return None


def _check_space(preset, method: str, space: dict, where: str) -> None:
    for address, axis in space.items():
        label = f"{where}{address!r}"
        why = unused_reason(method, address)
        if why:
            raise UserError(f"{label}: {why}; every candidate would train the same")
        bound = bound_for(address, axis)
        for v in axis.values:
            if not math.isfinite(v) or not bound.admits(v):
                raise UserError(f"{label}: every value must be a finite number in {bound.text()}, got {v!r}")
        if axis.default not in axis.values:
            raise UserError(f"{label}: the default must be one of the values {list(axis.values)}, "
                             f"got {axis.default!r}")
        for v in axis.values:
            run = apply_values(preset, method, {address: v})
            target = address.partition(".")[0]
            try:
                if target == "maccal":
                    check_maccal(run.maccal, "")
                elif target == "csm":
                    check_csm({"sharpness": v}, "")
                else:
                    _check_method(run, method, "")
            except ValueError as exc:
                raise UserError(f"{label}: value {v!r}: {exc}") from None


def data_modality_of(dataset: str, data_dir) -> str | None:
    """What ``dataset`` holds (``image``, ``text`` or ``features``) where it is known without
    loading it: a shipped data set's registry entry (segmentation data are images), images for
    ``imagefolder``, and for ``tensors`` the dtype and shape of ``x_train`` read from the file's
    header (:func:`calibkit.data.tensors.input_kind`); None where it is not."""
    if dataset == "tensors":
        return _tensors_kind(str(data_dir)) if data_dir is not None else None
    spec = DATASETS.get(dataset)
    if spec is None:
        return None
    return "image" if spec.modality == "segmentation" else spec.modality


def _tensors_kind(path: str) -> str | None:
    try:
        if path.endswith(".npz"):
            with zipfile.ZipFile(path) as z, z.open("x_train.npy") as f:
                version = np.lib.format.read_magic(f)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                shape, _, dtype = read(f)
        elif path.endswith(".safetensors"):
            with open(path, "rb") as f:
                n = struct.unpack("<Q", f.read(8))[0]
                entry = json.loads(f.read(n))["x_train"]
            shape = entry["shape"]
            code = entry["dtype"]
            dtype = np.dtype({"U8": "uint8", "BOOL": "bool", "BF16": "float32"}.get(
                code, code.replace("F", "float").replace("U", "uint").replace("I", "int")))
        else:
            return None
    except Exception:  # unreadable here: the bench's loading names what is wrong
        return None
    kind = input_kind(np.empty((0,) * len(shape), dtype=dtype))
    return kind if kind != "unknown" else None


def check_modality(preset, kind: str | None, methods, where: str = "") -> None:
    """The preset's ``modality`` against what the data hold (``kind``; None: not known)."""
    if kind is None:
        return
    if preset.modality != "image" and preset.modality != kind:
        hold = "images" if kind == "image" else kind
        raise UserError(f"{where}modality: {preset.dataset} holds {hold}, so the modality is {kind!r}, got "
                         f"{preset.modality!r}")
    if kind in ("text", "features") and preset.train.get("augment") is True:
        raise UserError(f"{where}augment: random crop and flip apply to images only; {preset.dataset} holds {kind}, "
                         "which are used as stored: leave --augment out (augment = false)")
    mixing = [m for m in methods if m in IMAGE_ONLY]
    if kind in ("text", "features") and preset.modality == "image" and mixing:
        raise UserError(f"{where}{preset.dataset} holds {kind}, not images: {', '.join(mixing)} mix or generate "
                         f"images; set modality = \"{kind}\" in the preset (they are skipped then), or "
                         "leave them out of the methods")
