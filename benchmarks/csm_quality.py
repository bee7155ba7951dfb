"""Quality check of a CSM generated set: class consistency of the pure endpoints and a figure.

    python benchmarks/csm_quality.py STORE --run REF_RUN [--figure docs/csm_groups.png]

* Class consistency: a reference classifier (a calibkit run trained on the real training split,
  e.g. ``calibkit train --config fmnist --seed 0 --out runs/csm-ref``) classifies the pure endpoints
  of every group (lam = 1 -> class c1, lam = 0 -> class c2); reported overall and per class, beside
  the same classifier's accuracy on the real test split.
* Mixing: the classifier's mean probability of c1 at each of the 8 positions of a group (it should
  rise with lam), and the fraction of groups where it rises monotonically.
* Figure: a few groups (rows) from lam = 0 (left, class c2) to lam = 1 (right, class c1).
"""

from __future__ import annotations

import argparse
import json
import platform

import torch

from calibkit.data import load
from calibkit.methods.csm.store import load_store
from calibkit.rundir import load_run, predict_logits

# (c1, c2) pairs worth looking at in Fashion-MNIST (c1 < c2 as stored; drawn c2 -> c1).
FIGURE_PAIRS = [(0, 3), (7, 9), (5, 7), (0, 6), (2, 4), (1, 8), (3, 4), (5, 9)]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("store")
    ap.add_argument("--run", required=True, help="reference classifier run directory")
    ap.add_argument("--figure", default=None, help="PNG of mixing groups")
    ap.add_argument("--json", default=None, help="write the numbers here")
    args = ap.parse_args(argv)

    store = load_store(args.store)
    man = store["manifest"]
    model, cfg, info = load_run(args.run)
    bundle = load(cfg.data, data_dir=cfg.data_dir, seed=cfg.seed, val_size=cfg.val_size,
                  train_subset=cfg.train_subset)
    k, n = man["num_classes"], man["group_size"]
    test_acc = (predict_logits(model, bundle.test.images, info).argmax(1) == bundle.test.labels).float().mean()

    probs = predict_logits(model, store["images"], info).softmax(1).view(-1, n, k)  # (G, 8, K)
    c1, c2 = store["c1"][::n], store["c2"][::n]
    g = torch.arange(len(c1))
    pred_end = torch.cat([probs[:, n - 1].argmax(1), probs[:, 0].argmax(1)])
    true_end = torch.cat([c1, c2])
    correct = (pred_end == true_end).float()
    per_class = {bundle.class_names[c]: round(float(correct[true_end == c].mean()), 3)
                 for c in range(k) if (true_end == c).any()}
    p_c1 = probs[g[:, None], torch.arange(n)[None, :], c1[:, None]]  # (G, 8): belief in c1 along lam
    monotone = (p_c1[:, 1:] >= p_c1[:, :-1] - 0.02).all(1).float().mean()
    res = {
        "store": args.store, "reference_run": args.run, "generator_hash": man["generator_hash"],
        "guidance": man["guidance"], "steps": man["steps"], "groups": man["num_groups"],
        "reference_test_accuracy": round(float(test_acc), 4),
        "endpoint_accuracy": round(float(correct.mean()), 4), "endpoints": int(len(correct)),
        "endpoint_accuracy_per_class": per_class,
        "mean_p_c1_by_member": [round(float(v), 3) for v in p_c1.mean(0)],
        "monotone_fraction": round(float(monotone), 3),
        "machine": f"{platform.machine()} {torch.get_num_threads()} threads, torch {torch.__version__}",
    }
    print(json.dumps(res, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    if args.figure:
        _figure(store, bundle.class_names, args.figure, n)
    return res


def _figure(store, names, path, n):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c1, c2 = store["c1"][::n].tolist(), store["c2"][::n].tolist()
    rows = []
    for pair in FIGURE_PAIRS:
        hits = [i for i, p in enumerate(zip(c1, c2)) if p == pair]
        if hits:
            rows.append(hits[0])
    rows = rows or list(range(min(8, len(c1))))  # small stores: the first groups
    imgs = store["images"].view(-1, n, *store["images"].shape[1:])
    lam = torch.linspace(0, 1, n)
    fig, axes = plt.subplots(len(rows), n, figsize=(n * 0.9, len(rows) * 1.0 + 0.4), squeeze=False)
    for r, gi in enumerate(rows):
        for m in range(n):
            ax = axes[r, m]
            ax.imshow(imgs[gi, m, 0].numpy(), cmap="gray", vmin=0, vmax=255)
            ax.set_xticks([]), ax.set_yticks([])
            if r == 0:
                ax.set_title(f"lam={lam[m]:.2f}", fontsize=7)
        axes[r, 0].set_ylabel(f"{names[c2[gi]]}\n-> {names[c1[gi]]}", fontsize=6)
    fig.suptitle("CSM groups: one initial noise, condition lam*onehot(c1) + (1-lam)*onehot(c2)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"figure written to {path}")


if __name__ == "__main__":
    main()
