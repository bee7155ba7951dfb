"""What the bench measures on one finished run.

* Test metrics (``calibkit.metrics.evaluate``) before and after temperature scaling, with the
  temperature fitted on the validation logits (``calibkit.calibrators.TemperatureScaling``).
* OOD detection: AUROC (OOD = positive) and FPR at 95% TPR of the normalised predictive entropy
  and of ``1 - max confidence``, the in-distribution test set against the preset's offline OOD set
  (``calibkit.data.load_ood``).
* Robustness: accuracy and ECE (before and after TS, with the same temperature) on every
  corruption of ``calibkit.data.corruptions.CORRUPTIONS`` at every severity of the preset, over a
  fixed subset of the test set (``Preset.robust_n`` images drawn with seed 0, the same for every
  run, so that the numbers of different methods are paired); means per severity and overall.
  Presets with no severities (the text presets: the corruptions are image transforms) and inputs
  that are not images (token ids, features of the ``tensors`` data set) record none.
  A preset with ``ood = "none"`` records no OOD measurement.

The corrupted and OOD image sets depend only on the data, so :class:`EvalData` builds them once
per bench (for every seed and run), keeps one copy on the evaluation device, and caches the
corrupted sets under ``DIR/cache/`` for resumed benches.

Segmentation runs: the test metrics over every labelled test pixel, before and after temperature
scaling fitted on the run's validation pixel sample (:func:`calibkit.train.dense.evaluate_dense`,
the test images streamed through the model); no OOD or corruption measurements.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

import calibkit.data.ood  # its names read at each call, so a replaced one is the one used
import calibkit.train.dense  # its names read at each call, so a replaced one is the one used
from calibkit import rundir
from calibkit.calibrators import evaluate_before_after_ts
from calibkit.data import corruptions  # corruptions.corrupt read at each call, so a replaced one is used
from calibkit.data.corruptions import CORRUPTIONS
from calibkit.data.inputs import inputs_from_info
from calibkit.data.ood import NO_OOD
from calibkit.errors import UserError
from calibkit.functional import accuracy, ece, entropy_score, fpr_at_95_tpr, max_confidence_score, ood_auroc


class EvalData:
    """The test, OOD and corrupted image sets of a preset, built once and reused by every run.

    Args:
        preset: the bench preset.
        bundle: a loaded ``DataBundle`` of the preset's data set (its test split is used).
        cache_dir: where to keep the corrupted test subset between benches (None: memory only).
        data_dir: passed to ``load_ood`` for OOD sets that live on disk.
    """

    def __init__(self, preset, bundle, cache_dir=None, data_dir=None):
        self.preset = preset
        self.bundle = bundle
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.data_dir = data_dir
        self._ood = None
        self._corrupted = None
        self._moved = {}  # (what, device) -> the set on that device

    def on(self, what: str, device) -> torch.Tensor | dict:
        """``ood_images()`` or ``corrupted()`` on ``device``, copied there once per bench."""
        key = (what, str(torch.device(device)))
        if key not in self._moved:
            found = self.ood_images() if what == "ood" else self.corrupted()
            self._moved[key] = (found.to(device) if isinstance(found, torch.Tensor)
                                else {k: v.to(device) for k, v in found.items()})
        return self._moved[key]

    def ood_images(self) -> torch.Tensor:
        """uint8 OOD images shaped like the test images."""
        if self._ood is None:
            self._ood = calibkit.data.ood.load_ood(self.preset.ood, like=self.bundle, data_dir=self.data_dir)
        return self._ood

    def robust_index(self) -> torch.Tensor:
        n_test = len(self.bundle.test)
        n = n_test if self.preset.robust_n in (0, None) else min(self.preset.robust_n, n_test)
        return torch.randperm(n_test, generator=torch.Generator().manual_seed(0))[:n].sort().values

    def corrupted(self) -> dict[str, torch.Tensor]:
        """``{"<corruption>/<severity>": uint8 images}`` for the fixed robustness subset."""
        if self._corrupted is not None:
            return self._corrupted

        idx = self.robust_index()
        # One order for the fresh and the cached sets (safetensors returns its keys sorted): the
        # robustness means sum in this order, so a bench that reads the cache (another process, a
        # resumed bench) gets the same floats to the last bit as the one that built it.
        order = [f"{name}/{s}" for name in CORRUPTIONS for s in self.preset.severities]
        path = None
        if self.cache_dir is not None:
            sev = "-".join(map(str, self.preset.severities))
            path = self.cache_dir / f"corrupted_{self.preset.dataset}_n{len(idx)}_s{sev}.safetensors"
            if path.is_file():
                try:
                    cached = rundir.read_tensors(path)
                    if set(cached) == set(order):
                        self._corrupted = {k: cached[k] for k in order}
                        return self._corrupted
                except ValueError:
                    pass  # a cache killed mid-write is rebuilt, never trusted
        clean = self.bundle.test.images[idx]
        out = {}
        for name in CORRUPTIONS:
            for s in self.preset.severities:
                out[f"{name}/{s}"] = corruptions.corrupt(clean, name, s, seed=0)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            rundir.write_tensors(path, out)
        self._corrupted = out
        return out


def _probs(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    return (logits.double() / temperature).softmax(1)


def _num(d: dict) -> dict:
    return {k: float(v) for k, v in d.items()}


def test_metrics(logits: dict) -> dict:
    """``{"before", "after", "temperature"}`` from a run's val/test logits."""
    panels = evaluate_before_after_ts(logits["val_logits"], logits["val_labels"],
                                      logits["test_logits"], logits["test_labels"])
    return {"before": _num(panels["before"]), "after": _num(panels["after"]),
            "temperature": panels["temperature"]}


def ood_metrics(test_logits: torch.Tensor, ood_logits: torch.Tensor, name: str) -> dict:
    """AUROC and FPR@95%TPR of the entropy and max-confidence scores."""
    p_in, p_out = _probs(test_logits), _probs(ood_logits)
    out = {"dataset": name, "n_in": len(p_in), "n_out": len(p_out)}
    for tag, score in (("entropy", entropy_score), ("maxconf", max_confidence_score)):
        s_in, s_out = score(p_in), score(p_out)
        out[f"auroc_{tag}"] = float(ood_auroc(s_in, s_out))
        out[f"fpr95_{tag}"] = float(fpr_at_95_tpr(s_in, s_out))
    return out


def robustness_metrics(predict, corrupted: dict, labels: torch.Tensor, temperature: float) -> dict:
    """Per corruption and severity: acc, ECE, ECE after TS; means per severity and overall."""
    per: dict[str, dict] = {}
    for key, images in corrupted.items():
        name, sev = key.split("/")
        logits = predict(images)
        per.setdefault(name, {})[sev] = {"acc": float(accuracy(_probs(logits), labels)),
                                         "ece": float(ece(_probs(logits), labels)),
                                         "ece_ts": float(ece(_probs(logits, temperature), labels))}
    by_sev: dict[str, dict] = {}
    for sev in sorted({s for d in per.values() for s in d}, key=int):
        cells = [d[sev] for d in per.values() if sev in d]
        by_sev[sev] = {k: sum(c[k] for c in cells) / len(cells) for k in ("acc", "ece", "ece_ts")}
    overall = {k: sum(v[k] for v in by_sev.values()) / len(by_sev) for k in ("acc", "ece", "ece_ts")} if by_sev else {}
    return {"n": len(labels), "corruptions": sorted(per), "per": per, "by_severity": by_sev, "overall": overall}


def evaluate_run(run_dir, data: EvalData, model=None, norm=None, device="cpu", batch_size: int | None = None) -> dict:
    """All the bench's measurements of one finished run directory.

    Args:
        run_dir: holds ``logits.safetensors`` (val/test logits of the selected weights).
        data: the preset's evaluation sets.
        model: the classifier (default: rebuilt from ``run_dir`` with ``load_run``), for the OOD and
            corrupted images; methods that change only the head (MaC-Cal) pass theirs.
        norm: input normalisation for ``predict_logits`` (default: the run's config).

    Returns:
        ``{"metrics", "ood", "robustness", "eval_time_s", "logits_path"}``.
    """
    t0 = time.time()
    run_dir = Path(run_dir)
    logits = rundir.load_logits(run_dir)
    if getattr(data.bundle, "modality", "image") == "segmentation":
        return _evaluate_dense_run(run_dir, logits, data, model, norm, device, t0)
    if not torch.equal(logits["test_labels"].long(), data.bundle.test.labels.long()):
        raise UserError(f"{run_dir}: its test labels differ from the preset's test set")
    metrics = test_metrics(logits)
    if model is None:
        model, _, info = rundir.load_run(run_dir)
        norm = info if norm is None else norm
    model = model.to(device).eval()

    def predict(images):
        return rundir.predict_logits(model, images, norm, batch_size, device)


    ood = None  # ood "none": no OOD measurement
    if data.preset.ood != NO_OOD:
        ood = ood_metrics(logits["test_logits"], predict(data.on("ood", device)), data.preset.ood)
    robust = None  # presets without severities (text: corruptions are image transforms) skip it
    if data.preset.severities and getattr(data.bundle, "modality", "image") == "image":
        idx = data.robust_index()
        corrupted = data.on("corrupted", device)
        assert isinstance(corrupted, dict)  # "corrupted" is a dict of image tensors, "ood" one tensor
        robust = robustness_metrics(predict, corrupted, data.bundle.test.labels[idx], metrics["temperature"])
    return {"metrics": metrics, "ood": ood, "robustness": robust, "eval_time_s": time.time() - t0,
            "logits_path": str(run_dir / rundir.LOGITS)}


def _evaluate_dense_run(run_dir: Path, logits: dict, data: EvalData, model, norm, device, t0: float) -> dict:
    """A segmentation run: streamed pixel metrics of the whole test split before/after TS."""
    if model is None:
        model, _, info = rundir.load_run(run_dir)
        norm = info if norm is None else norm
    inputs = inputs_from_info(norm) if isinstance(norm, dict) else norm
    cached = (norm or {}).get("test_metrics") if isinstance(norm, dict) else None
    if cached and cached.get("ts_objective") == "nll" and cached.get("n_bins") == 15:
        res = cached  # computed by the trainer over every test pixel (calibkit.train.dense)
    else:
        res = calibkit.train.dense.evaluate_dense(model, data.bundle.test, inputs, logits["val_logits"],
                                                  logits["val_labels"], device=device, batch_size=32)
    metrics = {"before": _num(res["before"]), "after": _num(res["after"]), "temperature": res["temperature"],
               "test_pixels": res["n_test_pixels"], "val_pixels": int(len(logits["val_labels"]))}
    return {"metrics": metrics, "ood": None, "robustness": None, "eval_time_s": time.time() - t0,
            "logits_path": str(run_dir / rundir.LOGITS)}
