"""The first screen's figures draw the report's own numbers (calibkit.report.evidence)."""

from types import SimpleNamespace

import numpy as np
import pytest

from calibkit.report.calibrated import CalibratedProbs
from calibkit.report.data import summarize
from calibkit.report.paired import seed_interval
from calibkit.store import Store
from tests.report.test_report import make_bench


def test_the_ece_bars_and_their_intervals_are_the_seed_intervals(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from calibkit.report import evidence

    make_bench(tmp_path, methods=("ce", "ls"), seeds=(0, 1))
    summary = summarize(Store(tmp_path / "runs.db", readonly=True).runs("t"))
    probs = CalibratedProbs()
    chosen = {"ce": SimpleNamespace(chosen="temperature"), "ls": SimpleNamespace(chosen="none")}
    figs = []
    monkeypatch.setattr(plt, "close", figs.append)
    fig = evidence.ece_interval_figure(summary, probs, chosen, n_boot=40, seed=0, path=tmp_path / "e.png")
    assert fig.path.stat().st_size > 1000 and "95% bootstrap" in fig.caption
    (ax,) = figs[0].axes
    want = {(m, c): seed_interval(summary[m]["runs"], probs, "ece", after=c, n_boot=40, seed=0)
            for m, c in (("ce", "none"), ("ls", "none"), ("ce", "temperature"), ("ls", "none"))}
    # grey bars (no calibrator) first, then green (the chosen one); methods from the top down
    widths = [b.get_width() for b in ax.patches]
    assert widths == pytest.approx([100 * want[("ce", "none")]["value"], 100 * want[("ls", "none")]["value"],
                                    100 * want[("ce", "temperature")]["value"], 100 * want[("ls", "none")]["value"]])
    lines = [seg for coll in ax.collections for seg in coll.get_segments()]
    ends = [x for seg in lines for x in (seg[0][0], seg[1][0])]
    assert ends == pytest.approx([x for w in (want[("ce", "none")], want[("ls", "none")], want[("ce", "temperature")],
                                              want[("ls", "none")]) for x in (100 * w["lo"], 100 * w["hi"])])
    # methods in the report's order from the top down, each named with its chosen calibrator
    assert [t.get_text() for t in ax.get_yticklabels()] == ["CE + temperature", "LS"]
    assert list(ax.get_yticks()) == [1, 0]
    assert np.all(np.diff([b.get_y() for b in ax.patches[:2]]) < 0)  # CE above LS
