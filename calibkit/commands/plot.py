"""``calibkit plot DIR``: reliability diagram and confidence histogram, before and after temperature scaling."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.pyplot as plt

from calibkit import plots
from calibkit.bench.paths import directory_owner
from calibkit.calibrators import TemperatureScaling
from calibkit.errors import UserError
from calibkit.rundir import load_info, load_logits


def _check_out(out, run_dir) -> None:
    """The PNGs go into the run's own directory, or a folder that is no other run's or bench's."""
    owner = None if out.resolve() == run_dir.resolve() else directory_owner(out)
    if owner:
        raise UserError(f"--out {out} is {owner}; plot would overwrite its files. Give a new or plain folder, "
                         f"or leave --out out to write into {run_dir}")


def run(args) -> int:
    if args.dpi < 10:
        raise UserError(f"dpi: must be >= 10, got {args.dpi}")
    logits = load_logits(args.run_dir)  # a missing or unfinished run fails here, before plotting imports
    c = load_info(args.run_dir)["config"]
    out = Path(args.out) if args.out else Path(args.run_dir)
    _check_out(out, Path(args.run_dir))

    matplotlib.use("Agg")  # files only; never needs a display

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
