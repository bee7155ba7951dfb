"""The report's tables, built once and rendered as terminal text (fitted to a width) or Markdown.

A :class:`Table` holds strings only, plus which cells are the best of their column; the HTML
renderer (:mod:`calibkit.report.render`) reads the same object.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field

from calibkit.bench.grid import REFERENCE
from calibkit.report.calibrated import GRID_METRICS
from calibkit.report.data import fmt, fmt_delta, fmt_interval, label, mean_std, ranking

# (key, header, scale, decimals) of the grid-order tables; scale 100 = reported x100.
BEFORE_COLS = (("acc", "Acc", 100, 2), ("ece", "ECE", 100, 2), ("aece", "AECE", 100, 2),
               ("cece", "cwECE", 100, 2), ("o_ece", "O-ECE", 100, 2), ("u_ece", "U-ECE", 100, 2),
               ("mce", "MCE", 100, 1), ("nll", "NLL", 1, 3), ("brier", "Brier", 1, 3))
AFTER_COLS = (("temperature", "T", 1, 2), ("acc", "Acc", 100, 2), ("ece", "ECE", 100, 2),
              ("aece", "AECE", 100, 2), ("nll", "NLL", 1, 3))
MIOU_COL = ("miou", "mIoU", 100, 2)  # shown when the runs report it (segmentation)
EXTRA_COLS = (("auroc_entropy", "AUROC-H", 100, 1), ("auroc_maxconf", "AUROC-MSP", 100, 1),
              ("shift_acc", "Shift acc", 100, 1), ("shift_ece", "Shift ECE", 100, 2),
              ("train_time_s", "Train s", 1, 1))
# The ranked summary: (stat key, header, which value is best: max, min or None = not compared).
# O-ECE and U-ECE split the ECE (O + U = ECE) and are shown, not ranked.
SUMMARY_COLS = (("before.acc", "Acc", max), ("before.ece", "ECE", min), ("before.o_ece", "O-ECE", None),
                ("before.u_ece", "U-ECE", None), ("after.ece", "ECE (TS)", min))
DELTA_HEADER = "dECE vs CE [95% CI]"
NLL_FLAG = "\u2020"  # an NLL cell some of whose test rows have a (near) zero true-class probability
BEST_MARK = "<"  # terminal marker of the best value of a column
ROW_BEST_MARK = ">"  # terminal marker of the best value of a row (methods x calibrators tables)
# The ranking's paired columns (calibkit.report.paired.comparisons), when they are computed.
ACC_DELTA_HEADER = "dAcc vs CE"
CE_TS_HEADERS = ("dECE vs CE+TS", "dECE(TS) vs CE+TS")


@dataclass
class Table:
    """A table of strings. ``best`` holds ``(row, column)`` of the cells marked best in their column;
    the first ``key_columns`` columns are left-aligned labels (repeated when a table is split)."""

    header: list[str]
    rows: list[list[str]]
    best: set = field(default_factory=set)
    key_columns: int = 1
    row_best: set = field(default_factory=set)


def ranked_table(summary: dict, deltas: dict, comps: dict | None = None) -> Table:
    """Methods ranked by test ECE before TS (x100, mean over seeds), best value per column marked.

    Columns: rank, method, accuracy, ECE, O-ECE, U-ECE, ECE after temperature scaling and the
    paired-bootstrap ECE difference from CE. Best = highest accuracy, lowest ECE / ECE after TS,
    most negative difference from CE; values equal at the printed precision are all marked.

    With ``comps`` (:func:`calibkit.report.paired.comparisons`) the table adds the accuracy
    difference from CE after the accuracy, bootstrap intervals to O-ECE and U-ECE, and the ECE
    differences from CE + TS of the method before and after its own TS (best: highest accuracy
    difference, most negative ECE differences).
    """
    cols = _ranked_columns(comps is not None)
    header = ["#", "Method"] + [h for _, h, _, _ in cols] + [DELTA_HEADER]
    if comps is not None:
        header += list(CE_TS_HEADERS)
    rows, numbers = [], []
    for rank, method in ranking(summary):
        comp = (comps or {}).get(method) or {}
        cells, nums = _column_cells(method, summary[method]["stats"], comp, cols)
        extra = [deltas.get(method)] + ([comp.get("vs_ce_ts"), comp.get("ts_vs_ce_ts")] if comps is not None else [])
        delta_cells, delta_nums = _delta_cells(method, extra)
        rows.append([str(rank) if rank else "-", label(method), *cells, *delta_cells])
        numbers.append(nums + delta_nums)
    pick = [c for _, _, c, _ in cols] + [min] * (3 if comps is not None else 1)
    return Table(header, rows, _best_cells(numbers, pick, offset=2), key_columns=2)


def _ranked_columns(paired: bool) -> list[tuple]:
    """``(stat key, header, best-of, kind)`` of the ranking's metric columns; ``kind`` None is a
    plain statistic, ``"delta"`` a paired difference from CE, ``"interval"`` a statistic with its
    bootstrap interval (the last two only with the paired comparisons)."""
    cols: list[tuple] = [(key, head, choose, None) for key, head, choose in SUMMARY_COLS]
    if not paired:
        return cols
    cols.insert(1, ("acc_vs_ce", ACC_DELTA_HEADER, max, "delta"))
    return [(k, f"{h} [95% CI]", None, "interval") if k in ("before.o_ece", "before.u_ece") else (k, h, c, kind)
            for k, h, c, kind in cols]


def _column_cells(method: str, stats: dict, comp: dict, cols: list[tuple]) -> tuple[list[str], list]:
    """A method's cells of the metric columns, and their values (x100, as printed) for the best marks."""
    cells, nums = [], []
    for key, _, _, kind in cols:
        if kind == "delta":
            d = comp.get(key)
            cells.append("(reference)" if method == REFERENCE else fmt_delta(d, "acc"))
            nums.append(round(d["diff"] * 100, 2) if d else None)
        elif kind == "interval":
            ci = comp.get(key.split(".")[1])
            cells.append(fmt_interval(ci) if ci else fmt(stats.get(key) and (stats[key][0], float("nan"), 1), 100, 2))
            nums.append(None)
        else:
            stat = stats.get(key)
            cells.append(fmt(stat and (stat[0], float("nan"), 1), 100, 2))
            nums.append(round(stat[0] * 100, 2) if stat else None)
    return cells, nums


def _delta_cells(method: str, deltas: list) -> tuple[list[str], list]:
    """Cells and values of the paired ECE differences: from CE, then (paired) from CE + TS before
    and after the method's own TS. CE is its own reference, except CE before TS against CE + TS."""
    cells, nums = [], []
    for i, d in enumerate(deltas):
        reference = method == REFERENCE and i != 1
        cells.append("(reference)" if reference else fmt_delta(d))
        nums.append(round(d["diff"] * 100, 2) if d and not reference else None)
    return cells, nums


def _best_cells(numbers: list[list], pick: list, offset: int) -> set:
    """``(row, column)`` of the best values of each compared column (``pick[j]``: max, min or None);
    a column with fewer than two values marks nothing, and ties at the printed precision are all marked."""
    best = set()
    for j, choose in enumerate(pick):
        values = [n[j] for n in numbers if n[j] is not None]
        if choose is None or len(values) < 2:
            continue
        target = choose(values)
        best |= {(i, j + offset) for i, n in enumerate(numbers) if n[j] == target}
    return best


def calibrator_tables(grid: dict, chosen: dict | None = None) -> list[Table]:
    """One methods x calibrators table per metric of :data:`calibkit.report.calibrated.GRID_METRICS`
    (``grid``: :func:`calibkit.report.calibrated.calibrator_grid`): the seed mean of the test
    metric after each calibrator (``none`` = before any). These are test numbers shown for
    reference: no cell is marked as the lowest of a row or column (a minimum over many test cells is
    a selection on test, biased low); an NLL cell is flagged :data:`NLL_FLAG` when a run's test rows
    include true-class probabilities below 1e-12, and ``changed %`` is the share of test predictions
    the calibrator moved. ``chosen`` (``{method: calibrator}``, chosen on validation by
    :mod:`calibkit.report.verdict`) marks each method's chosen calibrator (``row_best``). A
    calibrator that failed on a method's runs shows ``-``."""
    methods = list(grid)
    names = list(next(iter(grid.values()))) if grid else []
    chosen = chosen or {}
    marks = {(i, names.index(chosen[m]) + 1) for i, m in enumerate(methods) if chosen.get(m) in names}
    tables = []
    for key, head, scale, dec in GRID_METRICS:
        def cell(m, c, key=key, scale=scale, dec=dec):
            g = grid[m][c]
            if g is None or key not in g:
                return "-"
            flag = f" {NLL_FLAG}" if key == "nll" and g.get("zero_rows") else ""
            return f"{g[key][0] * scale:.{dec}f}{flag}"
        rows = [[label(m)] + [cell(m, c) for c in names] for m in methods]
        if any(r[1:].count("-") < len(names) for r in rows):
            tables.append(Table([f"Method ({head})"] + names, rows, set(), row_best=set(marks)))
    return tables


def grid_tables(summary: dict, deltas: dict, pm: str = "+-") -> tuple[Table, Table]:
    """The two grid-order tables: test metrics before TS (with the difference from CE), then after
    TS, OOD AUROC, corrupted test sets and training time (mean +- std over seeds).

    Segmentation runs (those reporting ``miou``) add an mIoU column to both tables and leave out
    the extra columns no run reports (OOD and shift)."""
    dense = any("before.miou" in e["stats"] for e in summary.values())
    before_cols, after_cols = (BEFORE_COLS + (MIOU_COL,), AFTER_COLS + (MIOU_COL,)) if dense \
        else (BEFORE_COLS, AFTER_COLS)
    def reported(c):
        return any(f"extra.{c[0]}" in e["stats"] for e in summary.values())

    # dense runs: only the extra columns some run reports; others drop the OOD columns when no run
    # measured OOD detection (ood = none)
    ood = any(reported(c) for c in EXTRA_COLS if c[0].startswith("auroc"))
    extra_cols = tuple(c for c in EXTRA_COLS if reported(c) or (not dense and (ood or not c[0].startswith("auroc"))))
    head1 = ["Method", "n"] + [h for _, h, _, _ in before_cols] + [DELTA_HEADER]
    head2 = ["Method"] + [f"{h} (TS)" if k != "temperature" else h for k, h, _, _ in after_cols] + \
        [h for _, h, _, _ in extra_cols]
    rows1, rows2 = [], []
    for method, entry in summary.items():
        s = entry["stats"]
        rows1.append([label(method), str(len(entry["seeds"]))]
                     + [fmt(s.get(f"before.{k}"), sc, d, pm) for k, _, sc, d in before_cols]
                     + [fmt_delta(deltas.get(method)) if method != REFERENCE else "(reference)"])
        rows2.append([label(method)] + [fmt(s.get(f"after.{k}"), sc, d, pm) for k, _, sc, d in after_cols]
                     + [fmt(s.get(f"extra.{k}"), sc, d, pm) for k, _, sc, d in extra_cols])
    return Table(head1, rows1), Table(head2, rows2)


def robustness_table(summary: dict, pm: str = "+-") -> Table | None:
    """ECE and accuracy on the corrupted test sets per severity (x100), or None without any."""
    sevs = sorted({s for e in summary.values() for r in e["runs"]
                   for s in ((r.get("robustness") or {}).get("by_severity") or {})}, key=int)
    if not sevs:
        return None
    header = ["Method"] + [f"ECE s{s}" for s in sevs] + [f"Acc s{s}" for s in sevs]
    rows = []
    for method, entry in summary.items():
        cells = [label(method)]
        for key in ("ece", "acc"):
            for s in sevs:
                xs = [r["robustness"]["by_severity"][s][key] for r in entry["runs"]
                      if s in ((r.get("robustness") or {}).get("by_severity") or {})]
                cells.append(fmt(mean_std(xs) if xs else None, 100, 2, pm))
        rows.append(cells)
    return Table(header, rows)


def _marked(table: Table) -> list[list[str]]:
    """Cells for the terminal: ASCII ``+-``, best cells of their column suffixed with
    :data:`BEST_MARK`, of their row with :data:`ROW_BEST_MARK`."""
    return [[c.replace("±", "+-") + (BEST_MARK if (i, j) in table.best else "")
             + (ROW_BEST_MARK if (i, j) in table.row_best else "") for j, c in enumerate(r)]
            for i, r in enumerate(table.rows)]


def _chunks(widths: list[int], keys: int, width: int) -> list[list[int]]:
    """Column indices of each part when a table of these column widths must fit ``width``.

    The label columns (the first ``keys``) start every part. The other columns are cut into the
    fewest contiguous parts that fit, balanced so that the widest part is as narrow as possible
    (no part of one stray column); a column too wide on its own still gets a part.
    """
    base = sum(widths[:keys]) + 2 * (keys - 1)
    cols = list(range(keys, len(widths)))
    n = len(cols)

    def span(i, j):  # printed width of a part holding cols[i:j]
        return base + sum(2 + widths[c] for c in cols[i:j])

    # best[j] = (parts, widest part) for the first j columns; cut[j] = start of the last part
    best: list[tuple[int, int] | None] = [(0, 0)] + [None] * n
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):
            w = span(i, j)
            prev = best[i]
            if prev is None or (w > width and j - i > 1):
                continue
            cand = (prev[0] + 1, max(prev[1], w))
            now = best[j]
            if now is None or cand < now:
                best[j], cut[j] = cand, i
    parts, j = [], n
    while j > 0:
        parts.append(list(range(keys)) + cols[cut[j]:j])
        j = cut[j]
    return parts[::-1] or [list(range(keys))]


def text_table(table: Table, width: int | None = None) -> str:
    """Plain ASCII table (2-space gaps; labels left, numbers right), split into parts that each
    fit ``width`` characters (label columns repeated in every part); ``None``: never split."""
    rows = _marked(table)
    widths = [max(len(x) for x in col) for col in zip(table.header, *rows)]
    if width and table.key_columns >= len(widths) and sum(widths) + 2 * (len(widths) - 1) > width:
        return _wrapped_text_table(table.header, rows, widths, width)
    parts = _chunks(widths, table.key_columns, width) if width else [list(range(len(widths)))]
    out: list[str] = []
    for cols in parts:
        def line(cells, cols=cols):
            return "  ".join(cells[j].ljust(widths[j]) if j < table.key_columns else cells[j].rjust(widths[j])
                             for j in cols).rstrip()
        if out:
            out.append("")
        out += [line(table.header), "  ".join("-" * widths[j] for j in cols)] + [line(r) for r in rows]
    return "\n".join(out)


def _wrapped_text_table(header: list[str], rows: list[list[str]], widths: list[int], width: int) -> str:
    """A table of text columns only (no numbers to keep aligned) whose last column is wrapped so
    that every line fits ``width``; continuation lines are indented under that column."""
    lead = sum(widths[:-1]) + 2 * (len(widths) - 1)
    room = max(width - lead, 20)
    widths = widths[:-1] + [min(widths[-1], room)]

    def lines(cells):
        first = "  ".join(c.ljust(w) for c, w in zip(cells[:-1], widths))
        wrapped = textwrap.wrap(cells[-1], room) or [""]
        pad = "" if len(cells) == 1 else " " * lead
        return [(first + ("  " if first else "") + wrapped[0]).rstrip()] + [pad + w for w in wrapped[1:]]

    out = lines(header) + ["  ".join("-" * w for w in widths)]
    for r in rows:
        out += lines(r)
    return "\n".join(out)


_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)


def md_escape(text: str) -> str:
    """``text`` safe in Markdown: outside code spans, ``<`` and ``>`` become entities (no raw HTML,
    no autolink), and a ``]`` followed by ``(``, ``[`` or ``:`` is followed by a backslash (no inline
    link or image, no reference link or definition; a plain ``[0.1, 0.2]`` stays as it is); code spans and
    ``**bold**`` are kept. Applied to every text of ``report.md`` (user notes, names, paths)."""
    out, last = [], 0
    for m in _CODE_SPAN.finditer(text):
        out.append(_md_plain(text[last:m.start()]))
        out.append(m.group(0))
        last = m.end()
    out.append(_md_plain(text[last:]))
    return "".join(out)


def _md_plain(text: str) -> str:
    text = text.replace("<", "&lt;").replace(">", "&gt;")
    return text.replace("](", "]\\(").replace("][", "]\\[").replace("]:", "]\\:")


def md_code(text: str) -> str:
    """``text`` as one Markdown code span, whatever backticks it holds (a fence longer than its longest run)."""
    runs = [len(r) for r in re.findall(r"`+", text)]
    fence = "`" * (max(runs, default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def md_table(table: Table) -> str:
    """GitHub Markdown table; best cells of their column in bold, of their row in italics."""
    def esc(c):
        return md_escape(c).replace("|", "\\|")

    def cell(i, j, c):
        c = esc(c)
        c = f"_{c}_" if (i, j) in table.row_best else c
        return f"**{c}**" if (i, j) in table.best else c
    rows = [[cell(i, j, c) for j, c in enumerate(r)] for i, r in enumerate(table.rows)]
    align = ["---" if j < table.key_columns else "--:" for j in range(len(table.header))]
    out = ["| " + " | ".join(map(esc, table.header)) + " |", "|" + "|".join(align) + "|"]
    return "\n".join(out + ["| " + " | ".join(r) + " |" for r in rows])
