"""Which per-method reliability figures a report draws: every method's, or (the preset's
``report_figures = "ce-and-chosen"``, the smoke preset's) CE's and the recommended method's only,
every method's again on request (``all_figures``, ``--all-figures``); the report links exactly the
figures it drew."""

import calibkit.report
from calibkit import cli
from calibkit.bench.grid import PRESETS, Preset
from calibkit.bench.presetfile import write_effective
from calibkit.commands.bench import options_from_args
from calibkit.report import build_report
from tests.report.test_report import make_bench

METHODS = ("ce", "ls", "focal")


def _bench(tmp_path, figures: str):
    make_bench(tmp_path, methods=METHODS, seeds=(0,))
    write_effective(Preset(name="t", dataset="fmnist", model="mlp", seeds=(0,), train={}, n_boot=20,
                           report_calibrators=("temperature", "histogram"), report_figures=figures), tmp_path)


def _drawn(tmp_path) -> set[str]:
    """The methods with a reliability figure in ``figures/`` (the evidence's CE-vs-chosen figure is not one)."""
    names = {p.stem.removeprefix("reliability_") for p in (tmp_path / "report" / "figures").glob("reliability_*.png")}
    return names - {"ce_vs_chosen"}


def _linked(tmp_path, rep) -> set[str]:
    """The methods whose reliability figure the report shows: in its figures, report.md and index.html."""
    md = (tmp_path / "report" / "report.md").read_text()
    page = (tmp_path / "report" / "index.html").read_text()
    shown = {m for m in METHODS if f"reliability_{m}" in rep["paths"]["figures"]}
    assert shown == {m for m in METHODS if f"](figures/reliability_{m}.png)" in md}
    figures = [f for s in rep["sections"] for f in s.figures]
    assert page.count("data:image/png;base64,") == len(figures) == md.count("](figures/")
    return shown


def test_the_smoke_preset_draws_ce_and_the_recommended_method_only(tmp_path):
    assert PRESETS["smoke"].report_figures == "ce-and-chosen"
    assert {p.report_figures for n, p in PRESETS.items() if n != "smoke"} == {"all"}
    _bench(tmp_path, "ce-and-chosen")
    every = build_report(tmp_path, width=0, all_figures=True)  # asked for: every method's
    assert _drawn(tmp_path) == _linked(tmp_path, every) == set(METHODS)
    rep = build_report(tmp_path, width=0)
    want = {"ce", rep["recommendation"]["method"]}
    # the figures of the other methods, drawn by the build before, are removed and not linked
    assert _drawn(tmp_path) == _linked(tmp_path, rep) == want
    (section,) = [s for s in rep["sections"] if s.title == "Figures"]
    names = ", ".join({"ce": "CE", "ls": "LS", "focal": "Focal"}[m] for m in METHODS if m in want)
    assert section.text.endswith(f" Drawn for CE and the recommended method only ({names}): the preset's "
                                 "`report_figures = \"ce-and-chosen\"`; `calibkit report DIR --all-figures` draws "
                                 "every method's.")
    assert rep["text"] == every["text"]  # the printed numbers do not depend on the figures


def test_without_ce_the_caption_names_what_was_drawn(tmp_path):
    """A bench without CE under "ce-and-chosen" has no recommendation: no per-method figure is drawn,
    and the caption says so instead of naming CE's."""
    make_bench(tmp_path, methods=("ls", "focal"), seeds=(0,))
    write_effective(Preset(name="t", dataset="fmnist", model="mlp", seeds=(0,), train={}, n_boot=20,
                           report_calibrators=("temperature", "histogram"), report_figures="ce-and-chosen"), tmp_path)
    rep = build_report(tmp_path, width=0)
    (section,) = [s for s in rep["sections"] if s.title == "Figures"]
    drawn = _drawn(tmp_path)
    assert rep["recommendation"] is None  # the recommendation is measured against CE + TS
    assert drawn == set() and "CE and" not in section.text and "CE only" not in section.text
    assert " Drawn for no method (no CE run, no recommendation): the preset's " in section.text


def test_the_default_draws_every_method_and_says_nothing_more(tmp_path):
    _bench(tmp_path, "all")
    rep = build_report(tmp_path, width=0)
    assert _drawn(tmp_path) == _linked(tmp_path, rep) == set(METHODS)
    (section,) = [s for s in rep["sections"] if s.title == "Figures"]
    assert section.text.endswith("One seed per method (the lowest).")


def test_report_and_bench_take_all_figures(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(calibkit.report, "build_report", lambda *a, **k: calls.append(k) or {
        "text": "", "paths": {"html": "h", "md": "m"}})
    (tmp_path / "runs.db").write_bytes(b"")
    for flags in ([], ["--all-figures"]):
        assert cli.main(["report", str(tmp_path), "--quiet", *flags]) == 0
    assert [k["all_figures"] for k in calls] == [False, True]
    args = cli.build_parser().parse_args(["bench", "--preset", "smoke", "--out", str(tmp_path), "--all-figures"])
    assert options_from_args(args).all_figures is True
