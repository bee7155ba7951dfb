"""Every script in examples/ runs in quick mode, as a user would run it (one test per example,
named after it), and prints numbers that make sense."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(script: str, *args: str, timeout: int = 300) -> str:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script), *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_losses_own_loop():
    out = _run("losses_own_loop.py", "--quick")
    rows = {m.group(1): tuple(map(float, m.groups()[1:]))
            for m in re.finditer(r"^(cross-entropy|MbLS|FeDLaS|AdaFocal)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", out, re.M)}
    assert set(rows) == {"cross-entropy", "MbLS", "FeDLaS", "AdaFocal"}
    for acc, ece, nll in rows.values():  # 10 classes: far above chance, finite calibration numbers
        assert 30 < acc <= 100 and 0 <= ece < 100 and 0 < nll < 10


def test_metrics_streaming():
    out = _run("metrics_streaming.py", "--quick")
    ece, corrected, lo, hi = map(float, re.search(
        r"ECE ([\d.]+), bias-corrected ([\d.]+), 95% interval \[([\d.]+), ([\d.]+)\]", out).groups())
    assert lo <= corrected <= hi  # the basic interval is centred on the bias-corrected estimate
    before = float(re.search(r"before scaling\s+acc\s+[\d.]+\s+ECE\s+([\d.]+)", out).group(1))
    assert before == pytest.approx(100 * ece, abs=0.01)  # streamed panel == one-shot bootstrap estimate
    assert re.search(r"after TS \(T = [\d.]+\)", out)
    assert re.search(r"pixels: N = 7168 valid pixels, ECE [\d.]+, mIoU [\d.]+, state \d+ KiB", out)


def test_hf_compute_metrics():
    pytest.importorskip("transformers")
    out = _run("hf_compute_metrics.py", "--quick")
    values = dict(re.findall(r"^(eval_\w+)\s+([\d.]+)$", out, re.M))
    assert set(values) == {"eval_acc", "eval_ece", "eval_aece", "eval_nll", "eval_brier"}
    assert 0.5 < float(values["eval_acc"]) <= 1 and 0 <= float(values["eval_ece"]) < 1
