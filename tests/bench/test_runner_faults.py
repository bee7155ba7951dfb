"""Faults of a bench and how it recovers: a full disk stops it at the first run with one line, a
scheduler's task cancelled before training started is run again in its directory, and a task's
interruption says what it kept.

Training and evaluation are stood in (``tests/bench/test_runner_loop.py``'s way) except where the
run directory itself is the subject: there a one-epoch run on 128 digits trains for real.
"""

from __future__ import annotations

import dataclasses
import errno
from contextlib import closing

import pytest
import torch
from safetensors import SafetensorError

from calibkit import rundir
from calibkit.bench import evaluation
from calibkit.bench import resultfiles as R
from calibkit.bench.attempts import Counts
from calibkit.bench.grid import PRESETS, Preset
from calibkit.bench.producers import RunFactory
from calibkit.bench.results import task_kept
from calibkit.bench.runner import Bench
from calibkit.store import Store

TINY = Preset(name="tiny", dataset="digits", model="mlp", seeds=(0, 1), tune_seed=7, num_threads=1,
              train=dict(epochs=1, batch_size=64, lr=0.05, val_size=200, train_subset=128, augment=False))
METRICS = {"before": {"acc": 0.875, "ece": 0.1234}, "after": {"ece": 0.0456}}
NO_SPACE = "Error while serializing: I/O error: No space left on device (os error 28)"


@pytest.fixture
def stand_ins(monkeypatch):
    """Training writes fixed logits through calibkit's writer; evaluation returns METRICS."""
    calls = {"train": [], "report": []}

    def fake_train(self, method, seed, run_dir, csm_data=None):
        calls["train"].append((method, seed))
        run_dir.mkdir(parents=True, exist_ok=True)
        labels = torch.arange(12) % 3
        logits = torch.nn.functional.one_hot(labels, 3).float()
        rundir.write_tensors(run_dir / rundir.LOGITS, {"val_logits": logits, "val_labels": labels,
                                                      "test_logits": logits.clone(), "test_labels": labels.clone()})
        return {"run_dir": run_dir, "train_time_s": 1.0}

    monkeypatch.setattr(RunFactory, "train", fake_train)
    monkeypatch.setattr(Bench, "eval_data", lambda self, seed: None)
    monkeypatch.setattr(evaluation, "evaluate_run", lambda run_dir, data, **kw: {
        "metrics": METRICS, "ood": None, "robustness": None, "eval_time_s": 0.1,
        "logits_path": str(run_dir / rundir.LOGITS)})
    return calls


def _full_disk(monkeypatch, after: int = 0):
    """safetensors' writer fails as on a full disk from its ``after + 1``-th call on."""
    real, calls = rundir.save_file, []

    def save_file(tensors, path):
        calls.append(path)
        if len(calls) > after:
            raise SafetensorError(NO_SPACE)
        real(tensors, path)

    monkeypatch.setattr(rundir, "save_file", save_file)
    return calls


# ------------------------------------------------------------------------------ a full disk


def test_the_writer_names_the_file_meant_when_the_disk_is_full(tmp_path, monkeypatch):
    _full_disk(monkeypatch)
    with pytest.raises(OSError) as err:
        rundir.write_tensors(tmp_path / "x.safetensors", {"a": torch.zeros(2)})
    assert (err.value.errno, err.value.filename) == (errno.ENOSPC, str(tmp_path / "x.safetensors"))
    assert list(tmp_path.iterdir()) == []  # no temporary file left behind
    assert str(rundir.disk_full(err.value)) == (f"disk full while writing {tmp_path / 'x.safetensors'}: free space "
                                                "and run the same command again; finished runs are kept")


def test_a_write_failing_for_no_stated_reason_on_a_full_disk_is_a_full_disk(tmp_path, monkeypatch):
    def torch_like(tmp):  # torch.save on a full disk says only this
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    free = {"bytes": 0}
    monkeypatch.setattr(rundir.os, "statvfs", lambda p: type("st", (), {"f_bavail": free["bytes"], "f_frsize": 1})())
    with pytest.raises(OSError) as err:
        rundir.atomic_write(tmp_path / "checkpoint.pt", torch_like)
    assert err.value.errno == errno.ENOSPC and isinstance(err.value.__cause__, RuntimeError)
    free["bytes"] = 10 << 30  # with space left it is the writer's own error, unchanged
    with pytest.raises(RuntimeError, match="unexpected pos"):
        rundir.atomic_write(tmp_path / "checkpoint.pt", torch_like)
    assert rundir.disk_full(ValueError("labels out of range")) is None
    assert str(rundir.disk_full(RuntimeError("database or disk is full"))).startswith(
        "disk full while writing the results database: ")


def test_a_full_disk_stops_the_bench_at_the_first_run_and_keeps_the_finished_ones(tmp_path, stand_ins, monkeypatch):
    _full_disk(monkeypatch, after=1)  # CE of seed 0 is written, LS of seed 0 meets the full disk
    lines = []
    with closing(Bench(TINY, tmp_path, methods=["ls"], log=lines.append)) as b:
        with pytest.raises(rundir.DiskFull) as err:
            b.run()
    meant = tmp_path / "runs" / "tiny" / "ls" / "seed0" / rundir.LOGITS
    assert str(err.value) == (f"disk full while writing {meant}: free space and run the same command again; "
                              "finished runs are kept")
    assert stand_ins["train"] == [("ce", 0), ("ls", 0)]  # seed 1 is never tried
    with Store(tmp_path / "runs.db", readonly=True) as s:
        rows = {r["run_key"]: r for r in s.runs("tiny", status=None)}
    assert rows["tiny/ce/0"]["status"] == "done", rows["tiny/ce/0"]["error"]
    assert rows["tiny/ls/0"]["status"] == "failed" and rows["tiny/ls/0"]["error"] == str(err.value)
    # the documented step: space freed, the same command continues where it stopped
    monkeypatch.setattr(rundir, "save_file", __import__("safetensors.torch").torch.save_file)
    with closing(Bench(TINY, tmp_path, methods=["ls"], log=lines.append)) as b:
        assert b.run() == Counts(done=3, skipped=1, failed=0)


def test_the_command_says_one_line_and_builds_no_report(tmp_path, stand_ins, monkeypatch, capsys, one_thread):
    import calibkit.report
    from calibkit.cli import main

    monkeypatch.setitem(PRESETS, "tiny", TINY)
    monkeypatch.setattr(calibkit.report, "build_report", lambda *a, **k: stand_ins["report"].append(a))
    _full_disk(monkeypatch)
    out = tmp_path / "b"
    assert main(["bench", "--preset", "tiny", "--methods", "ls", "--out", str(out), "--device", "cpu"]) == 1
    captured = capsys.readouterr()
    meant = out / "runs" / "tiny" / "ce" / "seed0" / rundir.LOGITS
    assert captured.err.splitlines() == [f"calibkit bench: error: disk full while writing {meant}: free space and run "
                                         "the same command again; finished runs are kept"]
    assert "Traceback" not in captured.out and stand_ins["report"] == [] and len(stand_ins["train"]) == 1


def test_a_failed_run_is_named_on_stderr_with_its_reason_and_a_retry_runs_it(tmp_path, stand_ins, monkeypatch,
                                                                            capsys, one_thread):
    import calibkit.report
    from calibkit.cli import main

    monkeypatch.setitem(PRESETS, "tiny", TINY)
    monkeypatch.setattr(calibkit.report, "build_report", lambda *a,
                        **k: {"text": "", "paths": {"html": "h", "md": "m"}})
    fake = RunFactory.train

    def failing(self, method, seed, run_dir, csm_data=None):
        if method == "ls" and seed == 1:
            run_dir.mkdir(parents=True)  # what a training that fails mid-way leaves
            raise RuntimeError("loss is NaN\nat epoch 1")
        return fake(self, method, seed, run_dir, csm_data)

    monkeypatch.setattr(RunFactory, "train", failing)
    out = tmp_path / "b"
    argv = ["bench", "--preset", "tiny", "--methods", "ls", "--out", str(out), "--device", "cpu"]
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        "calibkit bench: error: run tiny/ls/1 (method ls, seed 1) failed: RuntimeError: loss is NaN at epoch 1; "
        f"recorded in {out / 'runs.db'}; run the same command again to retry it"]
    assert "tiny/ls/1: FAILED: RuntimeError: loss is NaN" in captured.out
    monkeypatch.setattr(RunFactory, "train", fake)  # the cause fixed: the same command runs the failed run only
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "1 run(s) done, 3 skipped (finished earlier), 0 failed" in captured.out
    with Store(out / "runs.db", readonly=True) as s:
        assert {r["run_key"]: r["status"] for r in s.runs("tiny", status=None)} == {
            f"tiny/{m}/{k}": "done" for m in ("ce", "ls") for k in (0, 1)}


# ------------------------------------------------------------------------------ a scheduler's task


def test_a_task_cancelled_before_training_runs_again_in_its_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(evaluation, "evaluate_run", lambda run_dir, data, **kw: {
        "metrics": METRICS, "ood": None, "robustness": None, "eval_time_s": 0.1,
        "logits_path": str(run_dir / rundir.LOGITS)})
    monkeypatch.setattr(Bench, "eval_data", lambda self, seed: None)
    real_produce = Bench.produce

    def cancelled(self, method, seed):  # scancel in the task's first seconds: SIGTERM before training
        raise KeyboardInterrupt

    monkeypatch.setattr(Bench, "produce", cancelled)
    with closing(Bench(TINY, tmp_path, seeds=[0], methods=["ce"], device="cpu", store=R.ResultFiles(tmp_path))) as b:
        with pytest.raises(KeyboardInterrupt):
            b.run_one(0, "ce")
    run = tmp_path / "runs" / "tiny" / "ce" / "seed0"
    assert [p.name for p in run.iterdir()] == [R.RESULT]  # the interrupted marker, nothing else
    assert task_kept(tmp_path, "tiny/ce/0") == (f"{run} holds only this attempt's record (result.json); "
                                                  "a requeued task, or the same submission command run again, "
                                                  "starts the run there")
    # the requeued task (or a resubmission): the same run, trained for real in that directory
    monkeypatch.setattr(Bench, "produce", real_produce)
    with closing(Bench(TINY, tmp_path, seeds=[0], methods=["ce"], device="cpu", store=R.ResultFiles(tmp_path))) as b:
        assert b.run_one(0, "ce") == Counts(done=1, skipped=0, failed=0)
    doc = R.read_doc(run / R.RESULT, "runs")
    assert doc["row"]["status"] == "done" and doc["row"]["attempts"] == 2 and (run / rundir.LOGITS).is_file()


def test_what_an_interrupted_task_kept_is_read_from_its_run_directory(tmp_path):
    run = tmp_path / "runs" / "p" / "ls" / "seed0"
    again = "a requeued task, or the same submission command run again,"
    assert task_kept(tmp_path, "p/ls/0") == f"nothing of p/ls/0 was written yet; {again} starts it"
    run.mkdir(parents=True)
    (run / rundir.CONFIG).write_text("{}")
    assert task_kept(tmp_path, "p/ls/0") == f"{run} holds the run, not yet checkpointed; {again} starts it again"
    (run / rundir.CHECKPOINT).write_bytes(b"")
    assert task_kept(tmp_path, "p/ls/0") == (f"{run} keeps the run up to its last checkpoint; {again} resumes it "
                                               "from there")
    cand = R.candidate_path(tmp_path, "p/ls/7/alpha=0.1")
    cand.parent.mkdir(parents=True)
    cand.write_text("{}")
    assert task_kept(tmp_path, "p/ls/7/alpha=0.1").startswith(f"{cand.parent} holds only this attempt's record "
                                                                "(candidate.json)")
    assert task_kept(tmp_path, "not a key") == f"{again} runs it again"


def test_the_tasks_interruption_line_says_what_it_kept(tmp_path, monkeypatch, capsys, one_thread):
    from calibkit.cli import Terminated, main

    monkeypatch.setitem(PRESETS, "tiny", dataclasses.replace(TINY, seeds=(0,)))

    def terminated(self, method, seed):
        raise Terminated()

    monkeypatch.setattr(Bench, "produce", terminated)
    out = tmp_path / "b"
    assert main(["bench", "--preset", "tiny", "--out", str(out), "--device", "cpu", "--run-key", "tiny/ce/0"]) == 143
    run = out / "runs" / "tiny" / "ce" / "seed0"
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"calibkit bench: error: terminated (SIGTERM); {run} holds only this attempt's record (result.json); a "
        "requeued task, or the same submission command run again, starts the run there")
