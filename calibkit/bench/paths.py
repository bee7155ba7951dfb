"""Where a bench keeps its runs: one directory per (preset, method, seed), one per tuning candidate."""

from __future__ import annotations

from pathlib import Path

# The reference method: its tuning candidate is the ordinary CE run of the selection seed.
_CE = "ce"


def run_dir_for(out: Path, preset: str, method: str, seed: int) -> Path:
    """``OUT/runs/<preset>/<method>/seed<k>``: the run directory of one grid run."""
    return Path(out) / "runs" / preset / method / f"seed{seed}"


def candidate_dir_for(out: Path, preset: str, method: str, seed: int, slug: str) -> Path:
    """The run directory of one tuning candidate: ``OUT/tune/<preset>/<method>/<values>``
    (CE's, which has nothing to tune, is the CE run of the selection seed)."""
    if method == _CE:
        return run_dir_for(out, preset, method, seed)
    return Path(out) / "tune" / preset / method / slug


# Marks the key of a run moved aside after a re-tuning (``preset/method/seed~<values>``; its run
# directory ``seed<k>~<values>``): see ``calibkit.bench.runner.Bench.supersede``.
RETIRED = "~"
