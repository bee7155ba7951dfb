"""``calibkit plot DIR``: reliability diagram and confidence histogram, before and after temperature scaling."""

from __future__ import annotations

import argparse
from typing import Any

from calibkit.commands import bounded as B
from calibkit.errors import UserError

EPILOG = """\
Writes four PNG files into DIR (or --out):
  reliability.png      reliability_ts.png      (accuracy vs confidence per bin, with the gap and
                                               the 90% consistency band: where a calibrated
                                               model's bars would lie, per bin)
  confidence.png       confidence_ts.png       (histogram of confidences, mean accuracy/confidence)
The *_ts files use the temperature fitted on the validation logits.

example:
  calibkit plot runs/ce
  calibkit plot runs/ce --out figures/ce

--out refuses another run's directory (it holds config.json) and a bench directory (runs.db).
"""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "plot", help="reliability diagrams and confidence histograms of a run (PNG)",
        description="Draw the reliability diagram and the confidence histogram of a finished run's test "
        "predictions, before and after temperature scaling fitted on its validation logits.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_dir", metavar="DIR", help="run directory written by calibkit train")
    p.add_argument("--out", metavar="DIR", help="where to write the PNGs (default: the run directory)")
    p.add_argument("--n-bins", type=B.N_BINS, default=15, help="confidence bins (default 15)")
    p.add_argument("--dpi", type=B.DPI, default=150, help="resolution of the PNGs (default 150)")
    from calibkit.commands import add_num_threads

    add_num_threads(p)
    p.set_defaults(func=run)


def _check_out(out, run_dir) -> None:
    """The PNGs go into the run's own directory, or a folder that is no other run's or bench's."""
    from calibkit.bench.paths import directory_owner

    owner = None if out.resolve() == run_dir.resolve() else directory_owner(out)
    if owner:
        raise UserError(f"--out {out} is {owner}; plot would overwrite its files. Give a new or plain folder, "
                         f"or leave --out out to write into {run_dir}")


def run(args) -> int:
    from pathlib import Path

    from calibkit.rundir import load_info, load_logits

    if args.dpi < 10:
        raise UserError(f"dpi: must be >= 10, got {args.dpi}")
    logits = load_logits(args.run_dir)  # a missing or unfinished run fails here, before plotting imports
    c = load_info(args.run_dir)["config"]
    out = Path(args.out) if args.out else Path(args.run_dir)
    _check_out(out, Path(args.run_dir))

    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    from calibkit import plots
    from calibkit.calibrators import TemperatureScaling
    out.mkdir(parents=True, exist_ok=True)
    ts = TemperatureScaling().fit(logits["val_logits"], logits["val_labels"])
    labels = logits["test_labels"]
    name = f"{c['model']} / {c['loss']}" + ("" if c["method"] == "standard" else f" / {c['method']}")
    for suffix, probs, title in (
        ("", logits["test_logits"].double().softmax(1), name),
        ("_ts", ts.predict_proba(logits["test_logits"]), f"{name}, TS T={ts.temperature_:.2f}"),
    ):
        band: dict[str, Any] = {"band": True, "band_kind": "consistency"}
        for stem, draw, extra in (("reliability", plots.reliability_diagram, band),
                                  ("confidence", plots.confidence_histogram, {})):
            fig, ax = plt.subplots(figsize=(4.5, 4.5))
            draw(probs, labels, n_bins=args.n_bins, ax=ax, title=title, **extra)
            path = out / f"{stem}{suffix}.png"
            fig.savefig(path, dpi=args.dpi, bbox_inches="tight")
            plt.close(fig)
            print(f"wrote {path}")
    return 0
