"""What ``calibkit.train.loop._prepare_run_dir`` accepts as the same run: a bench directory moved
or copied with an interrupted CSM run, and a run directory holding only the record of a
scheduler's attempt that ended before training wrote anything (cancelled, requeued, failed).

Runs are a few steps on the digits set with the MLP; CSM's generated set is stood in (as in
``tests/train/test_loop.py``), so every test takes well under a second.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from calibkit import rundir
from calibkit.bench import paths
from calibkit.bench import resultfiles as R
from calibkit.bench.paths import placement
from calibkit.config import TrainConfig
from calibkit.train import loop
from calibkit.train.state import Placement

# A bench's placement of its runs (the directory it names matters only to configs with paths in it).
BENCH = placement("bench")


def tiny(**kw) -> TrainConfig:
    base = dict(data="digits", model="mlp", epochs=2, batch_size=32, lr=0.05, train_subset=128, val_size=60,
                num_threads=1, device="cpu", checkpoint_every=1)
    base.update(kw)
    return TrainConfig(**base)


@pytest.fixture
def companion(monkeypatch):
    """CSM's generated set stood in: random images with half-half soft labels; records the sets it is given."""
    import calibkit.methods.csm.dataset as csm_dataset

    seen = []

    class FakeCompanion:
        def __init__(self, store_dir, num_classes, seed=0):
            seen.append(store_dir)

        def draw(self, labels, generator=None, per_real=2):
            b = len(labels)
            images = torch.randint(0, 256, (2 * b, 1, 28, 28), dtype=torch.uint8, generator=generator)
            soft = torch.zeros(2 * b, 10)
            soft[torch.arange(2 * b), torch.cat([labels, labels])] += 0.5
            soft[torch.arange(2 * b), torch.cat([labels, (labels + 1) % 10])] += 0.5
            return images, soft

    monkeypatch.setattr(csm_dataset, "CSMCompanion", FakeCompanion)
    return seen


def _csm_bench(root):
    """A bench directory's CSM run directory and its annotated set (as the bench lays them out)."""
    gen = root / "cache" / "csm" / "tiny" / "seed0-s4"
    gen.mkdir(parents=True)
    return root / "runs" / "tiny" / "csm" / "seed0", gen


# ------------------------------------------------------------------------------ a moved bench directory


def test_a_csm_run_interrupted_after_an_epoch_resumes_after_its_bench_directory_moved(tmp_path, companion):
    run, gen = _csm_bench(tmp_path / "old")
    summary = loop.train(tiny(method="csm", csm_data=str(gen)), run, progress=False, verbose=False,
                         stop_after_epoch=1, place=placement(tmp_path / "old"))
    assert summary["epochs_done"] == 1
    # the record names the set relative to the bench directory ...
    assert rundir.load_info(run)["config"]["csm_data"] == "cache/csm/tiny/seed0-s4"
    shutil.move(tmp_path / "old", tmp_path / "new")
    run, gen = (tmp_path / "new" / "runs" / "tiny" / "csm" / "seed0",
                tmp_path / "new" / "cache" / "csm" / "tiny" / "seed0-s4")
    cfg = tiny(method="csm", csm_data=str(gen))
    # ... so the moved run is the same run, and resumes after its epoch instead of being refused
    state, found = loop._prepare_run_dir(run, cfg, place=placement(tmp_path / "new"))
    assert state == "resume" and found["epoch"] == 1
    done = loop.train(cfg, run, progress=False, verbose=False, place=placement(tmp_path / "new"))
    assert done["status"] == "done" and done["epochs_done"] == 2 and companion[-1] == str(gen)
    assert rundir.load_info(run)["config"]["csm_data"] == "cache/csm/tiny/seed0-s4"
    # without a bench directory (calibkit train) the record is the config as given
    loop.train(cfg, tmp_path / "alone", progress=False, verbose=False, stop_after_epoch=1)
    assert rundir.load_info(tmp_path / "alone")["config"]["csm_data"] == str(gen)


def test_a_copied_bench_directory_resumes_from_another_working_directory(tmp_path, companion, monkeypatch):
    run, gen = _csm_bench(tmp_path / "b")
    loop.train(tiny(method="csm", csm_data=str(gen)), run, progress=False, verbose=False, stop_after_epoch=1,
               place=placement(tmp_path / "b"))
    shutil.copytree(tmp_path / "b", tmp_path / "c")
    monkeypatch.chdir(tmp_path)  # the bench given as a relative --out: its paths are relative to here
    cfg = tiny(method="csm", csm_data="c/cache/csm/tiny/seed0-s4")
    state, _ = loop._prepare_run_dir(tmp_path / "c" / "runs" / "tiny" / "csm" / "seed0", cfg, place=placement("c"))
    assert state == "resume"


def _old_record(run, csm_data):
    """A CSM run as calibkit wrote it before: the set's absolute path, one epoch checkpointed."""
    run.mkdir(parents=True)
    rundir.write_json(run / rundir.CONFIG, {"config": tiny(method="csm", csm_data=str(csm_data)).to_dict(),
                                            "status": "running"})
    rundir.write_checkpoint(run / rundir.CHECKPOINT, {"epoch": 1})


def test_an_old_absolute_record_is_read_as_the_same_place(tmp_path):
    run, gen = _csm_bench(tmp_path / "b")
    _old_record(run, gen)
    cfg = tiny(method="csm", csm_data=str(gen))
    # inside the bench directory, where it was: the same as the relative form
    assert loop._prepare_run_dir(run, cfg, place=placement(tmp_path / "b"))[0] == "resume"
    # the directory moved since: its tail under the bench directory is the same set
    shutil.move(tmp_path / "b", tmp_path / "m")
    run, gen = tmp_path / "m" / run.relative_to(tmp_path / "b"), tmp_path / "m" / gen.relative_to(tmp_path / "b")
    moved = tiny(method="csm", csm_data=str(gen))
    assert loop._prepare_run_dir(run, moved, place=placement(tmp_path / "m"))[0] == "resume"


def test_a_set_outside_the_bench_directory_stays_absolute_and_another_set_is_refused(tmp_path):
    outside, other = tmp_path / "gen", tmp_path / "b" / "gen"  # a bench dir holding a set of the same name
    outside.mkdir()
    other.mkdir(parents=True)
    run = tmp_path / "b" / "runs" / "tiny" / "csm" / "seed0"
    _old_record(run, outside)
    assert paths.rooted(outside, tmp_path / "b") == str(outside)
    assert paths.rooted(str(outside), tmp_path / "b", recorded=True) == str(outside)  # not read as b/gen
    cfg = tiny(method="csm", csm_data=str(outside))
    assert loop._prepare_run_dir(run, cfg, place=placement(tmp_path / "b"))[0] == "resume"
    with pytest.raises(ValueError, match=r"differs in: csm_data"):
        loop._prepare_run_dir(run, tiny(method="csm", csm_data=str(other)), place=placement(tmp_path / "b"))


# ------------------------------------------------------------------------------ only a scheduler's record


def _record(run, status="failed", error="interrupted", name=R.RESULT):
    run.mkdir(parents=True, exist_ok=True)
    row = {"run_key": "tiny/ce/0", "status": status, "error": error, "attempts": 1}
    (run / name).write_text(json.dumps({"format": R.FORMAT, "version": R.VERSION, "table": "runs", "row": row}))


@pytest.mark.parametrize("name", [R.RESULT, R.CANDIDATE])
def test_a_directory_holding_only_an_interrupted_record_starts_the_run_and_says_so(tmp_path, capsys, name):
    run = tmp_path / "seed0"
    _record(run, name=name)
    (run / f".{name}.x1y2.tmp").write_text("{")  # an atomic write of the record cut short
    assert loop._prepare_run_dir(run, tiny(), place=BENCH) == ("fresh", None)
    err = capsys.readouterr().err
    assert err == f"{run}: holds only the record of an attempt that ended before training started; starting the run\n"
    assert (run / name).is_file()  # kept: the attempt replaces it with its own result
    assert loop._prepare_run_dir(run, tiny(), main=False, place=BENCH) == ("fresh", None)
    assert not capsys.readouterr().err


@pytest.mark.parametrize("case", ["done", "other file", "foreign json", "corrupt"])
def test_a_failed_record_alone_starts_the_run_and_anything_more_is_still_refused(tmp_path, case):
    run = tmp_path / "r"
    _record(run, error="Traceback ...\nFileNotFoundError: digits not found")  # failed before training
    assert loop._prepare_run_dir(run, tiny(), place=BENCH) == ("fresh", None)
    _record(run, status="done" if case == "done" else "failed")
    if case == "other file":
        (run / "notes.txt").write_text("mine")
    if case == "foreign json":
        (run / R.RESULT).write_text(json.dumps({"row": {"status": "failed"}}))
    if case == "corrupt":
        (run / R.RESULT).write_text("{")
    with pytest.raises(ValueError, match="is not empty and holds no calibkit run"):
        loop._prepare_run_dir(run, tiny(), place=BENCH)


def test_a_requeued_task_trains_in_the_directory_its_interrupted_attempt_left(tmp_path):
    run = tmp_path / "seed0"
    _record(run)
    summary = loop.train(tiny(epochs=1), run, progress=False, verbose=False, place=BENCH)
    assert summary["status"] == "done" and (run / rundir.LOGITS).is_file()


def test_without_the_bench_placement_a_directory_of_records_is_refused(tmp_path):
    # the training loop knows nothing of a bench's records: only the bench's placement lets a run start there
    run = tmp_path / "seed0"
    _record(run)
    with pytest.raises(ValueError, match="is not empty and holds no calibkit run"):
        loop._prepare_run_dir(run, tiny())
    assert placement(tmp_path).fresh(run) and not Placement().fresh(run)
