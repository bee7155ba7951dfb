"""The bench report: terminal tables, ``report.md`` and a self-contained ``index.html``.

Everything is rebuilt from the results database (``runs.db``) and the logits files its rows point
to, so ``calibkit report DIR`` gives the same report as the bench that wrote ``DIR``.

Tables show the mean +- std over seeds (std with ``ddof=1``; a single seed shows the mean alone).
Calibration numbers (ECE, AECE, classwise ECE, MCE, O-/U-ECE) and accuracies are x100, NLL and
Brier as they are. The ``dECE vs CE`` column is a **paired bootstrap** over test samples: every
resample draws one set of test indices, applied to both the method's and CE's probabilities of
the same seed; the statistic is the seed-averaged ECE difference, so the interval reflects the
test-set sampling noise (the spread over seeds is in the +- column). A difference is marked
significant (``*``) when its 95% interval excludes 0.

Segmentation runs (``test_image`` in their logits file): the tables are over every labelled test
pixel (the run's streamed evaluation), the ``dECE`` column over the stored test pixel sample with
an **image-level** paired bootstrap (:mod:`calibkit.grouped_bootstrap`: pixels of one image are
not independent), and the tables add mIoU and leave out the OOD and shift columns.
"""

from __future__ import annotations

import base64
import html
import math
import os
from pathlib import Path

import numpy as np
import torch

from calibkit.bench.grid import METHODS, REFERENCE
from calibkit.store import Store

# (key, header, scale, decimals) of the two tables; scale 100 = reported x100.
BEFORE_COLS = (("acc", "Acc", 100, 2), ("ece", "ECE", 100, 2), ("aece", "AECE", 100, 2),
               ("cece", "cwECE", 100, 2), ("o_ece", "O-ECE", 100, 2), ("u_ece", "U-ECE", 100, 2),
               ("mce", "MCE", 100, 1), ("nll", "NLL", 1, 3), ("brier", "Brier", 1, 3))
AFTER_COLS = (("temperature", "T", 1, 2), ("acc", "Acc", 100, 2), ("ece", "ECE", 100, 2),
              ("aece", "AECE", 100, 2), ("nll", "NLL", 1, 3))
MIOU_COL = ("miou", "mIoU", 100, 2)  # shown when the runs report it (segmentation)
EXTRA_COLS = (("auroc_entropy", "AUROC-H", 100, 1), ("auroc_maxconf", "AUROC-MSP", 100, 1),
              ("shift_acc", "Shift acc", 100, 1), ("shift_ece", "Shift ECE", 100, 2),
              ("train_time_s", "Train s", 1, 1))


def label(method: str) -> str:
    return METHODS[method].label if method in METHODS else method


def _order(methods) -> list[str]:
    known = [m for m in METHODS if m in methods]
    return known + sorted(m for m in methods if m not in METHODS)


def _run_values(row: dict) -> dict:
    """The flat per-run numbers the tables average: ``before.*``, ``after.*`` and extras."""
    metrics = row.get("metrics") or {}
    out = {f"before.{k}": v for k, v in (metrics.get("before") or {}).items()}
    out.update({f"after.{k}": v for k, v in (metrics.get("after") or {}).items()})
    out["after.temperature"] = metrics.get("temperature")
    ood = row.get("ood") or {}
    out["extra.auroc_entropy"] = ood.get("auroc_entropy")
    out["extra.auroc_maxconf"] = ood.get("auroc_maxconf")
    overall = (row.get("robustness") or {}).get("overall") or {}
    out["extra.shift_acc"] = overall.get("acc")
    out["extra.shift_ece"] = overall.get("ece")
    out["extra.train_time_s"] = row.get("train_time_s")
    return out


def summarize(rows: list[dict]) -> dict:
    """Per method: seeds, and ``(mean, std, n)`` of every per-run number over the finished runs."""
    by_method: dict[str, list[dict]] = {}
    for row in rows:
        if row["status"] == "done":
            by_method.setdefault(row["method"], []).append(row)
    out = {}
    for method in _order(by_method):
        runs = sorted(by_method[method], key=lambda r: r["seed"])
        values = [_run_values(r) for r in runs]
        stats = {}
        for key in sorted({k for v in values for k in v}):
            xs = [v[key] for v in values if isinstance(v.get(key), (int, float))]
            if xs:
                stats[key] = (float(np.mean(xs)), float(np.std(xs, ddof=1)) if len(xs) > 1 else float("nan"), len(xs))
        out[method] = {"seeds": [r["seed"] for r in runs], "stats": stats, "runs": runs}
    return out


def fmt(stat, scale: float, decimals: int, pm: str = "+-") -> str:
    """``mean +- std`` of a ``(mean, std, n)`` triple, scaled; ``-`` when missing."""
    if stat is None:
        return "-"
    mean, std, n = stat
    text = f"{mean * scale:.{decimals}f}"
    if n > 1 and not math.isnan(std):
        text += f" {pm} {std * scale:.{decimals}f}"
    return text


def fmt_delta(delta: dict | None) -> str:
    """``-3.12 [-3.5, -2.7]*`` (x100) for an ECE difference and its interval."""
    if not delta:
        return "-"
    mark = "*" if delta["significant"] else ""
    return f"{delta['diff'] * 100:+.2f} [{delta['lo'] * 100:+.2f}, {delta['hi'] * 100:+.2f}]{mark}"


def load_probs(row: dict) -> tuple[np.ndarray, np.ndarray, float]:
    """Test probabilities (N, K), labels (N,) and the fitted temperature of a finished run."""
    from calibkit.rundir import read_tensors

    path = row.get("logits_path")
    if not path:
        raise ValueError(f"run {row['run_key']} has no logits_path in the database")
    tensors = read_tensors(path)
    logits = tensors["test_logits"].double()
    return (logits.softmax(1).numpy(), tensors["test_labels"].long().numpy(),
            float((row.get("metrics") or {}).get("temperature") or 1.0))


def load_groups(row: dict) -> np.ndarray | None:
    """The test image of every stored test pixel of a segmentation run (None for classification)."""
    from calibkit.rundir import read_tensors

    tensors = read_tensors(row["logits_path"])
    return tensors["test_image"].numpy() if "test_image" in tensors else None


def ece_deltas(summary: dict, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> dict:
    """Paired bootstrap of each method's ECE minus CE's ECE (seed-averaged), per method.

    Returns ``{method: {"diff", "lo", "hi", "significant", "seeds"}}``; methods sharing no seed
    with CE, and CE itself, are left out.
    """
    from calibkit.metrics import paired_bootstrap_diff

    if REFERENCE not in summary:
        return {}
    ref = {r["seed"]: r for r in summary[REFERENCE]["runs"]}
    cache: dict[str, tuple] = {}

    def probs(row):
        if row["run_key"] not in cache:
            cache[row["run_key"]] = load_probs(row)
        return cache[row["run_key"]]

    out = {}
    for method, entry in summary.items():
        if method == REFERENCE:
            continue
        pairs = [(r, ref[r["seed"]]) for r in entry["runs"] if r["seed"] in ref]
        if not pairs:
            continue
        # One paired bootstrap per seed, all with the same bootstrap seed: they draw the same
        # resampled index sets (same generator, same N), so their resampled differences line up
        # and averaging them gives the resampled seed-averaged difference.
        diffs, estimates = [], []
        for run, ref_run in pairs:
            pa, la, _ = probs(run)
            pb, lb, _ = probs(ref_run)
            if not np.array_equal(la, lb):
                raise ValueError(f"{run['run_key']} and {ref_run['run_key']} were tested on different test sets")
            groups = load_groups(run)
            if groups is not None:  # pixels: resample whole test images (calibkit.grouped_bootstrap)
                from calibkit.grouped_bootstrap import paired_grouped_ece_diff

                g = paired_grouped_ece_diff(torch.from_numpy(pa), torch.from_numpy(pb), torch.from_numpy(la),
                                            groups, n_resamples=n_boot, seed=seed)
                diffs.append(g["samples"])
                estimates.append(g["estimate"])
                continue
            res = paired_bootstrap_diff(torch.from_numpy(pa), torch.from_numpy(pb), torch.from_numpy(la), "ece",
                                        n_resamples=n_boot, seed=seed, level=level)
            diffs.append(res.samples)
            estimates.append(res.estimate)
        mean_diff = torch.stack(diffs).mean(0)
        lo, hi = torch.quantile(mean_diff, torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64))
        out[method] = {"diff": float(np.mean(estimates)), "lo": float(lo), "hi": float(hi),
                       "significant": not (float(lo) <= 0.0 <= float(hi)), "seeds": len(pairs)}
    return out


def table_rows(summary: dict, deltas: dict, pm: str = "+-") -> tuple[list[str], list[list[str]], list[str], list[list[str]]]:
    """The two tables as header + rows of strings (shared by the terminal, Markdown and HTML)."""
    dense = any("before.miou" in e["stats"] for e in summary.values())
    before_cols, after_cols = (BEFORE_COLS + (MIOU_COL,), AFTER_COLS + (MIOU_COL,)) if dense else (BEFORE_COLS, AFTER_COLS)
    # columns no run reports (OOD and shift for segmentation) are left out
    extra_cols = EXTRA_COLS if not dense else \
        tuple(c for c in EXTRA_COLS if any(f"extra.{c[0]}" in e["stats"] for e in summary.values()))
    head1 = ["Method", "n"] + [h for _, h, _, _ in before_cols] + ["dECE vs CE [95% CI]"]
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
    return head1, rows1, head2, rows2


def _text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(x) for x in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(header), "  ".join("-" * w for w in widths)] + [line(r) for r in rows])


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    esc = lambda c: c.replace("|", "\\|")
    out = ["| " + " | ".join(map(esc, header)) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(out + ["| " + " | ".join(map(esc, r)) + " |" for r in rows])


def format_tables(summary: dict, deltas: dict, title: str = "") -> str:
    """The terminal text: the test metrics before TS with the ECE difference, then after TS/OOD/shift."""
    h1, r1, h2, r2 = table_rows(summary, deltas)
    parts = [title] if title else []
    parts += ["Test set, before temperature scaling (calibration x100; * = 95% CI of dECE excludes 0)",
              _text_table(h1, r1), "",
              "After temperature scaling (fitted on val), OOD AUROC (x100), corrupted test sets (mean over "
              "corruptions and severities), training time",
              _text_table(h2, r2)]
    return "\n".join(parts)


# -- figures ----------------------------------------------------------------------------------------
def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def method_figure(row: dict, path: Path) -> Path:
    """Reliability diagram before and after TS and the confidence histogram of one run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from calibkit.plots import confidence_histogram, reliability_diagram

    probs, labels, temperature = load_probs(row)
    logits = np.log(np.clip(probs, 1e-300, None))  # = test logits up to a per-row constant
    z = logits / temperature
    probs_ts = np.exp(z - z.max(1, keepdims=True))
    probs_ts /= probs_ts.sum(1, keepdims=True)
    name = f"{label(row['method'])} (seed {row['seed']})"
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
    reliability_diagram(probs, labels, ax=axes[0], title=f"{name}: before TS")
    reliability_diagram(probs_ts, labels, ax=axes[1], title=f"after TS (T = {temperature:.2f})")
    confidence_histogram(probs, labels, ax=axes[2], title="confidence (before TS)")
    fig.tight_layout()
    return _save(fig, path)


def summary_figures(summary: dict, out: Path) -> dict[str, Path]:
    """O-/U-ECE stacked bars (O + U = ECE) and ECE before/after TS bars, one bar group per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [label(m) for m in summary]
    get = lambda key: np.array([summary[m]["stats"].get(key, (np.nan, np.nan, 0))[0] * 100 for m in summary])
    x = np.arange(len(names))
    figs = {}
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(names) + 2), 3.8))
    o, u = get("before.o_ece"), get("before.u_ece")
    ax.bar(x, o, color="tab:red", label="O-ECE (over-confidence)")
    ax.bar(x, u, bottom=o, color="tab:blue", label="U-ECE (under-confidence)")
    ax.set_xticks(x, names, rotation=45, ha="right")
    ax.set_ylabel("x100 (O + U = ECE)")
    ax.set_title("Over- and under-confidence on the test set (before TS, mean over seeds)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figs["ou_ece"] = _save(fig, out / "ou_ece.png")
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(names) + 2), 3.8))
    ax.bar(x - 0.2, get("before.ece"), 0.4, label="before TS", color="tab:gray")
    ax.bar(x + 0.2, get("after.ece"), 0.4, label="after TS", color="tab:green")
    ax.set_xticks(x, names, rotation=45, ha="right")
    ax.set_ylabel("ECE x100")
    ax.set_title("ECE before and after temperature scaling (mean over seeds)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figs["ts"] = _save(fig, out / "ece_before_after_ts.png")
    return figs


# -- documents ----------------------------------------------------------------------------------------
def _robustness_table(summary: dict) -> tuple[list[str], list[list[str]]] | None:
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
                cells.append(fmt((float(np.mean(xs)), float(np.std(xs, ddof=1)) if len(xs) > 1 else float("nan"),
                                  len(xs)) if xs else None, 100, 2, "±"))
        rows.append(cells)
    return header, rows


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


def _html_table(header, rows) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def build_report(out_dir, preset: str | None = None, n_boot: int | None = None, seed: int = 0,
                 figures: bool = True) -> dict:
    """Write ``out_dir/report/`` (report.md, index.html, figures) from ``out_dir/runs.db``.

    Args:
        out_dir: the bench output directory (holding ``runs.db``).
        preset: which preset's runs (default: the only one, or the most recent).
        n_boot: bootstrap resamples (default: the preset's, else 1000).
        seed: bootstrap seed (fixed, so a rebuilt report is identical).
        figures: draw the figures (off only in quick tests of the tables).

    Returns:
        ``{"text": terminal tables, "summary", "deltas", "paths": {...}}``.
    """
    out_dir = Path(out_dir)
    store = Store(out_dir / "runs.db", readonly=True)
    try:
        presets = store.presets()
        if not presets:
            raise ValueError(f"{out_dir / 'runs.db'} holds no runs yet")
        if preset is None:
            preset = presets[-1]
        elif preset not in presets:
            raise ValueError(f"no runs of preset {preset!r} in {out_dir / 'runs.db'}; found: {', '.join(presets)}")
        rows = store.runs(preset, status=None)
    finally:
        store.close()
    done = [r for r in rows if r["status"] == "done"]
    if not done:
        raise ValueError(f"no finished runs of preset {preset!r} in {out_dir / 'runs.db'}")
    if n_boot is None:
        from calibkit.bench.grid import PRESETS

        n_boot = PRESETS[preset].n_boot if preset in PRESETS else 1000
    summary = summarize(done)
    deltas = ece_deltas(summary, n_boot=n_boot, seed=seed)
    pending = [r for r in rows if r["status"] != "done"]
    title = f"calibkit bench: preset {preset}, {len(done)} finished runs" + \
        (f", {len(pending)} unfinished ({', '.join(r['run_key'] + ':' + r['status'] for r in pending)})" if pending else "")
    text = format_tables(summary, deltas, title)

    rep = out_dir / "report"
    figdir = rep / "figures"
    figdir.mkdir(parents=True, exist_ok=True)
    figs: dict[str, Path] = {}
    if figures:
        figs.update(summary_figures(summary, figdir))
        for method, entry in summary.items():
            figs[f"method:{method}"] = method_figure(entry["runs"][0], figdir / f"reliability_{method}.png")

    h1, r1, h2, r2 = table_rows(summary, deltas, pm="±")
    rob = _robustness_table(summary)
    first = next(iter(done))
    ctx = (f"Preset `{preset}`; git commit `{first.get('git_commit')}`; versions "
           f"{', '.join(f'{k} {v}' for k, v in sorted((first.get('versions') or {}).items()))}. "
           f"Mean ± std over seeds; calibration and accuracy x100; dECE = paired bootstrap "
           f"({n_boot} resamples) of the seed-averaged ECE difference from CE, * = 95% CI excludes 0.")
    sections = [("Test set, before temperature scaling", h1, r1),
                ("After temperature scaling (fitted on val), OOD, corrupted test sets, training time", h2, r2)]
    if rob:
        sections.append(("Corrupted test sets: mean over corruptions, per severity (x100)", *rob))
    md = [f"# calibkit bench report: preset `{preset}`", "", ctx, ""]
    if pending:
        md += [f"Unfinished runs: {', '.join(r['run_key'] + ' (' + r['status'] + ')' for r in pending)}", ""]
    for head, h, r in sections:
        md += [f"## {head}", "", _md_table(h, r), ""]
    if figs:
        md += ["## Figures", ""] + [f"![{k}](figures/{p.name})" for k, p in figs.items()] + [""]
    (rep / "report.md").write_text("\n".join(md))

    parts = [f"<h1>calibkit bench report: preset {html.escape(preset)}</h1>", f"<p>{html.escape(ctx)}</p>"]
    if pending:
        parts.append(f"<p>Unfinished runs: {html.escape(', '.join(r['run_key'] for r in pending))}</p>")
    for head, h, r in sections:
        parts += [f"<h2>{html.escape(head)}</h2>", _html_table(h, r)]
    if figs:
        parts.append("<h2>Figures</h2>")
        parts += [f"<figure>{_img(p)}<figcaption>{html.escape(k)}</figcaption></figure>" for k, p in figs.items()]
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:13px}"
             "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}td:first-child{text-align:left}"
             "img{max-width:100%}")
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>calibkit bench {html.escape(preset)}</title>"
            f"<style>{style}</style></head><body>{''.join(parts)}</body></html>")
    (rep / "index.html").write_text(page)
    return {"text": text, "summary": summary, "deltas": deltas, "preset": preset,
            "paths": {"report": rep, "md": rep / "report.md", "html": rep / "index.html", "figures": figs}}
