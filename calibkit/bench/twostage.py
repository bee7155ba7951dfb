"""Grid methods built on the CE run of the same seed: MaC-Cal (stage 2) and CSM.

* MaC-Cal: ``calibkit.methods.maccal.run_maccal`` (which fits a ``MaCCal`` on the CE run's
  features) retrains the CE run's head under adaptive random masks, with the preset's stage-2
  hyperparameters; its training time is stage 2 (features + head + deployed-predictor inference),
  stage 1 being the CE run (recorded in ``extra``).
* CSM: calibkit's generated set of semantic mixes (shipped for Fashion-MNIST under
  ``calibkit/assets/csm/fmnist-groups/``; for other data sets generate one with
  ``calibkit csm generate`` and pass it with ``--csm-store``) is copied into
  ``DIR/cache/csm/<preset>/seed<k>-s<sharpness>[-<encoder>]/`` and annotated there, then a
  ``method="csm"`` training run uses it. The shipped set is never modified. The encoder is the
  preset's ``[csm] encoder``: ``classifier`` (default) takes the penultimate features of the CE run
  of the same seed (the offline reference-classifier encoder; no CLIP weights);
  ``efficientnet_lite0`` the frozen ImageNet EfficientNet-Lite0 backbone (``calibkit[pretrained]``),
  an encoder that never saw the data set, as the seed's CLIP. Either way the prototypes are the mean
  features over the CE run's training split.

Each function takes the :class:`~calibkit.bench.producers.RunFactory` of the run (``runs``) and
is registered under its kind in :data:`calibkit.bench.producers.PRODUCERS`.
"""

from __future__ import annotations

import importlib
import json
import shutil
import tempfile
from pathlib import Path

import calibkit.methods.maccal  # its names read at each call, so a replaced one is the one used
from calibkit import distributed as D
from calibkit import rundir
from calibkit.bench.paths import run_dir_for
from calibkit.errors import UserRuntimeError
from calibkit.methods.csm.annotate import ClassifierEncoder
from calibkit.methods.csm.store import ANNOT_META, ANNOT_TENSORS

# The module, whose encoder classes and annotate_store are read at each call, so that a replaced one
# is the one used (`import calibkit.methods.csm.annotate as ...` would give the package's function).
annotate = importlib.import_module("calibkit.methods.csm.annotate")

SHIPPED_STORES = {"fmnist": Path(__file__).resolve().parent.parent / "assets" / "csm" / "fmnist-groups"}


def csm_source(preset, csm_store=None):
    """The generated set CSM runs use: ``--csm-store``, else the preset's, else the one shipped."""
    return csm_store or preset.csm.get("store") or SHIPPED_STORES.get(preset.dataset)


def _ce_run(runs, seed: int) -> Path:
    ce = run_dir_for(runs.out, runs.preset.name, "ce", seed)
    info = rundir.load_info(ce) if (ce / rundir.CONFIG).is_file() else {}
    if info.get("status") != "done":
        raise UserRuntimeError(f"the CE run of seed {seed} ({ce}) is not finished; MaC-Cal and CSM build on it")
    return ce


def produce_maccal(runs, seed: int, run_dir: Path) -> dict:
    """MaC-Cal stage 2 into ``run_dir`` (reused when already finished)."""
    if not runs.dd.is_main:
        return {"run_dir": run_dir, "train_time_s": None}  # stage 2 is single-process: rank 0 runs it
    ce = _ce_run(runs, seed)
    info = rundir.load_info(run_dir) if (run_dir / rundir.CONFIG).is_file() else {}
    if info.get("status") != "done" or not (run_dir / rundir.LOGITS).is_file():
        if run_dir.exists():
            # An unfinished stage 2 holds no result (run_maccal writes config.json last); it restarts.
            shutil.rmtree(run_dir)
        calibkit.methods.maccal.run_maccal(ce, run_dir, **{"seed": seed, **runs.preset.maccal}, data_dir=runs.data_dir,
                   device=runs.device)
    record = json.loads((run_dir / "maccal.json").read_text())
    stage1 = rundir.load_info(ce)
    return {"run_dir": run_dir,
            "train_time_s": float(record["stage2_wall_time_s"]) + float(record["feature_time_s"])
            + float(record.get("inference_time_s", 0.0)),
            "extra": {"stage1_run": str(ce), "stage1_train_time_s": stage1.get("wall_time_s"),
                      "keep_rates": record["keep_rates"], "best_keep_rate": record["best_keep_rate"],
                      "best_epoch": record["best_epoch"], "hparams": record["hparams"],
                      "best_val_ece": record["best_val_ece"]}}


def _sharpness(runs) -> float:
    """The reannotation sharpness of the preset's CSM runs (4 unless the preset says otherwise)."""
    return float(runs.preset.csm.get("sharpness", 4.0))


def _encoder_name(runs) -> str:
    """The reannotation encoder of the preset's CSM runs (``[csm] encoder``; ``classifier`` by default)."""
    return str(runs.preset.csm.get("encoder", "classifier"))


def _csm_cache(runs, seed: int) -> Path:
    # One annotated copy per seed, sharpness and encoder: tuning candidates of different sharpness
    # never share one, and neither do presets that differ only in the encoder.
    name = _encoder_name(runs)
    suffix = "" if name == "classifier" else f"-{name}"
    return runs.out / "cache" / "csm" / runs.preset.name / f"seed{seed}-s{_sharpness(runs):g}{suffix}"


def _encoder(runs, ce: Path):
    """The encoder of the reannotation: the CE run of the seed, or the frozen pretrained backbone."""
    if _encoder_name(runs) == "efficientnet_lite0":
        return annotate.EfficientNetEncoder(device=runs.device)
    return ClassifierEncoder(ce)


def csm_store(runs, seed: int) -> Path:
    """The annotated copy of the generated set for ``seed`` (built once per bench directory)."""
    src = csm_source(runs.preset, runs.csm_store)
    if src is None or not Path(src).is_dir():
        raise FileNotFoundError(
            f"no CSM generated set for {runs.preset.dataset} ({src}); generate one with `calibkit csm generate` "
            "and pass it with --csm-store")
    dst = _csm_cache(runs, seed)
    ce = _ce_run(runs, seed)
    enc = _encoder(runs, ce)
    meta_path = dst / ANNOT_META
    if meta_path.is_file() and (dst / ANNOT_TENSORS).is_file():
        meta = json.loads(meta_path.read_text())
        if (meta.get("weights_sha256") == enc.identity["weights_sha256"]
                and meta.get("prototype_run") == str(ce)):
            return dst  # annotated with this very encoder and CE run already
    if dst.exists():
        shutil.rmtree(dst, ignore_errors=True)
    # A unique temporary directory: workers or hosts sharing OUT may annotate the same seed at once.
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent))
    try:
        shutil.copytree(src, tmp, ignore=shutil.ignore_patterns(ANNOT_META, ANNOT_TENSORS), dirs_exist_ok=True)
        # After the copy, which gives tmp the source folder's mode: mkdtemp's is private (0700), a
        # source's may be too; the annotated set is read by every worker.
        tmp.chmod(0o755)
        # the prototypes' images: the training split of the seed's CE run (the classifier encoder is that run)
        split = enc if isinstance(enc, ClassifierEncoder) else ClassifierEncoder(ce)
        images, labels = split.training_split()
        annotate.annotate_store(tmp, enc, images, labels, sharpness=_sharpness(runs),
                       extra_meta={"source_store": str(src), "bench_preset": runs.preset.name,
                                   "prototype_run": str(ce)})
        try:
            tmp.rename(dst)  # the store appears only once fully annotated
        except OSError:  # another worker's copy landed first: it annotates the same CE run alike
            if not (dst / ANNOT_META).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dst


def produce_csm(runs, seed: int, run_dir: Path) -> dict:
    """CSM training run into ``run_dir`` on the annotated generated set (annotated by rank 0 only)."""
    store = csm_store(runs, seed) if runs.dd.is_main else None
    D.barrier(runs.dd)
    if store is None:  # not rank 0: the copy rank 0 has built
        store = _csm_cache(runs, seed)
    made = runs.train("csm", seed, run_dir, csm_data=store)
    meta = json.loads((store / "annotations.json").read_text())
    made["extra"] = {"csm_store": str(store), "encoder": meta.get("encoder"), "encoder_run": meta.get("run"),
                     "source_store": meta.get("source_store"), "sharpness": meta.get("sharpness"),
                     "generator_hash": meta.get("generator_hash")}
    return made
