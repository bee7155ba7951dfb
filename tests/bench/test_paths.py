"""``calibkit.bench.paths``: the on-disk layout of a bench directory (documented in docs/bench.md)."""

from pathlib import Path

from calibkit.bench.paths import candidate_dir_for, run_dir_for


def test_a_grid_run_lives_under_runs_preset_method_seed():
    assert run_dir_for("out", "default", "mbls", 3) == Path("out/runs/default/mbls/seed3")
    assert run_dir_for(Path("/b"), "p+epochs=1", "ce", 0) == Path("/b/runs/p+epochs=1/ce/seed0")


def test_a_tuning_candidate_lives_under_tune_and_ce_is_its_seed_run():
    assert candidate_dir_for("out", "default", "ls", 1, "alpha=0.1") == Path("out/tune/default/ls/alpha=0.1")
    # CE has nothing to tune: its candidate is the CE run of the selection seed, shared with the bench
    assert candidate_dir_for("out", "default", "ce", 1, "none") == run_dir_for("out", "default", "ce", 1)
    assert candidate_dir_for("out", "default", "ce", 2, "x") == Path("out/runs/default/ce/seed2")

