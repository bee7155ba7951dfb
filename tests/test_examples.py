"""The example programs under examples/ run in their quick mode and do what they say."""

import importlib.util
import os
import re
import subprocess

import pytest
import torch

from tests.conftest import PYTHON, ROOT


def _run_example(name: str, env) -> str:
    res = subprocess.run([PYTHON, os.path.join(ROOT, "examples", name), "--quick"], capture_output=True, text=True,
                         env=env, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def test_maccal_own_model(cli_env):
    out = _run_example("maccal_own_model.py", cli_env)
    rows = {m.group(1): [float(v) for v in m.group(2).split()]
            for m in re.finditer(r"^(stage 1|MaC-Cal)\s+([-\d.\s]+)$", out, re.M)}
    assert set(rows) == {"stage 1", "MaC-Cal"}, out
    (acc1, ece1, _, _, conf1), (acc2, ece2, _, _, conf2) = rows["stage 1"], rows["MaC-Cal"]
    for acc, ece, o, u, conf in rows.values():
        assert 0 < acc <= 100 and 0 <= ece <= 100 and 0 <= conf <= 100
        assert abs(o + u - ece) < 0.02  # O-ECE + U-ECE = ECE (equal-width bins), up to the printed rounding
    r = float(re.search(r"keep rate ([\d.]+)", out).group(1))
    assert 0.1 <= r <= 1.0
    if os.path.isdir("/usr/share/datasets/fashion-mnist"):
        # The over-fitted MLP is over-confident; MaC-Cal brings its confidence down towards accuracy.
        assert conf1 - acc1 > 5 and ece2 < ece1 / 2 and acc2 > acc1 - 1 and conf2 < conf1


def test_losses_own_loop(cli_env):
    out = _run_example("losses_own_loop.py", cli_env)
    rows = {m.group(1): tuple(map(float, m.groups()[1:]))
            for m in re.finditer(r"^(cross-entropy|MbLS|FeDLaS|AdaFocal)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", out, re.M)}
    assert set(rows) == {"cross-entropy", "MbLS", "FeDLaS", "AdaFocal"}, out
    for acc, ece, nll in rows.values():  # 10 classes: far above chance, finite calibration numbers
        assert 30 < acc <= 100 and 0 <= ece < 100 and 0 < nll < 10


def test_metrics_streaming(cli_env):
    out = _run_example("metrics_streaming.py", cli_env)
    ece, corrected, lo, hi = map(float, re.search(
        r"ECE ([\d.]+), bias-corrected ([\d.]+), 95% interval \[([\d.]+), ([\d.]+)\]", out).groups())
    assert lo <= corrected <= hi  # the basic interval is centred on the bias-corrected estimate
    before = float(re.search(r"before scaling\s+acc\s+[\d.]+\s+ECE\s+([\d.]+)", out).group(1))
    assert abs(before - 100 * ece) < 0.01  # streamed panel == one-shot bootstrap estimate
    assert re.search(r"after TS \(T = [\d.]+\)", out)
    assert re.search(r"pixels: N = 7168 valid pixels, ECE [\d.]+, mIoU [\d.]+, state \d+ KiB", out)


def test_hf_compute_metrics(cli_env):
    import pytest

    pytest.importorskip("transformers")
    out = _run_example("hf_compute_metrics.py", cli_env)
    values = dict(re.findall(r"^(eval_\w+)\s+([\d.]+)$", out, re.M))
    assert set(values) == {"eval_acc", "eval_ece", "eval_aece", "eval_nll", "eval_brier"}, out
    assert 0 <= float(values["eval_ece"]) < 1 and 0 <= float(values["eval_acc"]) <= 1
    if importlib.util.find_spec("accelerate"):  # the Trainer trained the model: far above chance (5 classes)
        assert float(values["eval_acc"]) > 0.5, out


def _load_example(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "examples", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.usefixtures("one_thread")
def test_csm_own_data_example_quick():
    pytest.importorskip("diffusers")
    pytest.importorskip("sklearn")
    res = _load_example("csm_own_data").main(["--quick"])
    mixes = res["mixes"]
    n = 45 * 8  # every class pair once, 8 images per group
    assert mixes["images"].shape == (n, 1, 8, 8) and mixes["images"].dtype == torch.uint8
    soft = mixes["soft_labels"]
    rows = torch.arange(n)
    # Each soft label is a two-class distribution on the image's own pair (c1, c2).
    assert torch.allclose(soft.sum(1), torch.ones(n), atol=1e-6)
    assert torch.allclose(soft[rows, mixes["c1"]] + soft[rows, mixes["c2"]], torch.ones(n), atol=1e-6)
    for name in ("cross-entropy", "CSM"):
        m = res[name]
        assert 0.5 < m["acc"] <= 1 and 0 <= m["ece"] <= 1  # 10 classes: trained, far above chance


def test_bench_own_data(cli_env, tmp_path):
    res = subprocess.run([PYTHON, os.path.join(ROOT, "examples", "bench_own_data.py"), "--quick", "--out",
                          str(tmp_path / "out")], capture_output=True, text=True, env=cli_env, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    chosen = dict(re.findall(r"^selected: (\w+) (.+)$", out, re.M))
    assert set(chosen) == {"ls", "mbls", "maccal"}  # MaC-Cal keeps its own grid and is tuned too
    assert dict(v.split("=") for v in chosen["maccal"].split(", ")).keys() == {"maccal.eta", "maccal.r_min"}
    from calibkit.store import Store

    store = Store(tmp_path / "out" / "runs.db", readonly=True)
    tried = {m: sorted(c["hparams"][a] for c in store.candidates("digits-features", m)) for m, a in
             (("ls", "loss.alpha"), ("mbls", "loss.margin"))}
    store.close()
    # the example's own grids were tuned (the tuner may extend a grid past an edge it selected)
    assert {0.01, 0.05, 0.2} <= set(tried["ls"]) and {2.0, 6.0, 10.0} <= set(tried["mbls"])
    assert float(chosen["ls"].split("=")[1]) in tried["ls"] and float(chosen["mbls"].split("=")[1]) in tried["mbls"]
    assert "bench: 4 run(s) done, 0 failed" in out
    ranking = out.split("Ranking by test ECE", 1)[1].split("\n\n", 1)[0]  # the first table of the report
    ranked = re.findall(r"^\s*\d+\s+(CE|LS|MbLS|MaC-Cal)\s", ranking, re.M)
    assert sorted(ranked) == ["CE", "LS", "MaC-Cal", "MbLS"]
    from calibkit.bench.presetfile import read_effective

    eff = read_effective(tmp_path / "out", "digits-features")  # the tuned preset is recorded
    assert eff.loss_for("ls") == "ls:" + chosen["ls"].replace("loss.", "") and eff.ood == "noise"
