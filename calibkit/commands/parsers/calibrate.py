"""The ``calibkit calibrate`` command line: its options and help (light: ``calibkit calibrate --help`` loads no
torch); the command runs in :mod:`calibkit.commands.calibrate`."""

from __future__ import annotations

import argparse

from calibkit.commands import Handler, add_num_threads
from calibkit.commands import bounded as B

EPILOG = """\
Input, one of: --val FILE --test FILE; --from FILE, with val_*/test_* entries (val_logits,
val_labels, test_logits, test_labels) or split by --split FRACTION (the share for validation,
stratified by class, seeded by --seed); --run DIR, a finished calibkit run (DIR/logits.safetensors).
--logits-key/--probs-key/--labels-key name other entries (after the val_/test_ prefix, if any).
--out defaults to DIR/calibration for --run, else STEM-calibration beside the input file.

Each file (.npz, .safetensors or .pt) holds 'logits' (N, K) and 'labels' (N,), or 'probs' (N, K)
instead of 'logits' (then logits = log(probs), probabilities below 1e-300 raised to it first;
softmax(log p) = p); a file with both is refused. 1-D entries are binary positive-class logits (or
probabilities: logit(p)). Labels are integers (unsigned ones are read as int64). Nothing is
unpickled: object arrays in an .npz and anything but tensors in a .pt are refused.

Warnings (stderr): --val and --test the same file or the same logits and labels (the test numbers
are then not held out); validation labels of one class only; fewer than 2 validation rows per
class (the K and K x K parameter calibrators cannot be fitted reliably). With fewer rows than
classes, matrix and dirichlet are not fitted; the validation table says why.

The calibrator is CHOSEN ON VAL ONLY, by K-fold cross-fitting (--folds, default 5): each calibrator
is fitted on K-1 folds and scored on the held-out fold. Default rule (--select-by nll): the stack
(a mixture of the smooth calibrators and the uncalibrated model, weighted by their out-of-fold log
score) unless another calibrator has a significantly lower cross-fitted NLL (a proper score:
calibration and sharpness together; paired bootstrap, 95% interval below 0), among the calibrators
whose cross-fitted accuracy is at most --acc-tolerance points (default 0.5) below the uncalibrated
model's; SMS, then temperature scaling, stands in where the stack is not fitted or fails that guard,
and the uncalibrated model is always a candidate. --select-by brier uses the Brier score the same way; --select-by ece
ranks by the ECE, guarded by NLL, and a challenger must then beat
temperature scaling significantly. ECE is always shown.
The output starts with the recommendation (test ECE, NLL, accuracy with bootstrap intervals, the
paired difference from temperature scaling, the runner-up), then the validation table the choice
was made on, then every calibrator's test numbers for reference (never a ranking): ECE x100 with
its interval, the paired difference from TS (* significantly lower, ! higher), classwise ECE, NLL
(flagged when rows get a zero true-class probability), accuracy, its change and the share of
predictions the calibrator changed. Then, for reference, the selective prediction (AURC, AUGRC) and
APS conformal sets at --alpha (default 0.1) of the uncalibrated model, temperature scaling and the
chosen calibrator (--full-report: of every calibrator): the calibrator refitted on one half of
the validation rows, the set threshold on the other half, coverage and mean set size on test, with
paired intervals against TS. Writes DIR/report/calibrators.md, results.json, selection.json, sets.json,
reliability_<name>.png (of the same calibrators as the sets) and index.html (the tables, the
reliability diagrams before/after); --save writes the chosen calibrator as DIR/NAME.safetensors +
DIR/NAME.json (NAME: its own name; the uncalibrated choice, none, as temperature 1), --save NAME that
one, for `calibkit apply` and calibkit.calibrators.load. Bad files change nothing on disk. LightGBM
(extra boost) runs only when --calibrators names it.

examples:
  calibkit calibrate --from outputs.npz --split 0.5 --save
  calibkit calibrate --run runs/smoke/runs/smoke/ce/seed0 --save
  calibkit calibrate --val val.npz --test test.npz --out calib --save dirichlet
"""


CHOSEN = "chosen"  # --save without a name
CHOSEN_NAMES = (CHOSEN, "best")  # --save values that mean the chosen calibrator


def add_source_options(p) -> None:
    """The input options of ``calibkit calibrate``: one source of
    :func:`calibkit.commands.calibsources.read_sources`, and the entries' key names."""
    g = p.add_argument_group("input (one of --val/--test, --from, --run)")
    g.add_argument("--val", metavar="FILE", help="validation logits/probs + labels (fitting)")
    g.add_argument("--test", metavar="FILE", help="test logits/probs + labels (scoring)")
    g.add_argument("--from", dest="from_file", metavar="FILE",
                   help="one file: val_*/test_* entries, or plain entries split by --split")
    g.add_argument("--split", type=B.fraction(), metavar="FRACTION",
                   help="with --from: the share of rows for validation, in (0, 1), stratified by class, seeded "
                        "by --seed")
    g.add_argument("--run", metavar="DIR", help="a finished calibkit run: reads DIR/logits.safetensors")
    g.add_argument("--logits-key", metavar="NAME", help="the entry holding logits (default: logits, or probs)")
    g.add_argument("--probs-key", metavar="NAME", help="the entry holding probabilities instead of logits")
    g.add_argument("--labels-key", metavar="NAME", default="labels", help="the labels' entry (default: labels)")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "calibrate", help="fit every post-hoc calibrator on validation logits, choose one on validation, score on test",
        description="Fit every post-hoc calibrator on a trained model's validation logits, choose one by "
        "cross-fitting on the validation split, and report it and every other calibrator on the test logits "
        "with bootstrap intervals and the paired difference from temperature scaling; write DIR/report/.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_source_options(p)
    p.add_argument("--out", metavar="DIR", help="output directory (default: RUN/calibration for --run, else "
                                                 "STEM-calibration beside the input file)")
    p.add_argument("--calibrators", metavar="A,B",
                   help="comma-separated subset of the registry and 'stack' (the mixture of the smooth ones among "
                        "them; default: all, and the stack)")
    p.add_argument("--save", metavar="NAME", nargs="?", const=CHOSEN,
                   help="store a fitted calibrator as DIR/NAME.safetensors + .json; without NAME (or with 'chosen' "
                        "or 'best'): the chosen one")
    p.add_argument("--n-bins", type=B.N_BINS, default=15, help="bins of the binned errors (default 15)")
    p.add_argument("--n-boot", type=B.N_BOOT, default=1000, help="bootstrap resamples (default 1000)")
    p.add_argument("--seed", type=B.SEED, default=0, help="bootstrap seed, an integer >= 0 (default 0)")
    p.add_argument("--dpi", type=B.DPI, default=120, help="resolution of the reliability diagrams (default 120)")
    p.add_argument("--select-by", choices=("ece", "nll", "brier"), default="nll",
                   help="cross-fitted validation metric that chooses the calibrator (default nll, a proper score; "
                        "ece is guarded by accuracy and NLL)")
    p.add_argument("--acc-tolerance", type=B.number(0.0, 100.0), default=0.5, metavar="POINTS",
                   help="largest accepted drop of cross-fitted accuracy, in points (default 0.5)")
    p.add_argument("--folds", type=B.integer(2, 1000), default=5,
                   help="cross-fitting folds of the validation split (default 5)")
    p.add_argument("--alpha", type=B.ALPHA, default=0.1,
                   help="miscoverage of the conformal prediction sets, in (0, 1) (default 0.1: 90%% coverage)")
    p.add_argument("--full-report", action="store_true",
                   help="conformal sets and reliability diagrams of every calibrator (default: of the chosen one, "
                        "temperature scaling and the uncalibrated model only)")
    p.add_argument("--timings", action="store_true", help="print where the time went")
    p.add_argument("--jobs", type=B.integer(1, 1024), metavar="N",
                   help="processes that fit the calibrators (default: 1 for small inputs, one per core up to 4 once "
                        "rows x K^2 >= 2e6; the numbers do not depend on it: docs/performance.md)")
    add_num_threads(p, default="1, whatever the machine, so that the numbers do not depend on its cores")
    p.set_defaults(func=Handler("calibkit.commands.calibrate"))

