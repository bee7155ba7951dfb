"""Where a bench keeps its runs: one directory per (preset, method, seed)."""

from __future__ import annotations

from pathlib import Path


def run_dir_for(out: Path, preset: str, method: str, seed: int) -> Path:
    """``OUT/runs/<preset>/<method>/seed<k>``: the run directory of one grid run."""
    return Path(out) / "runs" / preset / method / f"seed{seed}"


# Marks the key of a run moved aside after a re-tuning (``preset/method/seed~<values>``; its run
# directory ``seed<k>~<values>``): see ``calibkit.bench.runner.Bench.supersede``.
RETIRED = "~"
