"""CSM sampling on the CPU: speed of each setting and the class consistency it keeps.

    python benchmarks/csm_speed.py --generator calibkit/assets/csm/fmnist --run REF_RUN \\
        [--groups 90] [--speed-groups 8] [--steps 20,12,10,8,6] [--guidance 3] [--json OUT]

Two parts, each measured side by side in one process (one thread unless ``--num-threads``):

* **Speed** of a full sampling (all 8 members of ``--speed-groups`` groups, 20 steps) under each
  setting: the previous one (float32, the whole 16-group shard in one batch under ``no_grad``)
  against batches of 64 and 32 images, bfloat16 autocast and ``channels_last``. Settings are
  timed in interleaved rounds and the median is kept, so a load change on a shared machine hits
  them all alike; the ratio to the previous setting is printed.
* **Quality** of fewer Heun steps and of bfloat16: the pure endpoints (lam = 0 and 1) of
  ``--groups`` groups, sampled from the very noises ``calibkit csm generate --seed 0`` uses, are
  classified by a reference classifier (a calibkit run trained on the real training split; the
  test split is not read). Reported: class consistency (overall and per class), agreement of the
  predicted class with the 20-step float32 images, and the RMS pixel difference to them.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from calibkit.methods.csm.generate import sample_groups
from calibkit.methods.csm.generator import load_generator
from calibkit.rundir import load_run, predict_logits

SPEED_SETTINGS = [  # (name, batch images, precision, channels_last)
    ("before: fp32, the 16-group shard (128)", 128, "fp32", False),
    ("fp32, batch 64", 64, "fp32", False),
    ("bf16, batch 128", 128, "bf16", False),
    ("bf16, batch 64", 64, "bf16", False),
    ("bf16, batch 32", 32, "bf16", False),
    ("bf16, batch 64, channels_last", 64, "bf16", True),
]


def _speed(model, groups: int, guidance: float, rounds: int) -> list[dict]:
    times = {name: [] for name, *_ in SPEED_SETTINGS}
    gs = list(range(groups))
    for _ in range(rounds):
        for name, bs, prec, cl in SPEED_SETTINGS:
            m = model.to(memory_format=torch.channels_last if cl else torch.contiguous_format)
            t = time.perf_counter()
            sample_groups(m, gs, seed=0, steps=20, guidance=guidance, batch_size=bs, precision=prec)
            times[name].append(time.perf_counter() - t)
    model.to(memory_format=torch.contiguous_format)
    n = groups * 8
    base = statistics.median(times[SPEED_SETTINGS[0][0]])
    return [{"setting": name, "batch": bs, "precision": prec, "channels_last": cl,
             "img_per_s": round(n / statistics.median(times[name]), 3),
             "speedup": round(base / statistics.median(times[name]), 2)} for name, bs, prec, cl in SPEED_SETTINGS]


def _quality(model, ref, info, names, groups: int, steps_list, guidance: float) -> list[dict]:
    rows, reference = [], None
    for prec in ("fp32", "bf16"):
        for steps in steps_list:
            t = time.perf_counter()
            out = sample_groups(model, range(groups), seed=0, steps=steps, guidance=guidance, batch_size=64,
                                precision=prec, members=[0, 7])
            dt = time.perf_counter() - t
            target = torch.where(out["member"] == 7, out["c1"], out["c2"])
            pred = predict_logits(ref, out["images"], info).argmax(1)
            ok = (pred == target).float()
            if reference is None:  # the first row: fp32 at the largest step count
                reference = (out["images"].float(), pred)
            row = {"precision": prec, "steps": steps, "img_per_s": round(len(pred) / dt, 3),
                   "consistency": round(float(ok.mean()), 4),
                   "agree_with_reference": round(float((pred == reference[1]).float().mean()), 4),
                   "rms_to_reference": round(float((out["images"].float() - reference[0]).pow(2).mean().sqrt()), 2),
                   "per_class": {names[c]: round(float(ok[target == c].mean()), 3) for c in range(len(names))}}
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "per_class"}), flush=True)
    return rows


def choose(speed: list[dict] | None, quality: list[dict], tolerance: float = 0.01, agreement: float = 0.95) -> dict:
    """The fastest setting that keeps the reference's quality.

    Admissible quality rows: class consistency at most ``tolerance`` below the reference row's
    (the first row: float32, the most steps) and predicted classes agreeing with the reference
    images' on at least ``agreement`` of the endpoints. bfloat16 rows count only if bfloat16 was
    faster in the speed part. Among the admissible rows the fewest steps win (bfloat16 first on a
    tie when it is faster); the batch is the fastest one measured for the chosen precision.
    """
    ref = quality[0]
    best = {}
    for r in speed or []:
        if not r["channels_last"] and (r["precision"] not in best
                                       or r["img_per_s"] > best[r["precision"]]["img_per_s"]):
            best[r["precision"]] = r
    bf16_faster = "bf16" in best and best["bf16"]["img_per_s"] > best.get("fp32", {"img_per_s": 0})["img_per_s"]
    ok = [r for r in quality if r["consistency"] >= ref["consistency"] - tolerance
          and r["agree_with_reference"] >= agreement and (r["precision"] == "fp32" or bf16_faster)]
    pick = min(ok, key=lambda r: (r["steps"], (r["precision"] == "fp32") == bf16_faster))
    return {"steps": pick["steps"], "precision": pick["precision"],
            "batch_size": best.get(pick["precision"], {}).get("batch", 64),
            "consistency": pick["consistency"], "reference_consistency": ref["consistency"],
            "rule": f"fewest steps with consistency >= reference - {tolerance} and agreement >= {agreement}"}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--generator", default="calibkit/assets/csm/fmnist")
    ap.add_argument("--run", required=True, help="reference classifier run directory")
    ap.add_argument("--groups", type=int, default=90, help="groups whose endpoints are checked (quality)")
    ap.add_argument("--speed-groups", type=int, default=16,
                    help="groups sampled per speed timing (16 = one default shard)")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved timing rounds (median kept)")
    ap.add_argument("--steps", default="20,12,10,8,6", help="Heun step counts (the first is the reference)")
    ap.add_argument("--guidance", type=float, default=3.0)
    ap.add_argument("--num-threads", type=int, default=1)
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.num_threads)

    model = load_generator(args.generator)
    ref, _, info = load_run(args.run)
    names = info["class_names"]
    steps_list = [int(s) for s in args.steps.split(",")]
    res = {"generator": args.generator, "reference_run": args.run, "guidance": args.guidance,
           "threads": args.num_threads,
           "machine": f"{platform.machine()} {platform.processor() or ''} torch {torch.__version__}".strip()}
    if not args.skip_speed:
        res["speed"] = _speed(model, args.speed_groups, args.guidance, args.rounds)
        for r in res["speed"]:
            print(f"{r['setting']:<36} {r['img_per_s']:7.2f} img/s  x{r['speedup']:.2f}", flush=True)
    res["quality"] = _quality(model, ref, info, names, args.groups, steps_list, args.guidance)
    res["chosen"] = choose(res.get("speed"), res["quality"])
    print("chosen:", json.dumps(res["chosen"]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return res


if __name__ == "__main__":
    main()
