"""Every bad input of the command line: one line `calibkit CMD: error: ...`, exit code 1, no file
created or changed."""

import hashlib
import os
import shutil
import subprocess

import pytest

from calibkit import rundir
from calibkit.cli import main
from tests.conftest import PYTHON


def snapshot(root):
    """Every path under ``root`` with its size and content hash (folders too)."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for d in dirs:
            out[os.path.relpath(os.path.join(folder, d), root)] = "dir"
        for f in files:
            path = os.path.join(folder, f)
            with open(path, "rb") as fh:
                out[os.path.relpath(path, root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A tiny finished run (digits, MLP, 2 epochs) to copy and damage."""
    from calibkit.train import TrainConfig, train

    run = tmp_path_factory.mktemp("base") / "run"
    cfg = TrainConfig(data="digits", model="mlp", epochs=2, batch_size=64, train_subset=128, device="cpu",
                      num_threads=1)
    train(cfg, run, progress=False, verbose=False)
    return run


TRAIN_ARGS = ["--data", "digits", "--model", "mlp", "--epochs", "2", "--batch-size", "64", "--train-subset",
              "128", "--device", "cpu", "--num-threads", "1", "--quiet"]


def _setup(tmp, case, finished_run):
    """Make the files a case needs; returns the argv (with {tmp} filled in)."""
    if case == "bench_out_is_file":
        (tmp / "afile").write_text("precious")
        return ["bench", "--preset", "smoke", "--out", "{tmp}/afile"]
    if case == "bench_cifar10_without_data":
        return ["bench", "--preset", "cifar10", "--out", "{tmp}/c10"]
    if case == "bench_cifar10_empty_data_dir":
        (tmp / "data").mkdir()
        return ["bench", "--preset", "cifar10", "--data-dir", "{tmp}/data", "--out", "{tmp}/c10"]
    if case == "bench_repeated_seed":
        return ["bench", "--preset", "smoke", "--seeds", "1", "1", "--out", "{tmp}/b"]
    if case == "bench_unknown_method":
        return ["bench", "--preset", "smoke", "--methods", "nosuch", "--out", "{tmp}/b"]
    if case == "bench_csm_store_missing":
        return ["bench", "--preset", "smoke", "--methods", "csm", "--csm-store", "{tmp}/nowhere", "--out", "{tmp}/b"]
    if case == "bench_csm_store_missing_ce_only":  # read by csm only, but a missing folder is likely a typo
        return ["bench", "--preset", "smoke", "--methods", "ce", "--csm-store", "{tmp}/nostore", "--out", "{tmp}/b"]
    if case == "bench_csm_store_not_a_store":
        (tmp / "notastore").mkdir()
        (tmp / "notastore" / "x.txt").write_text("x")
        return ["bench", "--preset", "smoke", "--methods", "csm", "--csm-store", "{tmp}/notastore", "--out",
                "{tmp}/b"]
    if case == "bench_corrupt_database":
        (tmp / "b").mkdir()
        (tmp / "b" / "runs.db").write_bytes(b"not sqlite" * 50)
        return ["bench", "--preset", "smoke", "--methods", "ce", "--out", "{tmp}/b"]
    if case in DATA_CASES:
        return ["bench", "--preset", "smoke", "--methods", "ce", "--batch-size", "4", "--out", "{tmp}/b",
                *_bad_data(tmp, case)]
    if case == "report_corrupt_database":
        (tmp / "b").mkdir()
        (tmp / "b" / "runs.db").write_bytes(b"not sqlite" * 50)
        return ["report", "{tmp}/b"]
    if case == "report_not_a_bench":
        return ["report", "{tmp}"]
    if case == "train_corrupt_checkpoint":
        shutil.copytree(finished_run, tmp / "run")
        info = rundir.read_json(tmp / "run" / rundir.CONFIG)
        info["status"] = "running"  # an interrupted run: resuming reads the checkpoint
        rundir.write_json(tmp / "run" / rundir.CONFIG, info)
        (tmp / "run" / rundir.LOGITS).unlink()
        data = (tmp / "run" / rundir.CHECKPOINT).read_bytes()
        (tmp / "run" / rundir.CHECKPOINT).write_bytes(data[: len(data) // 3])  # truncated
        return ["train", *TRAIN_ARGS, "--out", "{tmp}/run"]
    if case == "train_out_is_file":
        (tmp / "afile").write_text("precious")
        return ["train", *TRAIN_ARGS, "--out", "{tmp}/afile"]
    if case == "train_unknown_preset":
        return ["train", "--config", "nosuch", "--out", "{tmp}/run"]
    if case == "eval_finished_run_without_logits":
        shutil.copytree(finished_run, tmp / "run")
        (tmp / "run" / rundir.LOGITS).unlink()
        return ["eval", "{tmp}/run"]
    if case == "eval_not_a_run":
        return ["eval", "{tmp}"]
    raise AssertionError(case)


def _tensors(path, y_train, n_test=6, x_train=None):
    import numpy as np

    x = np.zeros((len(y_train), 1, 8, 8), np.uint8) if x_train is None else x_train
    np.savez(path, x_train=x, y_train=np.asarray(y_train, np.int64), x_test=np.zeros((n_test, 1, 8, 8), np.uint8),
             y_test=np.arange(n_test) % 2)


def _bad_data(tmp, case) -> list[str]:
    """Data that load but cannot make a bench (the bench's preflight must refuse them): the flags."""
    import numpy as np

    if case == "bench_one_class":
        _tensors(tmp / "one.npz", [0] * 8, n_test=1)  # every label 0: one class
        return ["--data", "tensors", "--data-dir", "{tmp}/one.npz"]
    if case == "bench_no_training_rows":
        _tensors(tmp / "none.npz", [], x_train=np.zeros((0, 1, 8, 8), np.uint8))
        return ["--data", "tensors", "--data-dir", "{tmp}/none.npz"]
    if case == "bench_empty_ood_file":
        _tensors(tmp / "ok.npz", [0, 1] * 10)
        np.savez(tmp / "ood.npz", x=np.zeros((0, 1, 8, 8), np.uint8))
        return ["--data", "tensors", "--data-dir", "{tmp}/ok.npz", "--ood", "{tmp}/ood.npz"]
    if case == "bench_empty_class_folder":
        from PIL import Image

        for split, classes in (("train", "ab"), ("test", "ab")):
            for c in classes:
                (tmp / "img" / split / c).mkdir(parents=True)
                for i in range(4):
                    Image.fromarray(np.full((8, 8), 40 * i, np.uint8)).save(tmp / "img" / split / c / f"{i}.png")
        (tmp / "img" / "train" / "zz").mkdir()  # counted as a third class, with no image
        return ["--data", "imagefolder", "--data-dir", "{tmp}/img"]
    if case == "bench_val_size_rounds_to_zero":  # a fraction of 20 rows that rounds to no validation row
        _tensors(tmp / "ok.npz", [0, 1] * 10)
        return ["--data", "tensors", "--data-dir", "{tmp}/ok.npz", "--val-size", "0.0001"]
    if case == "bench_lr_beyond_float32":  # the flag stops at 100 (argparse); a preset file reaches the runs
        from calibkit.bench.presetfile import dump_preset, load_preset

        text = dump_preset(load_preset("smoke")).replace("lr = 0.05", "lr = 1e308")
        assert "lr = 1e308" in text
        (tmp / "big.toml").write_text(text)
        return ["--preset", "{tmp}/big.toml"]
    raise AssertionError(case)


DATA_CASES = {  # data or values that pass every option's own rule and used to fail the runs, after writing
    "bench_one_class": ["one.npz", "1 class ('0')", "at least 2 classes"],
    "bench_no_training_rows": ["none.npz", "x_train holds 0 rows"],
    "bench_empty_ood_file": ["ood.npz", "x holds 0 rows", "--ood none"],
    "bench_empty_class_folder": ["img/train", "zz", "hold no images"],
    "bench_val_size_rounds_to_zero": ["val_size 0.0001", "holds 0 of its", "--val-size"],
    "bench_lr_beyond_float32": ["method ce: lr: must be at most 3.403e+38", "float32", "got 1e+308"],
}
CASES = {  # case -> words the one-line message must contain
    "bench_out_is_file": ["afile", "existing file"],
    "bench_cifar10_without_data": ["cifar10", "--data-dir"],
    "bench_cifar10_empty_data_dir": ["test_batch", "cifar-10-batches-py"],
    "bench_repeated_seed": ["--seeds", "repeated"],
    "bench_unknown_method": ["nosuch", "valid methods"],
    "bench_csm_store_missing": ["nowhere", "calibkit csm generate", "--csm-store"],
    "bench_csm_store_missing_ce_only": ["nostore: no such folder", "--csm-store"],
    "bench_csm_store_not_a_store": ["notastore", "not a CSM store"],
    "bench_corrupt_database": ["runs.db", "not an SQLite database"],
    "report_corrupt_database": ["runs.db", "not an SQLite database"],
    "report_not_a_bench": ["runs.db not found"],
    "train_corrupt_checkpoint": ["checkpoint.pt", "corrupt", "new --out"],
    "train_out_is_file": ["afile", "not a directory"],
    "train_unknown_preset": ["nosuch", "fmnist"],
    "eval_finished_run_without_logits": ["logits.safetensors", "finished", "calibkit train"],
    "eval_not_a_run": ["not a calibkit run"],
    **DATA_CASES,
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_gives_one_line_and_touches_nothing(case, tmp_path, capsys, finished_run):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in _setup(tmp_path, case, finished_run)]
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert main(argv) == 1
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"calibkit {argv[0]}: error: ")
    for word in CASES[case]:
        assert word in lines[0], (word, lines[0])
    assert "Traceback" not in err + out
    assert snapshot(tmp_path) == before


def test_report_database_message_does_not_mention_out(tmp_path, capsys, finished_run):
    """`calibkit report` has no --out option; its message must not suggest one."""
    argv = [a.replace("{tmp}", str(tmp_path)) for a in _setup(tmp_path, "report_corrupt_database", finished_run)]
    assert main(argv) == 1
    assert "--out" not in capsys.readouterr().err


@pytest.mark.parametrize("what", ["bench", "train"])
def test_missing_extra_is_named_before_anything_is_written(what, tmp_path, capsys, monkeypatch):
    """SVHN needs scipy (the `data` extra): without it both commands stop at once, writing nothing."""
    import calibkit.extras as extras

    real = extras.available
    monkeypatch.setattr(extras, "available", lambda m: False if m == "scipy" else real(m))
    argv = (["bench", "--preset", "cifar10", "--data-dir", str(tmp_path), "--out", str(tmp_path / "b")]
            if what == "bench" else ["train", "--data", "svhn", "--data-dir", str(tmp_path), "--out",
                                     str(tmp_path / "run")])
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "scipy" in err and "pip install 'calibkit[data]'" in err
    assert os.listdir(tmp_path) == []


def test_eval_into_a_closed_pipe_exits_quietly(tmp_path, cli_env, finished_run):
    """`calibkit eval RUN | head` : the reader goes away; no traceback, the result file is still written."""
    shutil.copytree(finished_run, tmp_path / "run")
    proc = subprocess.Popen([PYTHON, "-m", "calibkit", "eval", str(tmp_path / "run")], env=cli_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader closes before anything was printed
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert err == ""
    assert (tmp_path / "run" / rundir.METRICS).is_file()
