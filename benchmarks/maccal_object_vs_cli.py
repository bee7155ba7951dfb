"""MaC-Cal through the ``MaCCal`` object equals the command-line / bench path on a run's features.

Loads a finished stage-1 run, computes its train/val/test features with ``extract_features`` and
the run's own input pipeline, fits ``MaCCal`` with the hyperparameters recorded by a MaC-Cal run
made from it (``calibkit maccal`` or the bench), and compares the selected epoch, the keep rate
and the test probabilities with that run's stored predictions.

    python benchmarks/maccal_object_vs_cli.py B/runs/default/ce/seed0 B/runs/default/maccal/seed0
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from calibkit import rundir
from calibkit.data import load
from calibkit.data.inputs import inputs_from_info
from calibkit.methods.maccal import MaCCal, extract_features


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stage1", help="the stage-1 run")
    ap.add_argument("maccal", help="a MaC-Cal run made from it")
    args = ap.parse_args()
    model, cfg, info = rundir.load_run(args.stage1)
    bundle = load(cfg.data, data_dir=cfg.data_dir, seed=cfg.seed, val_size=cfg.val_size,
                  train_subset=cfg.train_subset)
    prepare = inputs_from_info(info)
    feats = [extract_features(model, (p.images, p.labels), lambda m, x: m.forward_features(prepare.eval_batch(x)))
             for p in (bundle.train, bundle.val, bundle.test)]
    record = json.loads((Path(args.maccal) / "maccal.json").read_text())
    hparams = dict(record["hparams"])
    est = MaCCal(model.head, loss=hparams.pop("loss"), **hparams).fit(*feats[0], *feats[1])
    stored = rundir.load_logits(args.maccal)["test_logits"].softmax(1)
    diff = float((est.predict_proba(feats[2][0]) - stored).abs().max())
    print(f"MaCCal: epoch {est.best_epoch_}, keep rate {est.keep_rate_:.6f} | run: epoch {record['best_epoch']}, "
          f"keep rate {record['best_keep_rate']:.6f} | max |p_object - p_run| on test = {diff:.2e}")


if __name__ == "__main__":
    main()
