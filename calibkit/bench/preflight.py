"""Everything a bench needs, checked once before it creates anything.

A bench runs for minutes to days. A precondition that fails (a data set not on disk, a missing
extra package, a negative seed, no CSM generated set, an output path that is a file, a damaged
results database) would otherwise fail every run in turn, after ``OUT/runs.db`` was created. The
check here reads files only: when it raises, nothing under ``--out`` exists that did not before.
"""

from __future__ import annotations

from pathlib import Path


def check_bench(preset, out, seeds=None, methods=None, data_dir=None, csm_store=None, store=None, csm_build=False,
                device="auto") -> None:
    """Raise a one-line error (``ValueError``, ``FileNotFoundError``, ``FileExistsError``,
    ``calibkit.extras.MissingExtra`` or ``calibkit.store.StoreError``) for the first unmet
    precondition of ``calibkit bench``.

    Checked in order: the output path (absent or a folder, not a training run's: :func:`check_out`)
    and its results database (absent or a healthy calibkit database), the seeds (integers >= 0, no repeats), the method names, the extra
    packages the data set and the OOD set need, the data set itself (loaded once with the first
    seed's split, so missing or damaged files surface here), the OOD set, and, when CSM is in the
    grid, its generated set.

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
    """
    from calibkit.bench.grid import grid_methods
    from calibkit.extras import check_dataset
    from calibkit.store import check_store

    out = Path(out)
    check_out(out)
    check_store(out, store)
    seeds = list(preset.seeds if seeds is None else seeds)
    bad = [s for s in seeds if not isinstance(s, int) or isinstance(s, bool) or s < 0]
    if bad:
        raise ValueError(f"--seeds: every seed must be an integer >= 0, got {bad[0]!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds: repeated seed in {seeds}")
    if not seeds:
        raise ValueError("--seeds: give at least one seed")
    chosen, _ = grid_methods(preset, methods)  # unknown names raise here

    from calibkit.data import DATASETS, load
    from calibkit.data.ood import OOD_SETS, load_ood

    check_dataset(preset.dataset)
    if preset.ood in DATASETS:
        check_dataset(preset.ood)
    cfg = _ce_config(preset, seeds[0], data_dir)
    bundle = load(cfg.data, data_dir=cfg.data_dir, seed=seeds[0], val_size=cfg.val_size,
                  train_subset=cfg.train_subset)
    if preset.ood not in OOD_SETS:  # the built-in sets need no files
        load_ood(preset.ood, like=bundle, data_dir=data_dir)
    if "csm" in chosen:
        _check_csm_store(preset, csm_store, bundle, seeds, csm_build, device)


def check_tune(preset, out, methods=None, seed=None, data_dir=None, csm_store=None, store=None, csm_build=False,
               device="auto") -> None:
    """:func:`check_bench` for ``calibkit tune``: the same checks, on the selection seed
    (``seed``, default ``preset.tune_seed``) and the methods to tune (default: the preset's list,
    else all). Raises as :func:`check_bench` does; when it raises nothing was written."""
    check_bench(preset, out, seeds=[preset.tune_seed if seed is None else seed], methods=methods,
                data_dir=data_dir, csm_store=csm_store, store=store, csm_build=csm_build, device=device)


def check_out(out) -> None:
    """The bench's (or tune's) ``--out``: absent, or a folder that no training run owns.

    Raises:
        FileExistsError: ``out`` is a file.
        ValueError: ``out`` is a training run's directory (it holds ``config.json``).
    """
    from calibkit.rundir import CONFIG, directory_owner

    out = Path(out)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {out} is an existing file; the bench writes a folder there: choose another path")
    if (out / CONFIG).exists():
        raise ValueError(f"--out {out} is {directory_owner(out)}; a bench writes runs.db, runs/ and report/ into "
                         "its own directory: choose another path")


def _ce_config(preset, seed: int, data_dir):
    from calibkit.bench.runner import train_config

    return train_config(preset, "ce", seed, data_dir)


def _check_csm_store(preset, csm_store, bundle, seeds, csm_build=False, device="auto") -> None:
    from calibkit.bench import csmbuild
    from calibkit.bench.twostage import csm_source
    from calibkit.methods.csm.store import read_manifest

    src = csm_source(preset, csm_store)
    if src is not None and Path(src).is_dir():
        read_manifest(src)  # not a generated set: raises naming the folder
        return
    if csm_store is not None:
        raise FileNotFoundError(f"--csm-store {csm_store}: no such folder (make a generated set with `calibkit csm "
                                "generate`, or leave --csm-store out and pass --csm-build)")
    if bundle.modality != "image":
        raise ValueError(f"csm: {preset.dataset} is {bundle.modality}, not images; CSM does not apply: leave csm "
                         "out of --methods")
    if not csm_build:
        raise FileNotFoundError(csmbuild.cost_line(preset, bundle, seeds, device))
    from calibkit.extras import require

    require("diffusers", "building a CSM generated set (--csm-build)")
