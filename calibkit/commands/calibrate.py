"""``calibkit calibrate --val VAL --test TEST --out DIR``: every post-hoc calibrator on a trained model's logits."""

from __future__ import annotations

import argparse

EPILOG = """\
Each file (.npz, .safetensors or .pt) holds 'logits' (N, K) and 'labels' (N,), or 'probs' (N, K)
instead of 'logits' (then logits = log(probs), probabilities below 1e-300 raised to it first;
softmax(log p) = p). 1-D entries are binary positive-class logits (or probabilities: logit(p)).
Every calibrator is fitted on VAL only and scored on TEST: ECE x100 with its bootstrap interval,
the paired bootstrap difference of ECE from temperature scaling (* significantly lower,
! significantly higher), classwise ECE x100, NLL and accuracy. Writes DIR/report/calibrators.md, DIR/report/results.json
and DIR/report/reliability_<name>.png; --save NAME also writes DIR/NAME.safetensors + DIR/NAME.json
for `calibkit apply` and calibkit.calibrators.load. Bad files change nothing on disk.

example:
  calibkit calibrate --val val.npz --test test.npz --out calib --save dirichlet
"""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "calibrate", help="fit every post-hoc calibrator on validation logits and rank them on test logits",
        description="Fit every post-hoc calibrator on a trained model's validation logits, rank them by test ECE "
        "with bootstrap intervals and the paired difference from temperature scaling, write DIR/report/.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--val", required=True, metavar="FILE", help="validation logits/probs + labels (fitting)")
    p.add_argument("--test", required=True, metavar="FILE", help="test logits/probs + labels (scoring)")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--calibrators", metavar="A,B", help="comma-separated subset of the registry (default: all)")
    p.add_argument("--save", metavar="NAME", help="store this fitted calibrator as DIR/NAME.safetensors + .json")
    p.add_argument("--n-bins", type=int, default=15, help="bins of the binned errors (default 15)")
    p.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples (default 1000)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.add_argument("--dpi", type=int, default=120, help="resolution of the reliability diagrams (default 120)")
    from calibkit.commands import add_num_threads

    add_num_threads(p)
    p.set_defaults(func=run)


def read_scores(path, require_labels: bool = True):
    """``(logits, labels, source)`` of a ``.npz`` / ``.safetensors`` / ``.pt`` file.

    ``logits``: float64 ``(N, K)`` or binary ``(N,)``; from ``probs`` when the file has no
    ``logits`` (``log``, or ``logit`` for 1-D, of the probabilities raised to at least 1e-300);
    ``labels``: int64 ``(N,)`` in ``[0, K)`` (``None`` when absent and not required);
    ``source``: ``"logits"`` or ``"probs"``. Raises ``ValueError`` / ``FileNotFoundError`` naming the file.
    """
    from pathlib import Path

    import numpy as np
    import torch

    from calibkit._validation import check_labels, check_probs

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found")
    data = _read_file(path)
    key = "logits" if "logits" in data else "probs" if "probs" in data else None
    if key is None:
        raise ValueError(f"{path}: no 'logits' or 'probs' entry (found: {', '.join(sorted(data)) or 'nothing'})")
    try:
        x = torch.as_tensor(np.asarray(data[key])) if not isinstance(data[key], torch.Tensor) else data[key]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: '{key}' is not a numeric array ({exc})") from None
    if not x.dtype.is_floating_point or x.dim() not in (1, 2) or x.shape[0] == 0:
        raise ValueError(f"{path}: '{key}' must be a non-empty float array of shape (N, K) or (N,), "
                         f"got {x.dtype} {tuple(x.shape)}")
    x = x.double()
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{path}: '{key}' contains {int((~torch.isfinite(x)).sum())} NaN or infinite value(s)")
    if key == "probs":
        try:
            check_probs(torch.stack([1 - x, x], 1) if x.dim() == 1 else x, name=f"{path}: 'probs'")
        except ValueError as exc:
            raise ValueError(str(exc)) from None
        p = x.clamp(min=1e-300)
        x = torch.log(p) - torch.log((1 - x).clamp(min=1e-300)) if x.dim() == 1 else torch.log(p)
    labels = data.get("labels")
    if labels is None:
        if require_labels:
            raise ValueError(f"{path}: no 'labels' entry")
        return x, None, key
    y = torch.as_tensor(np.asarray(labels)) if not isinstance(labels, torch.Tensor) else labels
    k = 2 if x.dim() == 1 else x.shape[1]
    try:
        y = check_labels(y, k, x.shape[0])
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    return x, y, key


def _read_file(path):
    import numpy as np
    import torch

    suffix = path.suffix.lower()
    try:
        if suffix == ".npz":
            with np.load(path, allow_pickle=False) as f:
                return {k: f[k] for k in f.files}
        if suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        if suffix == ".pt":
            obj = torch.load(path, map_location="cpu", weights_only=True)
            if not isinstance(obj, dict):
                raise ValueError(f"holds a {type(obj).__name__}, not a dict of tensors")
            return obj
    except Exception as exc:  # each reader raises its own types for a corrupt file
        reason = (str(exc).strip().splitlines() or [""])[0][:120]
        raise ValueError(f"{path}: cannot read ({type(exc).__name__}: {reason})") from None
    raise ValueError(f"{path}: unsupported file type {suffix or '(none)'}; use .npz, .safetensors or .pt")


def _choose(spec):
    from calibkit.calibrators import CALIBRATORS

    if spec is None:
        return list(CALIBRATORS)
    names = [s.strip() for s in spec.split(",") if s.strip()]
    bad = [n for n in names if n not in CALIBRATORS]
    if bad or not names:
        raise ValueError(f"unknown calibrator {', '.join(map(repr, bad)) or '(none given)'}; expected one of "
                         f"{', '.join(CALIBRATORS)}")
    return list(dict.fromkeys(names))


def _check_args(args, names):
    for flag, value, least in (("--n-bins", args.n_bins, 1), ("--n-boot", args.n_boot, 1), ("--dpi", args.dpi, 10)):
        if value < least:
            raise ValueError(f"{flag} must be >= {least}, got {value}")
    if args.save is not None and args.save not in names:
        raise ValueError(f"--save {args.save!r}: not among the calibrators fitted here ({', '.join(names)})")


def _fmt_ci(r, scale=100):
    return f"{scale * r.estimate:.2f} [{scale * r.low:.2f}, {scale * r.high:.2f}]"


def run(args) -> int:
    import json
    import time
    from pathlib import Path

    names = _choose(args.calibrators)
    _check_args(args, names)
    val_x, val_y, val_src = read_scores(args.val)
    test_x, test_y, test_src = read_scores(args.test)
    if val_x.dim() != test_x.dim() or (val_x.dim() == 2 and val_x.shape[1] != test_x.shape[1]):
        shape = lambda x: "binary (N,)" if x.dim() == 1 else f"K = {x.shape[1]}"  # noqa: E731
        raise ValueError(f"{args.val} has {shape(val_x)} but {args.test} has {shape(test_x)}: "
                         "validation and test must come from the same model")

    import torch

    from calibkit.bootstrap import bootstrap_ci, paired_bootstrap_diff
    from calibkit.calibrators import CALIBRATORS, save
    from calibkit.metrics import evaluate

    rows, fitted, probs = [], {}, {}
    base = torch.sigmoid(test_x) if test_x.dim() == 1 else torch.softmax(test_x, 1)
    for name in ["none"] + names:
        start = time.perf_counter()
        if name == "none":
            p = base
        else:
            fitted[name] = CALIBRATORS[name]().fit(val_x, val_y)
            p = fitted[name].predict_proba(test_x)
        seconds = time.perf_counter() - start
        probs[name] = p
        panel = evaluate(p, test_y, n_bins=args.n_bins)
        rows.append({"calibrator": name, "seconds": seconds, **{k: panel[k] for k in ("ece", "cece", "nll", "acc")},
                     "ece_ci": bootstrap_ci("ece", p, test_y, args.n_boot, args.seed, n_bins=args.n_bins)})
    ref = "temperature" if "temperature" in probs else None
    for r in rows:
        r["vs_ts"] = (None if ref is None or r["calibrator"] == ref else
                      paired_bootstrap_diff(probs[r["calibrator"]], probs[ref], test_y, "ece", args.n_boot,
                                            args.seed, n_bins=args.n_bins))
    rows.sort(key=lambda r: (r["ece"], r["calibrator"]))
    table = _table(rows, ref)
    print(f"fitted on {args.val} ({len(val_y)} rows, {val_src}); scored on {args.test} ({len(test_y)} rows, "
          f"{test_src})\n")
    print(table)

    out = Path(args.out)
    report = out / "report"
    report.mkdir(parents=True, exist_ok=True)
    _figures(report, probs, test_y, args)
    (report / "calibrators.md").write_text(f"# Post-hoc calibrators\n\nFitted on `{args.val}` ({len(val_y)} rows), "
                                           f"scored on `{args.test}` ({len(test_y)} rows); {args.n_boot} bootstrap "
                                           f"resamples, 95% intervals, ECE with {args.n_bins} bins.\n\n{table}\n\n"
                                           + "\n".join(f"![{n}](reliability_{n}.png)" for n in probs) + "\n")
    (report / "results.json").write_text(json.dumps([_jsonable(r) for r in rows], indent=2))
    if args.save:
        st, js = save(fitted[args.save], out / args.save)
        print(f"\nsaved {args.save}: {st} + {js}")
    print(f"\nreport: {report / 'calibrators.md'}")
    return 0


def _table(rows, ref) -> str:
    head = ["rank", "calibrator", "ECE x100 [95% CI]", "dECE vs TS x100 [95% CI]", "cwECE x100", "NLL", "acc %",
            "fit s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, r in enumerate(rows, 1):
        d = r["vs_ts"]
        if d is None:
            delta = "(reference)" if r["calibrator"] == ref else "-"
        else:
            from calibkit.report.data import BETTER_MARK, WORSE_MARK, direction

            way = direction(d.low, d.high, "ece")
            mark = {"better": f" {BETTER_MARK}", "worse": f" {WORSE_MARK}"}.get(way, "")
            delta = f"{100 * d.estimate:+.2f} [{100 * d.low:+.2f}, {100 * d.high:+.2f}]{mark}"
        lines.append(f"| {i} | {r['calibrator']} | {_fmt_ci(r['ece_ci'])} | {delta} | {100 * r['cece']:.2f} | "
                     f"{r['nll']:.4f} | {100 * r['acc']:.2f} | {r['seconds']:.2f} |")
    return "\n".join(lines)


def _jsonable(r) -> dict:
    out = {k: v for k, v in r.items() if k not in ("ece_ci", "vs_ts")}
    out["ece_ci"] = [r["ece_ci"].low, r["ece_ci"].high]
    out["vs_ts"] = None if r["vs_ts"] is None else {"estimate": r["vs_ts"].estimate, "low": r["vs_ts"].low,
                                                    "high": r["vs_ts"].high}
    return out


def _figures(report, probs, labels, args) -> None:
    from calibkit import plots

    for name, p in probs.items():
        ax = plots.reliability_diagram(p, labels, n_bins=args.n_bins, title=name)
        ax.figure.savefig(report / f"reliability_{name}.png", dpi=args.dpi, bbox_inches="tight")
