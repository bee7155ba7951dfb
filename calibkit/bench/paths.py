"""Where a bench keeps its runs: one directory per (preset, method, seed), one per tuning candidate.

The layout is written in :mod:`calibkit.store.files` (the result-file store reads it too).
"""

from __future__ import annotations

from calibkit.store.files import candidate_dir_for, run_dir_for

__all__ = ["RETIRED", "candidate_dir_for", "run_dir_for"]

# Marks the key of a run moved aside after a re-tuning (``preset/method/seed~<values>``; its run
# directory ``seed<k>~<values>``): see ``calibkit.bench.runner.Bench.supersede``.
RETIRED = "~"
