"""CSM end to end through the command line: train-generator -> generate -> annotate -> train --method csm."""

import json

import pytest
import torch

pytest.importorskip("diffusers")

from calibkit.cli import main  # noqa: E402
from calibkit.methods.csm.dataset import CSMCompanion  # noqa: E402
from calibkit.methods.csm.store import load_annotations, load_store  # noqa: E402
from tests.models.pretrained_skip import HAS_EFFICIENTNET  # noqa: E402

# Tiny networks run on one torch thread (see conftest.one_thread).
pytestmark = pytest.mark.usefixtures("one_thread")


def test_csm_pipeline_on_digits(tmp_path):
    gen, store, ref, run = (str(tmp_path / n) for n in ("gen", "store", "ref", "run"))
    tiny = ["--channels", "8,16,16", "--batch-size", "8", "--checkpoint-every", "2"]
    assert main(["csm", "train-generator", "--data", "digits", "--steps", "2", "--out", gen, *tiny]) == 0
    # Resuming with a larger budget continues from step 2 (the log gets a record for step 3).
    assert main(["csm", "train-generator", "--data", "digits", "--steps", "3", "--out", gen, *tiny]) == 0
    log = [json.loads(line) for line in (tmp_path / "gen" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [2, 3]
    meta = json.loads((tmp_path / "gen" / "generator.json").read_text())
    assert meta["train"]["steps_done"] == 3 and "train-generator" in meta["command"]

    # 9 groups: pairs (0, 1) .. (0, 9), so every class has a group.
    assert main(["csm", "generate", "--generator", gen, "--groups", "9", "--steps", "2", "--out", store]) == 0
    assert load_store(store)["images"].shape == (72, 1, 28, 28)

    train = ["train", "--data", "digits", "--model", "mlp", "--epochs", "1", "--batch-size", "64",
             "--lr", "0.05", "--no-progress", "--quiet"]
    assert main([*train, "--out", ref]) == 0
    assert main(["csm", "annotate", store, "--encoder", "classifier", "--run", ref]) == 0
    tensors, meta = load_annotations(store)
    assert meta["encoder"] == "classifier" and meta["run"] == ref and meta["sharpness"] == 4.0
    assert tensors["soft_labels"].shape == (72, 10)
    assert torch.allclose(tensors["soft_labels"].sum(1), torch.ones(72))
    assert len(CSMCompanion(store, 10)) == 72

    if HAS_EFFICIENTNET:  # the frozen ImageNet backbone re-annotates the same store (prototypes from digits)
        assert main(["csm", "annotate", store, "--encoder", "efficientnet_lite0", "--data", "digits"]) == 0
        pre, meta = load_annotations(store)
        assert meta["encoder"] == "efficientnet_lite0" and meta["image_size"] == 64 and "run" not in meta
        assert pre["prototypes"].shape == (10, 1280)
        torch.testing.assert_close(pre["soft_labels"].sum(1), torch.ones(72))
        assert main(["csm", "annotate", store, "--encoder", "classifier", "--run", ref]) == 0  # back to the run's
    assert main([*train, "--method", "csm", "--csm-data", store, "--out", run]) == 0
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    assert cfg["config"]["method"] == "csm" and cfg["config"]["csm_data"] == store
    assert len(json.loads((tmp_path / "run" / "history.json").read_text())) == 1


def test_annotate_errors_are_clear(tmp_path, capsys):
    assert main(["csm", "annotate", str(tmp_path), "--encoder", "classifier", "--run", str(tmp_path)]) == 1
    assert "error" in capsys.readouterr().err
    assert main(["csm", "annotate", str(tmp_path), "--encoder", "clip"]) == 1
    assert "--clip-dir" in capsys.readouterr().err
    assert main(["csm", "annotate", str(tmp_path), "--encoder", "efficientnet_lite0"]) == 1
    err = capsys.readouterr().err
    assert ("--encoder efficientnet_lite0 needs --data NAME" if HAS_EFFICIENTNET else "calibkit[pretrained]") in err
