"""What CSM needs to calibrate: an ablation on one seed of a bench preset, selected on validation.

    python benchmarks/csm_ablation.py --out DIR [--preset default --seed 0] \\
        --store 720=calibkit/assets/csm/fmnist-groups --store 10k=STORE_10K \\
        [--encoder cnn=CNN_RUN] [--baselines ce,ls] \\
        --variant base:store=10k --variant s2.3:store=10k,s=2.3 --variant w2:store=10k,w=2 ...

Each variant is ``NAME:key=value,...`` with keys ``store`` (a ``--store`` name), ``enc`` (``ce``,
the CE run of the same seed, or an ``--encoder`` name: any calibkit run trained on the same
training split), ``s`` (reannotation sharpness, default 4), ``labels`` (``annotated``, or ``lam``:
the raw mixing coefficient, no reannotation), ``w`` (weight of the generated term, default 1) and
``per`` (generated images per real one, default 2) and ``loss`` (``l2``, the paper; ``ce``: soft
cross-entropy on the generated images, a diagnostic). For every variant the store is annotated once
into ``DIR/annot/`` (the shards are linked, not copied) and a ``method="csm"`` run of the preset is
trained into ``DIR/runs/NAME`` with the same seed; runs already finished are reused.

Reported per run: validation accuracy, ECE (15 bins), NLL and mean confidence (the selection
reads only these); how the classifier fits its generated set (``soft_l2`` to the soft labels, mean
confidence on interior mixes beside their mean largest soft label) and the mean soft label of c1 at
each group position; then test accuracy, ECE, NLL, mean confidence and the ECE after temperature
scaling fitted on validation. Selection (:func:`choose`) follows the bench's tuning criterion:
lowest validation ECE among the candidates within 1 accuracy point of the best candidate's
validation accuracy; ties go to the candidate nearer the published defaults (s = 4, w = 1, 2
per real). Test metrics are read only after the choice, for the table.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from calibkit import rundir
from calibkit.bench.grid import get_preset
from calibkit.bench.runner import train_config

DEFAULTS = {"enc": "ce", "s": 4.0, "labels": "annotated", "w": 1.0, "per": 2, "loss": "l2"}


def parse_variant(text: str) -> dict:
    """``"name:store=10k,s=2.3"`` -> ``{"name": "name", "store": "10k", "s": 2.3, ...defaults}``."""
    name, _, rest = text.partition(":")
    v = {"name": name, **DEFAULTS}
    for item in filter(None, rest.split(",")):
        k, _, val = item.partition("=")
        if k not in ("store", *DEFAULTS):
            raise ValueError(f"variant {name}: unknown key {k!r}")
        v[k] = type(DEFAULTS[k])(val) if k in DEFAULTS and not isinstance(DEFAULTS[k], str) else val
    if "store" not in v:
        raise ValueError(f"variant {name}: needs store=NAME")
    return v


def _distance_to_default(row: dict) -> float:
    import math

    return (abs(math.log(row["s"] / DEFAULTS["s"])) + abs(math.log(row["w"] / DEFAULTS["w"]))
            + abs(math.log(row["per"] / DEFAULTS["per"])))


def choose(rows: list[dict], acc_tolerance: float = 0.01) -> dict:
    """The selected candidate: reads only ``val_acc``, ``val_ece`` and the settings of each row.

    Candidates more than ``acc_tolerance`` below the best validation accuracy are excluded; the
    lowest validation ECE wins; ties (equal ECE) go to the candidate nearer the defaults.
    """
    if not rows:
        raise ValueError("no candidate to choose from")
    best_acc = max(r["val_acc"] for r in rows)
    ok = [r for r in rows if r["val_acc"] >= best_acc - acc_tolerance]
    return min(ok, key=lambda r: (round(r["val_ece"], 6), _distance_to_default(r)))


def choose_csm(rows: list[dict]) -> dict | None:
    """:func:`choose` among the runs of the method as published (the ``l2`` generated term)."""
    rows = [r for r in rows if r.get("kind") == "csm" and r["loss"] == "l2"]
    return choose(rows) if rows else None


def _metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict:
    from calibkit.metrics import evaluate

    p = logits.double().softmax(1)
    m = evaluate(p, labels)
    return {"acc": m["acc"], "ece": m["ece"], "nll": m["nll"], "conf": float(p.max(1).values.mean())}


def val_metrics(run_dir) -> dict:
    """Validation metrics of a finished run (the selection's only input)."""
    t = rundir.read_tensors(Path(run_dir) / rundir.LOGITS)
    return {f"val_{k}": v for k, v in _metrics(t["val_logits"], t["val_labels"]).items()}


def test_metrics(run_dir) -> dict:
    """Test metrics, before and after temperature scaling fitted on validation (for the table)."""
    from calibkit.calibrators import evaluate_before_after_ts

    t = rundir.load_logits(run_dir)
    out = {f"test_{k}": v for k, v in _metrics(t["test_logits"], t["test_labels"]).items()}
    panels = evaluate_before_after_ts(t["val_logits"], t["val_labels"], t["test_logits"], t["test_labels"])
    out["test_ece_ts"] = float(panels["after"]["ece"])
    return out


def annotated_store(out: Path, v: dict, stores: dict, encoders: dict) -> Path:
    """``DIR/annot/<store>-<enc>-s<s>`` (or ``-lam``): linked shards + this variant's annotations."""
    from calibkit.methods.csm.annotate import ClassifierEncoder, annotate_store
    from calibkit.methods.csm.store import ANNOT_META, load_store, write_annotations

    tag = f"{v['store']}-lam" if v["labels"] == "lam" else f"{v['store']}-{v['enc']}-s{v['s']:g}"
    dst = out / "annot" / tag
    if (dst / ANNOT_META).is_file():
        return dst
    src = Path(stores[v["store"]]).resolve()
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name.startswith(("shard-", "store.json")) and not (dst / f.name).exists():
            os.symlink(f, dst / f.name)
    if v["labels"] == "lam":
        s = load_store(dst)
        k, n = s["manifest"]["num_classes"], len(s["lam"])
        soft = torch.zeros(n, k)
        soft[torch.arange(n), s["c1"]] = s["lam"]
        soft[torch.arange(n), s["c2"]] = 1 - s["lam"]
        write_annotations(dst, {"soft_labels": soft, "lam_annot": s["lam"], "group": s["group"],
                                "member": s["member"]}, {"encoder": "none (raw lam)", "source_store": str(src)})
        return dst
    enc = ClassifierEncoder(encoders[v["enc"]])
    images, labels = enc.training_split()
    annotate_store(dst, enc, images, labels, sharpness=v["s"], extra_meta={"source_store": str(src)})
    return dst


def soft_label_profile(store_dir) -> list[float]:
    """Mean annotated label of c1 at each of the 8 positions of a group (lam = 0 .. 1)."""
    from calibkit.methods.csm.store import load_annotations, load_store

    s, (a, _) = load_store(store_dir), load_annotations(store_dir)
    y = a["soft_labels"][torch.arange(len(s["c1"])), s["c1"]]
    return [round(float(v), 3) for v in y.view(-1, s["manifest"]["group_size"]).mean(0)]


def generated_fit(run_dir, store_dir) -> dict:
    """How the trained classifier sees its generated set: ``soft_l2`` to the annotated labels, and
    on interior members (0 < lam < 1) its mean confidence beside the mean largest soft label."""
    from calibkit.functional import soft_l2
    from calibkit.methods.csm.store import load_annotations, load_store
    from calibkit.rundir import load_run, predict_logits

    model, _, info = load_run(run_dir)
    s, (a, _) = load_store(store_dir), load_annotations(store_dir)
    p = predict_logits(model, s["images"], info).double().softmax(1)
    soft = a["soft_labels"].double()
    inner = (s["lam"] > 0) & (s["lam"] < 1)
    return {"gen_l2": float(soft_l2(p.log(), soft)), "gen_conf_interior": float(p[inner].max(1).values.mean()),
            "soft_max_interior": float(soft[inner].max(1).values.mean())}


def _train(preset, method: str, seed: int, run: Path, num_threads: int, **extra) -> None:
    from calibkit.config import TrainConfig
    from calibkit.train import train

    info = rundir.load_info(run) if (run / rundir.CONFIG).is_file() else {}
    if info.get("status") == "done" and (run / rundir.LOGITS).is_file():
        return
    cfg = train_config(preset, method, seed, num_threads=num_threads, device="cpu",
                       csm_data=extra.pop("csm_data", None))
    if extra:
        cfg = TrainConfig.from_dict({**cfg.to_dict(), **extra}).validate()
    summary = train(cfg, run, progress=False, verbose=False)
    if summary.get("status") != "done":
        raise RuntimeError(f"{run}: training ended with status {summary.get('status')!r}")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", default="default")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--store", action="append", default=[], help="NAME=STORE_DIR (repeatable)")
    ap.add_argument("--encoder", action="append", default=[], help="NAME=RUN_DIR (repeatable)")
    ap.add_argument("--variant", action="append", default=[], help="NAME:key=value,... (repeatable)")
    ap.add_argument("--baselines", default="ce,ls", help="grid methods trained beside (ce is always)")
    ap.add_argument("--num-threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.num_threads)
    out = Path(args.out)
    preset = get_preset(args.preset)
    stores = dict(s.split("=", 1) for s in args.store)
    encoders = dict(e.split("=", 1) for e in args.encoder)
    variants = [parse_variant(t) for t in args.variant]

    rows = []
    for m in dict.fromkeys(["ce", *filter(None, args.baselines.split(","))]):
        _train(preset, m, args.seed, out / "runs" / m, args.num_threads)
        rows.append({"name": m, "kind": "baseline", **val_metrics(out / "runs" / m)})
        print(json.dumps(rows[-1]), flush=True)
    encoders.setdefault("ce", str(out / "runs" / "ce"))
    for v in variants:
        store = annotated_store(out, v, stores, encoders)
        extra = {}
        if v["w"] != DEFAULTS["w"]:
            extra["csm_weight"] = v["w"]
        if v["per"] != DEFAULTS["per"]:
            extra["csm_per_real"] = v["per"]
        if v["loss"] != DEFAULTS["loss"]:
            extra["csm_loss"] = v["loss"]
        run = out / "runs" / v["name"]
        _train(preset, "csm", args.seed, run, args.num_threads, csm_data=str(store), **extra)
        rows.append({**v, "kind": "csm", "soft_label_c1_by_position": soft_label_profile(store),
                     **generated_fit(run, store), **val_metrics(run)})
        print(json.dumps(rows[-1]), flush=True)

    if variants:  # how the baselines, trained without it, see the first variant's generated set
        first = annotated_store(out, variants[0], stores, encoders)
        for r in rows:
            if r["kind"] == "baseline":
                r.update(generated_fit(out / "runs" / r["name"], first))
    chosen = (choose_csm(rows) or {}).get("name")
    for r in rows:  # test metrics only now, after the choice
        r.update(test_metrics(out / "runs" / r["name"]))
    res = {"preset": args.preset, "seed": args.seed, "stores": stores, "encoders": encoders,
           "chosen_on_validation": chosen, "rows": rows}
    (out / "ablation.json").write_text(json.dumps(res, indent=2))
    print(f"\n| run | store | enc | s | w | per | loss | val acc | val ECE | val conf | conf on gen. mixes | "
          f"their soft max | test acc | test ECE | test conf | test ECE after TS |\n|{'---|' * 16}")
    for r in rows:
        def pct(k, r=r):
            return f"{100 * r[k]:.2f}" if k in r else "-"
        print(f"| {r['name']}{' (chosen)' if r['name'] == chosen else ''} | {r.get('store', '-')} | "
              f"{r.get('enc', '-') if r.get('labels') != 'lam' else 'none'} | {r.get('s', '-')} | {r.get('w', '-')} | "
              f"{r.get('per', '-')} | {r.get('loss', '-')} | {pct('val_acc')} | {pct('val_ece')} | {pct('val_conf')} | "
              f"{pct('gen_conf_interior')} | {pct('soft_max_interior')} | "
              f"{pct('test_acc')} | "
              f"{pct('test_ece')} | {pct('test_conf')} | {pct('test_ece_ts')} |")
    return res


if __name__ == "__main__":
    main()
