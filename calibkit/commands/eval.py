"""``calibkit eval DIR``: test metrics before and after temperature scaling, as a table and metrics.json."""

from __future__ import annotations

from pathlib import Path

from calibkit import distributed as D
from calibkit import rundir
from calibkit.calibrators import evaluate_before_after_ts
from calibkit.data.inputs import inputs_from_info
from calibkit.rundir import load_info, load_logits
from calibkit.train import dense

# How each metric is shown in the table: (label, scale).
_SHOW = {"acc": ("accuracy (%)", 100), "nll": ("NLL", 1), "brier": ("Brier", 1), "miou": ("mIoU (%)", 100)}


def evaluate_run(run_dir, n_bins: int = 15, objective: str = "nll") -> dict:
    """Metrics of a run's test logits before and after temperature scaling fitted on its val logits.

    Returns:
        ``{"temperature", "ts_objective", "n_bins", "n_val", "n_test", "before": {...}, "after": {...}}`` with the
        keys of :func:`calibkit.metrics.evaluate` in each of ``before`` / ``after``.
    """
    logits = load_logits(run_dir)
    if load_info(run_dir).get("modality") == "segmentation":
        return _evaluate_dense_run(run_dir, logits, n_bins, objective)
    panels = evaluate_before_after_ts(logits["val_logits"], logits["val_labels"], logits["test_logits"],
                                      logits["test_labels"], n_bins=n_bins, objective=objective)
    return {
        "temperature": panels["temperature"],
        "ts_objective": objective,
        "n_bins": n_bins,
        "n_val": len(logits["val_labels"]),
        "n_test": len(logits["test_labels"]),
        "before": panels["before"],
        "after": panels["after"],
    }


def _evaluate_dense_run(run_dir, logits: dict, n_bins: int, objective: str) -> dict:
    model, cfg, info = rundir.load_run(run_dir)
    res = info.get("test_metrics") or {}
    if res.get("ts_objective") != objective or res.get("n_bins") != n_bins:
        bundle = dense.load_run_data(info, cfg)
        res = dense.evaluate_dense(model, bundle.test, inputs_from_info(info), logits["val_logits"],
                                   logits["val_labels"], n_bins=n_bins, objective=objective,
                                   device=D.resolve_device("auto"), batch_size=cfg.eval_batch_size)
    return {"temperature": res["temperature"], "ts_objective": objective, "n_bins": n_bins,
            "n_val": len(logits["val_labels"]), "n_test": res["n_test_pixels"], "unit": "pixels",
            "before": res["before"], "after": res["after"]}


def format_table(result: dict) -> str:
    lines = [f"{'metric':<16}{'before TS':>12}{'after TS':>12}"]
    for key, before in result["before"].items():
        label, scale = _SHOW.get(key, (f"{key} (x100)", 100))
        lines.append(f"{label:<16}{scale * before:>12.3f}{scale * result['after'][key]:>12.3f}")
    return "\n".join(lines)


def run(args) -> int:
    result = evaluate_run(args.run_dir, args.n_bins, args.ts_objective)
    info = rundir.load_info(args.run_dir)
    c = info["config"]
    # Written before anything is printed: a reader that closes the pipe early (`| head`) loses no result.
    path = Path(args.run_dir) / rundir.METRICS
    rundir.write_json(path, result)
    print(f"{args.run_dir}: {c['data']} / {c['model']} / loss {c['loss']} / method {c['method']} / seed {c['seed']}")
    unit = result.get("unit", "images")
    sample = " (sample)" if unit == "pixels" else ""
    print(f"temperature fitted on {result['n_val']} validation {unit}{sample}: T = {result['temperature']:.4f}; "
          f"{result['n_test']} test {unit}")
    print(format_table(result))
    print(f"wrote {path}")
    return 0
