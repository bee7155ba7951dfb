"""``calibkit tune``: select each method's hyperparameters on the validation split."""

from __future__ import annotations

import argparse

EPILOG = """\
examples:
  calibkit tune --preset default --out runs/tune-default            # every method with a search space
  calibkit tune --preset default --out runs/tune-default --methods mbls fedlas_mbls
  calibkit bench --preset default --out runs/tuned --tune           # select, then bench at the selection
  torchrun --nproc_per_node 4 -m calibkit tune --preset cifar10 --data-dir ~/data --out runs/tune-c10

Every candidate is trained on the preset's selection seed and scored on the validation split only
(ECE of the deployed predictor before temperature scaling; candidates more than 1 accuracy point
below the method's best are excluded). Running the same command again never retrains a finished
candidate; two processes on one DIR share the candidates. Search spaces: docs/bench.md.
"""


def add_shared(p) -> None:
    """Options shared by ``tune`` and ``bench``."""
    from calibkit.bench.grid import KEEP_POLICIES

    p.add_argument("--keep", choices=KEEP_POLICIES,
                   help="checkpoint policy of every run (default: the preset's); one policy per output directory")
    p.add_argument("--store", metavar="URL",
                   help="results database: a postgresql:// URL shared by benches on several hosts (needs "
                   "calibkit[postgres]; one database per output directory; docs/store.md); default DIR/runs.db")


def register(subparsers) -> None:
    from calibkit.bench.grid import METHODS, PRESETS
    from calibkit.commands import add_num_threads

    p = subparsers.add_parser(
        "tune", help="select each method's hyperparameters on the validation split (never the test split)",
        description="Train every candidate of each method's search space on the preset's selection seed, "
        "score it on the validation split and record all of them, and the selection, in the tuning table "
        "of DIR/runs.db.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--preset", default="default", help=f"one of {', '.join(PRESETS)} (default: default)")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (runs.db, tune/, runs/)")
    p.add_argument("--methods", nargs="+", metavar="M",
                   help="methods to tune (default: all with a search space): "
                   f"{', '.join(m for m, s in METHODS.items() if s.space)}")
    p.add_argument("--seed", type=int, metavar="S", help="selection seed (default: the preset's tune_seed)")
    p.add_argument("--data-dir", metavar="DIR", help="folder with the data set's files")
    p.add_argument("--csm-store", metavar="DIR", help="CSM generated set (default: the one shipped)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    add_shared(p)
    add_num_threads(p)
    p.set_defaults(func=run)


def run_tuning(args, preset, tuned: bool = False, log=print):
    """Run the selection for ``args``; returns ``(tuner, counts, tuned preset or None)``.

    With ``tuned``, the third item is the preset at the selected values (an error when some
    candidates failed). The tuner is closed on return.
    """
    from calibkit.bench.tune import Tuner
    from calibkit.store import describe_store

    tuner = Tuner(preset, args.out, methods=args.methods, seed=getattr(args, "seed", None),
                  data_dir=args.data_dir, device=args.device, num_threads=args.num_threads,
                  csm_store=args.csm_store, log=log, store=args.store)
    try:
        if tuner.unsupported:
            tuner.log(f"tune {', '.join(tuner.unsupported)}: skipped (they mix or generate images; preset "
                      f"{preset.name} trains on token ids)")
        for m in tuner.skipped:
            tuner.log(f"tune {m}: no search space (nothing to tune); it runs at the preset's values")
        counts = tuner.run()
        if tuned and counts["failed"]:
            raise RuntimeError(f"{counts['failed']} tuning candidate(s) failed; see {describe_store(args.out, args.store)} "
                               "(run the same command again to retry them)")
        result = tuner.tuned_preset() if tuned else None
    finally:
        tuner.close()
    return tuner, counts, result


def run(args) -> int:
    from calibkit.bench.grid import get_preset, with_keep
    from calibkit.store import describe_store

    preset = with_keep(get_preset(args.preset), args.keep)
    tuner, counts, _ = run_tuning(args, preset)
    if not tuner.dd.is_main:
        return 0
    print(f"tune {preset.name}: {counts['done']} candidate(s) done, {counts['skipped']} skipped, "
          f"{counts['failed']} failed; database {describe_store(args.out, args.store)}")
    from calibkit.report.tuning import tuning_text, write_tuning_figure, write_tuning_json

    print(tuning_text(args.out, preset.name, args.store))
    fig = write_tuning_figure(args.out, preset.name, store=args.store)
    doc = write_tuning_json(args.out, preset.name, store=args.store)
    if fig is not None:
        print(f"validation curves: {fig}; every candidate: {doc}")
    return 1 if counts["failed"] else 0
