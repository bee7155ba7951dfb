"""The bench's two-stage methods on a real (tiny) CE run: a resumed MaC-Cal stage-2 directory is
reused only when finished, and CSM's annotated copy of the generated set is cached per CE run and
sharpness, with the preset's sharpness reaching the annotation."""

import importlib
import json
import shutil
from types import SimpleNamespace

import pytest
import torch

from calibkit import rundir
from calibkit.bench import twostage
from calibkit.bench.runner import run_dir_for
from calibkit.distributed import Dist

pytestmark = pytest.mark.usefixtures("one_thread")

SHIPPED = twostage.SHIPPED_STORES["fmnist"]


@pytest.fixture(scope="module")
def ce_root(tmp_path_factory):
    from calibkit.train import load_config, train

    root = tmp_path_factory.mktemp("twostage")
    train(load_config(data="digits", model="mlp", epochs=1, num_threads=1, device="cpu"),
          run_dir_for(root, "p", "ce", 0), progress=False, verbose=False)
    return root


def _bench(root, sharpness=2.5, rank=0):
    preset = SimpleNamespace(name="p", dataset="digits", csm={"sharpness": sharpness},
                             maccal={"epochs": 2, "mc_samples": 4})
    return SimpleNamespace(out=root, preset=preset, dd=Dist(rank=rank, world=2 if rank else 1),
                           csm_store=str(SHIPPED), data_dir=None, device="cpu")


def _counting(monkeypatch, module, name):
    real, calls = getattr(module, name), []

    def wrapper(*a, **k):
        calls.append((a, k))
        return real(*a, **k)

    monkeypatch.setattr(module, name, wrapper)
    return calls


def test_maccal_stage2_dir_is_reused_only_when_finished(ce_root, monkeypatch):
    import calibkit.methods.maccal as maccal_pkg

    calls = _counting(monkeypatch, maccal_pkg, "run_maccal")
    bench, run_dir = _bench(ce_root), ce_root / "runs" / "p" / "maccal" / "seed0"
    first = twostage.produce_maccal(bench, 0, run_dir)
    assert len(calls) == 1 and calls[0][1]["epochs"] == 2 and calls[0][1]["mc_samples"] == 4
    rec = json.loads((run_dir / "maccal.json").read_text())
    want_time = rec["stage2_wall_time_s"] + rec["feature_time_s"] + rec.get("inference_time_s", 0.0)
    assert first["train_time_s"] == pytest.approx(want_time, rel=1e-12)
    ce_info = rundir.load_info(run_dir_for(ce_root, "p", "ce", 0))
    assert first["extra"]["stage1_train_time_s"] == ce_info["wall_time_s"]
    for key in ("keep_rates", "best_keep_rate", "best_epoch", "hparams", "best_val_ece"):
        assert first["extra"][key] == rec[key], key
    assert len(rec["keep_rates"]) == 2
    # Finished: reused as it is (nothing retrained, same numbers).
    weights = (run_dir / "model.safetensors").read_bytes()
    again = twostage.produce_maccal(bench, 0, run_dir)
    assert len(calls) == 1 and again == first
    # Not finished (no logits, or a config that is not "done"): cleared and run again.
    (run_dir / rundir.LOGITS).unlink()
    (run_dir / "stray.txt").write_text("x")
    twostage.produce_maccal(bench, 0, run_dir)
    assert len(calls) == 2 and not (run_dir / "stray.txt").exists() and (run_dir / rundir.LOGITS).is_file()
    assert (run_dir / "model.safetensors").read_bytes() == weights  # same seed: same stage 2
    info = json.loads((run_dir / rundir.CONFIG).read_text())
    info["status"] = "running"
    (run_dir / rundir.CONFIG).write_text(json.dumps(info))
    twostage.produce_maccal(bench, 0, run_dir)
    assert len(calls) == 3 and rundir.load_info(run_dir)["status"] == "done"
    # Another rank never runs stage 2 (rank 0 does).
    other = twostage.produce_maccal(_bench(ce_root, rank=1), 0, ce_root / "elsewhere")
    assert other == {"run_dir": ce_root / "elsewhere", "train_time_s": None} and len(calls) == 3
    assert not (ce_root / "elsewhere").exists()


def test_maccal_needs_a_finished_ce_run(tmp_path):
    with pytest.raises(RuntimeError, match="CE run of seed 3"):
        twostage.produce_maccal(_bench(tmp_path), 3, tmp_path / "m")


def test_csm_annotation_cache_per_ce_run_and_sharpness(ce_root, monkeypatch):
    annotate = importlib.import_module("calibkit.methods.csm.annotate")  # the package exports a function of that name
    from calibkit.methods.csm.store import ANNOT_META, ANNOT_TENSORS

    calls = _counting(monkeypatch, annotate, "annotate_store")
    shipped_files = sorted(p.name for p in SHIPPED.iterdir())
    dst = twostage.csm_store(_bench(ce_root, sharpness=2.5), 0)
    assert dst == ce_root / "cache" / "csm" / "p" / "seed0-s2.5" and len(calls) == 1
    assert calls[0][1]["sharpness"] == 2.5
    meta = json.loads((dst / ANNOT_META).read_text())
    enc = annotate.ClassifierEncoder(run_dir_for(ce_root, "p", "ce", 0))
    assert meta["sharpness"] == 2.5 and meta["weights_sha256"] == enc.identity["weights_sha256"]
    assert meta["source_store"] == str(SHIPPED) and meta["bench_preset"] == "p"
    t = rundir.read_tensors(dst / ANNOT_TENSORS)
    torch.testing.assert_close(t["lam_annot"].double(), torch.sigmoid(2.5 * (t["lam_hat"].double() - 0.5)),
                               rtol=0, atol=1e-6)
    assert sorted(p.name for p in SHIPPED.iterdir()) == shipped_files  # the shipped set is untouched
    assert [f.name for f in dst.parent.iterdir()] == [dst.name]  # no temporary copy left
    assert dst.stat().st_mode & 0o777 == 0o755  # readable by every worker, not mkdtemp's 0700
    # Cached: the same CE weights are not annotated twice.
    assert twostage.csm_store(_bench(ce_root, sharpness=2.5), 0) == dst and len(calls) == 1
    # Annotated by other weights (a retrained CE run): annotated again.
    meta["weights_sha256"] = "0" * 16
    (dst / ANNOT_META).write_text(json.dumps(meta))
    assert twostage.csm_store(_bench(ce_root, sharpness=2.5), 0) == dst and len(calls) == 2
    assert json.loads((dst / ANNOT_META).read_text())["weights_sha256"] == enc.identity["weights_sha256"]
    # Another sharpness: its own copy, annotated with that sharpness.
    dst4 = twostage.csm_store(_bench(ce_root, sharpness=4.0), 0)
    assert dst4.name == "seed0-s4" and len(calls) == 3 and calls[2][1]["sharpness"] == 4.0
    assert json.loads((dst4 / ANNOT_META).read_text())["sharpness"] == 4.0
    shutil.rmtree(dst4)


def test_csm_annotation_landed_first_by_another_worker_is_kept(ce_root, monkeypatch):
    annotate = importlib.import_module("calibkit.methods.csm.annotate")
    from calibkit.methods.csm.store import ANNOT_META

    real = annotate.annotate_store
    bench = _bench(ce_root, sharpness=3.0)
    dst = twostage._csm_cache(bench, 0)

    def racing(tmp, *args, **kwargs):  # another worker finishes the same annotation meanwhile
        real(tmp, *args, **kwargs)
        shutil.copytree(tmp, dst)
        (dst / "landed-first").write_text("")

    monkeypatch.setattr(annotate, "annotate_store", racing)
    assert twostage.csm_store(bench, 0) == dst
    assert (dst / "landed-first").is_file() and (dst / ANNOT_META).is_file()
    assert not [f.name for f in dst.parent.iterdir() if f.name.endswith(".tmp")]  # ours is removed
    shutil.rmtree(dst)


def test_cli_annotate_passes_its_sharpness(ce_root, tmp_path, capsys):
    from calibkit.cli import main
    from calibkit.methods.csm.store import ANNOT_META, ANNOT_TENSORS

    store = tmp_path / "store"
    shutil.copytree(SHIPPED, store)
    ce = run_dir_for(ce_root, "p", "ce", 0)
    assert main(["csm", "annotate", str(store), "--run", str(ce), "--sharpness", "1.5"]) == 0
    assert json.loads((store / ANNOT_META).read_text())["sharpness"] == 1.5
    t = rundir.read_tensors(store / ANNOT_TENSORS)
    torch.testing.assert_close(t["lam_annot"].double(), torch.sigmoid(1.5 * (t["lam_hat"].double() - 0.5)),
                               rtol=0, atol=1e-6)
    assert "annotated" in capsys.readouterr().out


def test_evaluate_run_on_a_real_run(ce_root):
    from calibkit.bench.evaluation import EvalData, evaluate_run, robustness_metrics, test_metrics
    from calibkit.data import load
    from calibkit.data.corruptions import CORRUPTIONS

    run = run_dir_for(ce_root, "p", "ce", 0)
    model, _, info = rundir.load_run(run)
    bundle = load("digits")
    preset = SimpleNamespace(robust_n=40, severities=[2], dataset="digits", ood="noise")
    data = EvalData(preset, bundle)
    out = evaluate_run(run, data)
    logits = rundir.load_logits(run)
    assert out["metrics"] == test_metrics(logits)
    assert out["logits_path"] == str(run / rundir.LOGITS) and 0 < out["eval_time_s"] < 600
    # OOD: the run's model on the noise images, entropy AUROC by the rank formula.
    predict = lambda x: rundir.predict_logits(model.eval(), x, info, 1024, "cpu")  # noqa: E731
    ood_logits = predict(data.ood_images())
    assert out["ood"]["n_out"] == len(ood_logits) and out["ood"]["dataset"] == "noise"
    ent = lambda z: -(z.double().softmax(1) * z.double().log_softmax(1)).sum(1)  # noqa: E731
    s_in, s_out = ent(logits["test_logits"]), ent(ood_logits)
    auroc = ((s_out[:, None] > s_in[None, :]).double() + 0.5 * (s_out[:, None] == s_in[None, :]).double()).mean()
    assert out["ood"]["auroc_entropy"] == pytest.approx(float(auroc), abs=1e-9)
    # Robustness: the fixed subset's labels and the run's own temperature.
    rob = out["robustness"]
    assert rob["n"] == 40 and rob["corruptions"] == sorted(CORRUPTIONS) and list(rob["by_severity"]) == ["2"]
    idx = data.robust_index()
    want = robustness_metrics(predict, data.corrupted(), bundle.test.labels[idx], out["metrics"]["temperature"])
    assert rob == want
    acc = float((predict(data.corrupted()["contrast/2"]).argmax(1) == bundle.test.labels[idx]).double().mean())
    assert rob["per"]["contrast"]["2"]["acc"] == pytest.approx(acc, abs=1e-12)
    # A run tested on other labels is refused.
    other = SimpleNamespace(test=SimpleNamespace(labels=bundle.test.labels.roll(1), images=bundle.test.images))
    with pytest.raises(ValueError, match="test labels differ"):
        evaluate_run(run, EvalData(preset, other))


# ------------------------------------------------------------------------------ what each part is handed


def test_csm_source_prefers_the_flag_then_the_preset_then_the_shipped_set():
    preset = SimpleNamespace(csm={"store": "/p"}, dataset="fmnist")
    assert twostage.csm_source(preset, "/flag") == "/flag"
    assert twostage.csm_source(preset) == "/p"
    assert twostage.csm_source(SimpleNamespace(csm={}, dataset="fmnist")) == SHIPPED
    assert twostage.csm_source(SimpleNamespace(csm={}, dataset="digits")) is None


def test_maccal_gets_the_benchs_data_and_device_and_reads_an_older_record(ce_root, monkeypatch):
    import calibkit.methods.maccal as maccal_pkg

    calls = _counting(monkeypatch, maccal_pkg, "run_maccal")
    bench = _bench(ce_root)
    bench.data_dir, run_dir = None, ce_root / "runs" / "p" / "maccal" / "seed1k"
    first = twostage.produce_maccal(bench, 0, run_dir)
    assert calls[0][1]["data_dir"] is None and calls[0][1]["device"] == "cpu" and calls[0][1]["seed"] == 0
    ce = run_dir_for(ce_root, "p", "ce", 0)
    assert first["run_dir"] == run_dir and first["extra"]["stage1_run"] == str(ce)
    rec = json.loads((run_dir / "maccal.json").read_text())
    rec.pop("inference_time_s", None)  # written before the deployed predictor's time was recorded
    (run_dir / "maccal.json").write_text(json.dumps(rec))
    again = twostage.produce_maccal(bench, 0, run_dir)
    assert again["train_time_s"] == pytest.approx(rec["stage2_wall_time_s"] + rec["feature_time_s"], rel=1e-12)
    shutil.rmtree(run_dir)
    monkeypatch.setattr(maccal_pkg, "run_maccal", lambda *a, **k: calls.append((a, k)) or (_ for _ in ()).throw(
        RuntimeError("stop")))
    bench.data_dir = "/my/data"
    with pytest.raises(RuntimeError, match="stop"):
        twostage.produce_maccal(bench, 0, run_dir)
    assert calls[-1][1]["data_dir"] == "/my/data"


def test_csm_cache_and_annotation_default_to_sharpness_4(ce_root, monkeypatch):
    annotate = importlib.import_module("calibkit.methods.csm.annotate")

    calls = _counting(monkeypatch, annotate, "annotate_store")
    bench = _bench(ce_root)
    bench.preset.csm = {}
    assert twostage._csm_cache(bench, 0) == ce_root / "cache" / "csm" / "p" / "seed0-s4"
    dst = twostage.csm_store(bench, 0)
    assert dst.name == "seed0-s4" and calls[0][1]["sharpness"] == 4.0
    tmp = calls[0][0][0]  # annotated in a private temporary folder beside the cache, then renamed
    assert tmp.parent == dst.parent and tmp.name.startswith(".seed0-s4.") and tmp.name.endswith(".tmp")
    shutil.rmtree(dst)


def test_csm_store_reads_the_presets_set_and_names_a_missing_one(ce_root, tmp_path, monkeypatch):
    bench = _bench(ce_root, sharpness=1.25)
    bench.csm_store, bench.preset.csm["store"] = None, str(SHIPPED)
    dst = twostage.csm_store(bench, 0)
    assert json.loads((dst / "annotations.json").read_text())["source_store"] == str(SHIPPED)
    shutil.rmtree(dst)
    bench.preset.csm.pop("store")
    with pytest.raises(FileNotFoundError) as err:
        twostage.csm_store(bench, 0)
    assert str(err.value) == ("no CSM generated set for digits (None); generate one with `calibkit csm generate` "
                              "and pass it with --csm-store")
    bench.preset.dataset = "fmnist"  # its shipped set
    monkeypatch.setitem(twostage.SHIPPED_STORES, "fmnist", tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"no CSM generated set for fmnist \(.*nowhere\)"):
        twostage.csm_store(bench, 0)


def test_a_cached_copy_without_its_tensors_is_annotated_again(ce_root, monkeypatch):
    annotate = importlib.import_module("calibkit.methods.csm.annotate")
    from calibkit.methods.csm.store import ANNOT_TENSORS

    calls = _counting(monkeypatch, annotate, "annotate_store")
    removed = _counting(monkeypatch, twostage.shutil, "rmtree")
    bench = _bench(ce_root, sharpness=1.75)
    dst = twostage.csm_store(bench, 0)
    (dst / ANNOT_TENSORS).unlink()
    assert twostage.csm_store(bench, 0) == dst and len(calls) == 2 and (dst / ANNOT_TENSORS).is_file()
    assert ((dst,), {"ignore_errors": True}) in removed  # another worker may be removing it too
    shutil.rmtree(dst)


def test_the_annotated_copy_is_readable_by_every_worker_whatever_the_sources_mode(ce_root, tmp_path):
    private = tmp_path / "private"
    shutil.copytree(SHIPPED, private)
    private.chmod(0o700)
    bench = _bench(ce_root, sharpness=1.5)
    bench.csm_store = str(private)
    dst = twostage.csm_store(bench, 0)
    assert dst.stat().st_mode & 0o777 == 0o755
    shutil.rmtree(dst)


def test_produce_csm_trains_on_the_annotated_copy_and_records_it(ce_root, monkeypatch):
    from calibkit import distributed as D

    trained = []
    bench = _bench(ce_root, sharpness=2.25)
    bench.train = lambda method, seed, run_dir, csm_data=None: trained.append((method, seed, run_dir, csm_data)) or {
        "run_dir": run_dir}
    made = twostage.produce_csm(bench, 0, ce_root / "r")
    dst = twostage._csm_cache(bench, 0)
    assert trained == [("csm", 0, ce_root / "r", dst)]
    meta = json.loads((dst / "annotations.json").read_text())
    assert made == {"run_dir": ce_root / "r", "extra": {
        "csm_store": str(dst), "encoder": meta["encoder"], "encoder_run": meta["run"],
        "source_store": str(SHIPPED), "sharpness": 2.25, "generator_hash": meta.get("generator_hash")}}
    barriers = []
    monkeypatch.setattr(D, "barrier", barriers.append)
    other = _bench(ce_root, sharpness=2.25, rank=1)  # rank 1: rank 0 annotated; it only reads the copy
    other.train = bench.train
    monkeypatch.setattr(twostage, "csm_store", lambda *a: pytest.fail("rank 1 annotated"))
    assert twostage.produce_csm(other, 0, ce_root / "r1")["extra"]["csm_store"] == str(dst)
    assert trained[-1] == ("csm", 0, ce_root / "r1", dst) and barriers == [other.dd]
    shutil.rmtree(dst)


def test_the_pretrained_encoder_annotates_its_own_copy_with_the_ce_runs_training_split(ce_root, monkeypatch):
    annotate = importlib.import_module("calibkit.methods.csm.annotate")

    class Stub:  # stands in for the ImageNet backbone: the bench's wiring is what is checked here
        identity = {"encoder": "efficientnet_lite0", "image_size": 64, "weights_sha256": "f" * 16}

        def __init__(self, device="cpu"):
            self.device = device

        def __call__(self, images):
            return images.float().flatten(1)[:, :16]

    calls = _counting(monkeypatch, annotate, "annotate_store")
    monkeypatch.setattr(annotate, "EfficientNetEncoder", Stub)
    bench = _bench(ce_root, sharpness=2.5)
    bench.preset.csm["encoder"] = "efficientnet_lite0"
    dst = twostage.csm_store(bench, 0)
    assert dst.name == "seed0-s2.5-efficientnet_lite0" and len(calls) == 1
    assert isinstance(calls[0][0][1], Stub)
    ce = run_dir_for(ce_root, "p", "ce", 0)
    images, labels = annotate.ClassifierEncoder(ce).training_split()
    assert torch.equal(calls[0][0][2], images) and torch.equal(calls[0][0][3], labels)
    meta = json.loads((dst / "annotations.json").read_text())
    assert meta["encoder"] == "efficientnet_lite0" and meta["prototype_run"] == str(ce)
    assert meta["prototype_images"] == len(labels)
    assert twostage.csm_store(bench, 0) == dst and len(calls) == 1  # cached
    # the classifier encoder of the same seed and sharpness keeps its own copy
    bench.preset.csm["encoder"] = "classifier"
    assert twostage._csm_cache(bench, 0).name == "seed0-s2.5"
    shutil.rmtree(dst)
