"""CSM from tensors (the library path) equals the command line, and --device reaches every stage."""

import pytest
import torch

pytest.importorskip("diffusers")

from calibkit.cli import main  # noqa: E402
from calibkit.data import load  # noqa: E402
from calibkit.methods import csm  # noqa: E402
from calibkit.methods.csm.generator import CondDenoiser, load_generator  # noqa: E402
from calibkit.methods.csm.store import load_annotations, load_store  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
TINY = ["--channels", "8,16,16", "--batch-size", "8", "--checkpoint-every", "3"]


@pytest.fixture(scope="module")
def cli_path(tmp_path_factory):
    """train-generator -> generate -> annotate through the command line, on the digits data set."""
    d = tmp_path_factory.mktemp("cli")
    gen, store, ref = (str(d / n) for n in ("gen", "store", "ref"))
    assert main(["csm", "train-generator", "--data", "digits", "--steps", "3", "--seed", "0", "--out", gen,
                 "--device", "cpu", *TINY]) == 0
    assert main(["csm", "generate", "--generator", gen, "--groups", "9", "--steps", "2", "--guidance", "2",
                 "--groups-per-shard", "9", "--seed", "5", "--device", "cpu", "--out", store]) == 0
    assert main(["train", "--data", "digits", "--model", "mlp", "--epochs", "1", "--batch-size", "64",
                 "--lr", "0.05", "--no-progress", "--quiet", "--out", ref]) == 0
    assert main(["csm", "annotate", store, "--encoder", "classifier", "--run", ref, "--sharpness", "3",
                 "--device", "cpu"]) == 0
    return d


def test_tensors_equal_the_command_line(cli_path, tmp_path):
    bundle = load("digits", seed=0)
    cfg = load_generator(cli_path / "gen").config
    model = csm.train_generator(bundle.train.images, bundle.train.labels, tmp_path / "gen",
                                csm.GeneratorTrainConfig(steps=3, batch_size=8, seed=0), cfg,
                                checkpoint_every=3, progress=False)
    cli_model = load_generator(cli_path / "gen")
    for (k, a), (_, b) in zip(sorted(model.state_dict().items()), sorted(cli_model.state_dict().items())):
        assert torch.equal(a, b), k

    groups = csm.generate(model, 9, seed=5, steps=2, guidance=2.0, batch_size=64)
    stored = load_store(cli_path / "store")
    for k in ("images", "c1", "c2", "lam", "group", "member"):
        assert torch.equal(groups[k], stored[k]), k

    # The user's own encoder: a plain function doing what ClassifierEncoder does.
    from calibkit.data import normalize
    from calibkit.rundir import load_run

    net, rcfg, info = load_run(cli_path / "ref")
    ref_bundle = load(rcfg.data, seed=rcfg.seed, val_size=rcfg.val_size, train_subset=rcfg.train_subset)

    def encoder(images):
        with torch.no_grad():
            return net.forward_features(normalize(images, info["mean"], info["std"]))

    out = csm.annotate(groups["images"], groups["c1"], groups["c2"], encoder, ref_bundle.train.images,
                       ref_bundle.train.labels, num_classes=10, sharpness=3.0)
    cli_annot, meta = load_annotations(cli_path / "store")
    assert meta["sharpness"] == 3.0 and meta["encoder"] == "classifier"
    torch.testing.assert_close(out["soft_labels"], cli_annot["soft_labels"], rtol=0, atol=1e-5)

    # The companion built from tensors draws what the one built from the store draws.
    groups["soft_labels"] = cli_annot["soft_labels"]
    a, b = csm.CSMCompanion(groups, 10), csm.CSMCompanion(cli_path / "store", 10)
    labels = torch.tensor([0, 3, 9, 9, 4])
    ia, sa = a.draw(labels, torch.Generator().manual_seed(1))
    ib, sb = b.draw(labels, torch.Generator().manual_seed(1))
    assert torch.equal(ia, ib) and torch.equal(sa, sb)


def test_as_image_tensors_from_floats_and_a_dataset():
    x = torch.tensor([0.0, 0.5, 1.0, 0.2]).view(1, 1, 2, 2).repeat(3, 1, 1, 1)
    y = torch.tensor([2, 0, 1])
    u8, lab = csm.as_image_tensors(x, y)
    assert u8.dtype == torch.uint8 and u8[0].flatten().tolist() == [0, 128, 255, 51]  # round(255 * v)
    ds = torch.utils.data.TensorDataset(x[:, 0], y)  # (H, W) images: one channel added
    u8_ds, lab_ds = csm.as_image_tensors(ds)
    assert torch.equal(u8_ds, u8) and torch.equal(lab_ds, lab)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        csm.as_image_tensors(x * 2 - 1, y)  # normalised images are refused, not silently clipped
    with pytest.raises(ValueError, match="labels"):
        csm.as_image_tensors(x, y[:2])


def test_annotate_rejects_a_bad_encoder():
    imgs = torch.zeros(16, 1, 4, 4, dtype=torch.uint8)
    c1, c2 = torch.zeros(16, dtype=torch.long), torch.ones(16, dtype=torch.long)
    labels = torch.arange(16) % 2
    with pytest.raises(ValueError, match=r"features \(N, D\)"):
        csm.annotate(imgs, c1, c2, lambda x: x.float().flatten(), imgs, labels)
    with pytest.raises(ValueError, match="NaN"):
        csm.annotate(imgs, c1, c2, lambda x: torch.full((len(x), 3), float("nan")), imgs, labels)


def _spy_devices(monkeypatch):
    """Record every device string resolved and the device of every denoiser/encoder input."""
    import calibkit.distributed as D

    asked, seen = [], []
    real_forward = CondDenoiser.forward

    def resolve(name, local_rank=0):
        asked.append(name)
        return torch.device("cpu")  # the only device here; what matters is that the name arrives

    def forward(self, x, sigma, y):
        seen.append((x.device.type, next(self.parameters()).device.type))
        return real_forward(self, x, sigma, y)

    monkeypatch.setattr(D, "resolve_device", resolve)
    monkeypatch.setattr(CondDenoiser, "forward", forward)
    return asked, seen


def test_device_reaches_model_and_sampler(cli_path, tmp_path, monkeypatch):
    asked, seen = _spy_devices(monkeypatch)
    assert main(["csm", "train-generator", "--data", "digits", "--steps", "1", "--out", str(tmp_path / "g"),
                 "--device", "cuda:1", *TINY]) == 0
    assert asked == ["cuda:1"] and seen and set(seen) == {("cpu", "cpu")}
    asked.clear(), seen.clear()
    assert main(["csm", "generate", "--generator", str(cli_path / "gen"), "--groups", "1", "--steps", "2",
                 "--device", "cuda:1", "--out", str(tmp_path / "s")]) == 0
    assert asked == ["cuda:1"] and len(seen) == 3  # 2 steps -> 3 denoiser calls, on the resolved device
    asked.clear()
    assert main(["csm", "annotate", str(tmp_path / "s"), "--run", str(cli_path / "ref"), "--device", "cuda:1"]) == 0
    assert asked == ["cuda:1"]


def test_unavailable_cuda_is_a_clear_error(cli_path, tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    assert main(["csm", "generate", "--generator", str(cli_path / "gen"), "--groups", "1", "--device", "cuda",
                 "--out", str(tmp_path / "s")]) == 1
    assert "CUDA is not available" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_generation_matches_cpu(cli_path, tmp_path):
    model = load_generator(cli_path / "gen")
    cpu = csm.generate(model, 9, seed=5, steps=2, guidance=2.0, batch_size=64)
    gpu = csm.generate(model.to("cuda"), 9, seed=5, steps=2, guidance=2.0, batch_size=64)
    assert next(model.parameters()).is_cuda
    diff = (cpu["images"].int() - gpu["images"].int()).abs()
    assert diff.float().mean() < 0.5 and diff.max() <= 8  # same images up to float rounding
    assert main(["csm", "train-generator", "--data", "digits", "--steps", "2", "--out", str(tmp_path / "g"),
                 "--device", "cuda", *TINY]) == 0
