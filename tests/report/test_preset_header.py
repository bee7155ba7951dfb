"""The bench report's header says what ran (from the runs), and the preset's note only as what it is."""

from dataclasses import replace

from calibkit.bench.grid import PRESETS
from calibkit.report.preset import effective_settings, note_for_runs


def _rows(methods, seeds, epochs):
    """Rows as a bench records them: the preset's training settings under ``train``."""
    return [{"method": m, "seed": s, "config": {"train": {"epochs": epochs.get(m, epochs.get("*")), "lr": 0.1}}}
            for m in methods for s in seeds]


def test_the_settings_come_from_the_finished_runs():
    assert effective_settings(_rows(["ce", "ls"], [0], {"*": 3})) == "2 methods (ce, ls), 1 seed (0), 3 epochs"
    assert effective_settings(_rows(["ce"], [0, 1], {"*": 1})) == "1 method (ce), 2 seeds (0, 1), 1 epoch"
    assert (effective_settings(_rows(["ce", "maccal"], [1, 0], {"ce": 6, "maccal": 2}))
            == "2 methods (ce, maccal), 2 seeds (0, 1), 2-6 epochs (by method)")
    assert effective_settings([{"method": "ce", "seed": 0}]).endswith("epochs not recorded")
    # a method's own training override wins over the preset's; a run's flat config.json is read too
    over = [{"method": "ce", "seed": 0, "config": {"train": {"epochs": 40}}},
            {"method": "ls", "seed": 0, "config": {"train": {"epochs": 40}, "train_overrides": {"epochs": 10}}},
            {"method": "focal", "seed": 0, "config": {"epochs": 40}}]
    assert effective_settings(over) == "3 methods (ce, ls, focal), 1 seed (0), 10-40 epochs (by method)"


def test_a_bench_row_of_a_real_preset_states_its_epochs(tmp_path):
    from calibkit.bench.producers import RunFactory
    from calibkit.distributed import Dist

    factory = RunFactory(PRESETS["smoke"], tmp_path, Dist())
    rows = [{"method": m, "seed": 0, "config": factory.config_record(m, 0)} for m in ("ce", "maccal")]
    epochs = PRESETS["smoke"].train["epochs"]
    assert effective_settings(rows) == f"2 methods (ce, maccal), 1 seed (0), {epochs} epochs"


def test_the_note_is_labelled_when_the_runs_changed_the_preset():
    preset = replace(PRESETS["smoke"], note="tiny, 2 epochs, 2 seeds", seeds=(0, 1))
    preset = replace(preset, train={**preset.train, "epochs": 2})
    same = _rows(["ce"], [0, 1], {"*": 2})
    assert note_for_runs("smoke", preset, same) == "tiny, 2 epochs, 2 seeds"
    labelled = "The preset as written (these runs changed its settings, see above): tiny, 2 epochs, 2 seeds"
    assert note_for_runs("smoke", preset, _rows(["ce"], [0], {"*": 2})) == labelled  # --seeds 0
    three = replace(preset, train={**preset.train, "epochs": 3})  # the effective preset of --epochs 3
    assert note_for_runs("smoke+epochs=3", three, _rows(["ce"], [0, 1], {"*": 3})) == labelled
    assert note_for_runs("smoke", replace(preset, note=""), same) == ""
    assert note_for_runs("smoke", preset, [{"method": "ce", "seed": s} for s in (0, 1)]) == preset.note  # unknown


def test_the_built_report_states_the_runs_settings_under_its_title(tmp_path):
    from calibkit.report import build_report
    from tests.report.test_report import make_bench

    make_bench(tmp_path, methods=("ce", "ls"), seeds=(1,))
    rep = build_report(tmp_path, n_boot=20, figures=False, width=0)
    want = "Runs: 2 methods (ce, ls), 1 seed (1), epochs not recorded."  # make_bench records no epochs
    assert rep["text"].splitlines()[1] == want
    assert want in (tmp_path / "report" / "report.md").read_text().split("\n## ")[0]  # in the intro
