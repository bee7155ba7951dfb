"""Select again from a stored tuning run: the recorded rule and the current one, per method.

    .venv/bin/python tools/retune_stored.py [docs/tuning/default.json]

A stored tuning run (``calibkit.report.tuning.write_tuning_json``) keeps every candidate's
validation metrics and the criterion its selection was made by. For each method with a search
space this prints the recorded selection, the recorded criterion applied again (it must give the
recorded selection back), the current rule's selection (``calibkit.bench.selection_rule``), the
accuracy window of each rule in points and what falls outside it, and, when the current rule's
selection lies on a grid edge, the value ``calibkit tune`` would add there
(``calibkit.bench.extend.plan``). Nothing is trained; the test split is not in the file.

Exit status 1 when the recorded criterion does not give the recorded selection back (the file and
the grids disagree), else 0.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from calibkit.bench.extend import plan
from calibkit.bench.grid import BENCH_METHODS
from calibkit.bench.selection_rule import DEFAULT_CRITERION, Criterion, eligible, select
from calibkit.bench.space import at_edge, candidates, slug

DEFAULT_FILE = Path(__file__).resolve().parents[1] / "docs" / "tuning" / "default.json"


def _values(hparams: dict) -> str:
    return ", ".join(f"{a.partition('.')[2]}={float(v):g}" for a, v in sorted(hparams.items()))


def _window(rows: list[dict], criterion: Criterion) -> str:
    """The window's width in points against the least accurate candidate (its widest), and the
    candidates outside it."""
    best = max(rows, key=lambda c: c["metrics"]["acc"])["metrics"]
    worst = min(rows, key=lambda c: c["metrics"]["acc"])["metrics"]
    inside = set(eligible(rows, criterion))
    out = [_values(c["hparams"]) for i, c in enumerate(rows) if i not in inside]
    return f"{100 * criterion.window(best, worst):.2f} points; outside: {'; '.join(out) or 'none'}"


def retune(doc: dict, criterion: Criterion = DEFAULT_CRITERION) -> list[dict]:
    """Per method of the stored run (grid order of ``calibkit.bench.grid.BENCH_METHODS``): the recorded,
    re-derived and current selections, the windows, and the edge notes of the current one."""
    recorded = Criterion.from_dict(doc.get("criterion"))
    out = []
    for method, spec in BENCH_METHODS.items():
        stored = {slug(c["hparams"]): c for c in doc["candidates"] if c["method"] == method}
        if not spec.space or not stored:
            continue
        rows = [stored[slug(v)] for v in candidates(method) if slug(v) in stored]  # grid order
        chosen = next((c["hparams"] for c in rows if c["selected"]), None)
        again = rows[select(rows, spec.space, recorded)]["hparams"]
        new = rows[select(rows, spec.space, criterion)]["hparams"]
        _, notes = plan(spec.space, None, new)
        out.append({"method": method, "recorded": chosen, "recorded_rule": again, "current_rule": new,
                    "changed": new != chosen, "edge": at_edge(new, spec.space), "notes": notes,
                    "old_window": _window(rows, recorded), "new_window": _window(rows, criterion)})
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    path = Path(argv[0]) if argv else DEFAULT_FILE
    doc = json.loads(path.read_text())
    print(f"{path}: recorded criterion {doc.get('criterion')}; current {DEFAULT_CRITERION.to_dict()}")
    status = 0
    for r in retune(doc):
        label = BENCH_METHODS[r["method"]].label
        same = r["recorded_rule"] == r["recorded"]
        status |= not same
        print(f"{label}: recorded {_values(r['recorded'] or {})}"
              f"{'' if same else ' (the recorded criterion gives ' + _values(r['recorded_rule']) + '!)'}; "
              f"current rule {_values(r['current_rule'])}{' (CHANGED)' if r['changed'] else ''}")
        print(f"    recorded window {r['old_window']}")
        print(f"    current window  {r['new_window']}")
        for note in r["notes"]:
            print(f"    edge: {note}")
    return status


if __name__ == "__main__":
    sys.exit(main())
