"""Segmentation in the trainer: streamed per-pixel metrics and what a finished run stores.

The logits of a whole segmentation split do not fit in memory (PASCAL VOC validation: 1,449 x 21
x 480 x 480 floats = 28 GB), so a segmentation run never materialises them:

* **Every epoch** the validation images are streamed through the model in batches into a
  :class:`calibkit.metrics.CalibrationAccumulator` (memory O(bins x classes), summed over DDP
  ranks): ``val_acc`` (pixel accuracy), ``val_loss`` (pixel NLL), ``val_ece`` and ``val_miou``
  over every labelled pixel, for the checkpoint policy (``best-miou`` is the MbLS segmentation
  rule) and ``history.json``. AdaFocal updates on the validation pixel sample.
* **At the end** ``logits.safetensors`` holds *pixel samples*: for every image of a split, up to
  ``m`` labelled pixels drawn without replacement by ``numpy.random.default_rng(SeedSequence
  ([0, image index]))`` -- a draw that depends only on the masks, so every run of a data set
  stores the logits of the same pixels and runs can be compared pixel by pixel. ``m`` is
  ``ceil(PIXEL_SAMPLE / N)`` (200,000 pixels per split): ``val_logits`` (P, K), ``val_labels``
  (P,), ``val_image`` (P,) (index of the image in its split), and the same for ``test``. Stored as
  float32: 8.8 MB per split for 11 classes, 16.8 MB for 21.

  The validation sample is what temperature scaling is fitted on (one parameter: 200k pixels pin
  it down far beyond the metric's noise) and AdaFocal's bins; the test sample serves reliability
  diagrams and image-level paired bootstrap intervals (``val_image``/``test_image`` name the
  resampling unit). Every reported test number, before and after temperature scaling, is
  computed over **all** labelled test pixels by streaming the test images through the kept model:
  once at the end of training with ``T`` fitted on the validation sample by NLL (15 bins), stored
  as ``test_metrics`` in ``config.json`` and reused by ``calibkit eval`` and the bench for these
  settings; :func:`evaluate_dense` streams again for any other objective or bin count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

import calibkit.data  # calibkit.data.load read at each call, so a replaced loader is the one used
from calibkit import distributed as D
from calibkit import rundir
from calibkit.calibrators import TemperatureScaling
from calibkit.errors import UserError
from calibkit.metrics import CalibrationAccumulator
from calibkit.train.evaluate import summary

if TYPE_CHECKING:
    from calibkit.data.inputs import SegmentationInputs
    from calibkit.train.state import Log, Run

PIXEL_SAMPLE = 200_000  # pixels stored per split (spread evenly over its images)
PIXEL_SEED = 0  # the draw depends on the masks only, never on the run's seed
DENSE_BATCH = 32  # images per evaluation forward pass


def sample_positions(masks: torch.Tensor, per_image: int, ignore_index: int | None,
                     seed: int = PIXEL_SEED) -> torch.Tensor:
    """Up to ``per_image`` labelled pixel positions of every image, ``-1`` padded.

    Args:
        masks: (N, H, W) per-pixel targets. per_image: m. ignore_index: the void label (None: none).

    Returns:
        int64 (N, m): flat positions ``h * W + w`` in increasing order, then -1 where an image has
        fewer than m labelled pixels.
    """
    flat = masks.reshape(masks.shape[0], -1).cpu().numpy()
    out = np.full((len(flat), per_image), -1, dtype=np.int64)
    for i, row in enumerate(flat):
        valid = np.flatnonzero(row != ignore_index) if ignore_index is not None else np.arange(row.size)
        take = np.random.default_rng(np.random.SeedSequence([seed, i])).permutation(valid.size)[:per_image]
        out[i, : take.size] = np.sort(valid[take])
    return torch.from_numpy(out)


def _gather(logits: torch.Tensor, labels: torch.Tensor, pos: torch.Tensor, void: int):
    """Rows of the sampled pixels: logits (b, m, K) and labels (b, m) (void where ``pos`` is -1)."""
    b, k = logits.shape[:2]
    idx = pos.clamp_min(0)
    rows = logits.reshape(b, k, -1).gather(2, idx[:, None, :].expand(-1, k, -1)).transpose(1, 2)
    lab = labels.reshape(b, -1).long().gather(1, idx)
    return rows.float(), torch.where(pos >= 0, lab, torch.full_like(lab, void))


@torch.no_grad()
def stream(model, split, inputs, batch_size: int | None, device, dd=None, temperatures=(1.0,), positions=None,
           num_classes=None, n_bins: int = 15):
    """One pass over ``split``: accumulators (one per temperature) and the sampled pixel rows.

    Under DDP each rank takes a contiguous chunk of images; the accumulators are synced and the
    samples gathered, so every rank returns the global result. Batches hold at most
    ``DENSE_BATCH`` (32) images whatever ``batch_size`` says: a dense network's activations grow
    with the pixels, and the classification default (1024) would need gigabytes.

    Returns:
        ``(accumulators, sample)``: a list of synced :class:`CalibrationAccumulator` (probabilities
        ``softmax(logits / T)`` for each ``T``), and ``None`` or ``(logits (P, K), labels (P,),
        image (P,))`` of the labelled sampled pixels.
    """
    dd = D.Dist(device=torch.device(device)) if dd is None else dd  # a single process unless told otherwise
    void = inputs.ignore_index
    n = len(split)
    idx, per_rank = D.eval_shard(n, dd)
    real = int(max(0, min(n - dd.rank * per_rank, per_rank)))  # this rank's images before the padding
    accs = [CalibrationAccumulator(n_bins, num_classes=num_classes, ignore_index=void, state="fixed")
            for _ in temperatures]
    rows, labs = [], []
    model.eval()
    batch_size = max(1, min(D.eval_batch_size(device, batch_size), DENSE_BATCH))
    for s in range(0, len(idx), batch_size):
        chunk = idx[s:s + batch_size]
        logits = model(inputs.eval_batch(split.images[chunk].to(device))).float()
        y = split.labels[chunk].to(device)
        keep = min(max(real - s, 0), len(chunk))  # padded images are not counted
        for acc, t in zip(accs, temperatures):
            if keep:
                acc.update((logits[:keep] / t).softmax(1), y[:keep].long())
        if positions is not None:
            r, lab = _gather(logits, y, positions[chunk].to(device), void)
            rows.append(r.cpu())
            labs.append(lab.cpu())
    for acc in accs:
        acc.sync()
    if positions is None:
        return accs, None
    m, k = positions.shape[1], num_classes
    rows_t = torch.cat(rows) if rows else torch.empty(0, m, k)
    labs_t = torch.cat(labs) if labs else torch.empty(0, m, dtype=torch.long)
    rows_t = D.gather_rows(rows_t.to(dd.device), n, dd).cpu().reshape(-1, k)
    labs_t = D.gather_rows(labs_t.to(dd.device), n, dd).cpu().reshape(-1)
    image = torch.arange(n).repeat_interleave(m)
    keep = labs_t != void
    return accs, (rows_t[keep], labs_t[keep], image[keep])


def _positions(split, void, total: int = PIXEL_SAMPLE) -> torch.Tensor:
    return sample_positions(split.labels, max(1, math.ceil(total / max(len(split), 1))), void)


@dataclass
class DenseEvaluator:
    """How a segmentation run is measured (see the module docstring): streamed, never materialised.

    ``inputs`` is the run's pipeline (it names the void label). ``val_positions`` is the
    validation pixel sample AdaFocal updates on: drawn at the first validation of a run whose loss
    updates, then reused every epoch (None until then, and always for the other losses).
    """

    inputs: SegmentationInputs
    val_positions: torch.Tensor | None = None

    def validate(self, run: Run) -> dict:
        """The epoch's validation record over every labelled validation pixel."""
        run.model.eval()
        run.loss_fn.eval()
        val = run.bundle.val
        update = getattr(run.loss_fn, "update", None)  # AdaFocal: its bins and gaps on the pixel sample
        if update is not None and self.val_positions is None:
            self.val_positions = _positions(val, self.inputs.ignore_index)
        accs, sample = stream(run.model, val, self.inputs, run.cfg.eval_batch_size, run.dd.device, run.dd,
                              positions=self.val_positions if update is not None else None,
                              num_classes=run.bundle.num_classes)
        panel = accs[0].compute()
        if update is not None:
            update(sample[0].to(run.dd.device), sample[1].to(run.dd.device))
        return {"val_loss": panel["nll"], "val_acc": panel["acc"], "val_ece": panel["ece"], "val_miou": panel["miou"]}

    def finish(self, run: Run, out: Path, info: dict, log: Log) -> dict:
        """Pixel samples of the kept weights and their test metrics over all pixels; status done."""
        assert run.kept is not None  # every finished run has kept an epoch's weights
        run.model.load_state_dict(run.kept)
        run.model.eval()
        void, k = self.inputs.ignore_index, run.bundle.num_classes
        val, test = run.bundle.val, run.bundle.test
        _, vs = stream(run.model, val, self.inputs, run.cfg.eval_batch_size, run.dd.device, run.dd,
                       positions=_positions(val, void), num_classes=k)
        t = _fit_temperature(vs[0], vs[1])
        accs, ts = stream(run.model, test, self.inputs, run.cfg.eval_batch_size, run.dd.device, run.dd,
                          temperatures=(1.0, t), positions=_positions(test, void), num_classes=k)
        panel, after = accs[0].compute(), accs[1].compute()
        kept = run.kept_record
        info.update(status="done", epochs_done=run.cfg.epochs, best_epoch=run.keeper.epoch,
                    best_val_acc=kept.get("val_acc"), best_val_miou=kept.get("val_miou"),
                    test_acc=panel["acc"], test_ece=panel["ece"], test_miou=panel["miou"], wall_time_s=run.elapsed,
                    ignore_index=void, pixel_sample={"pixels_per_split": PIXEL_SAMPLE, "seed": PIXEL_SEED,
                                                     "val": int(len(vs[1])), "test": int(len(ts[1]))},
                    test_metrics={"temperature": t, "ts_objective": "nll", "n_bins": 15, "before": panel,
                                  "after": after, "n_test_pixels": accs[0].n})
        if run.dd.is_main:
            rundir.write_tensors(out / rundir.LOGITS, {
                "val_logits": vs[0], "val_labels": vs[1], "val_image": vs[2],
                "test_logits": ts[0], "test_labels": ts[1], "test_image": ts[2]})
            rundir.write_json(out / rundir.CONFIG, info)
        log(f"done: kept epoch {run.keeper.epoch} ({run.cfg.keep}; val mIoU {100 * (kept.get('val_miou') or 0):.2f}), "
            f"test pixel acc {panel['acc']:.2%}, mIoU {100 * panel['miou']:.2f}, ECE {100 * panel['ece']:.2f}, "
            f"{run.elapsed:.0f}s -> {out}")
        return summary(info)


def _fit_temperature(val_logits, val_labels, objective: str = "nll", n_bins: int = 15) -> float:
    return float(TemperatureScaling(objective=objective, n_bins=n_bins).fit(val_logits, val_labels).temperature_)


def evaluate_dense(model, split, inputs, val_logits, val_labels, n_bins: int = 15, objective: str = "nll",
                   device="cpu", batch_size: int | None = 64, dd=None) -> dict:
    """Test metrics over every labelled pixel, before and after temperature scaling.

    ``T`` is fitted on the validation pixel sample (``val_logits`` (P, K), ``val_labels`` (P,));
    the test images are streamed once through ``model`` with two accumulators (``T`` = 1 and the
    fitted ``T``).

    Returns:
        ``{"temperature", "before", "after", "n_test_pixels"}``; each panel is
        :func:`calibkit.metrics.evaluate`'s dict (with ``miou``).
    """
    t = _fit_temperature(val_logits, val_labels, objective, n_bins)
    model = model.to(device)
    accs, _ = stream(model, split, inputs, batch_size, torch.device(device), dd, temperatures=(1.0, t),
                     num_classes=int(val_logits.shape[1]), n_bins=n_bins)
    before, after = (a.compute() for a in accs)
    return {"temperature": t, "before": before, "after": after, "n_test_pixels": accs[0].n}


def load_run_data(info: dict, cfg):
    """The data set a run was trained on, checked against the split recorded with the run."""
    bundle = calibkit.data.load(cfg.data, data_dir=cfg.data_dir, seed=cfg.seed, val_size=cfg.val_size,
                                train_subset=cfg.train_subset)
    want = (info.get("split") or {}).get("val_checksum")
    if want and bundle.split.get("val_checksum") != want:
        raise UserError(f"the {cfg.data} validation split differs from the one this run was trained with "
                         f"(checksum {bundle.split.get('val_checksum')} != {want}); the data files changed")
    return bundle
