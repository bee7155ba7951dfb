"""The result-file store answers the operations the database answers beyond a task's own writes:
``get`` reads a run's file, tuning records are not kept (declared by ``keeps_records``), and moving
a run aside is refused with a reason."""

import pytest

from calibkit.bench.resultfiles import ResultFiles, result_path
from calibkit.store import StoreError


def test_get_reads_the_run_file_back_with_absolute_paths(tmp_path):
    files = ResultFiles(tmp_path)
    assert files.get("p/ce/0") is None
    assert files.claim("p/ce/0", preset="p", method="ce", seed=0, config={"epochs": 1})
    run = tmp_path / "runs" / "p" / "ce" / "seed0"
    files.finish("p/ce/0", metrics={"before": {"ece": 0.25}}, run_dir=str(run), logits_path=str(run / "l.st"))
    assert result_path(tmp_path, "p/ce/0").is_file()
    row = ResultFiles(tmp_path).get("p/ce/0")  # another process reads the file
    assert (row["status"], row["metrics"], row["config"], row["seed"]) == ("done", {"before": {"ece": 0.25}},
                                                                           {"epochs": 1}, 0)
    assert row["run_dir"] == str(run.resolve()) and row["logits_path"] == str((run / "l.st").resolve())
    assert row == files.runs("p")[0]


def test_result_files_keep_no_tuning_records(tmp_path):
    files = ResultFiles(tmp_path)
    assert files.keeps_records is False
    files.put_meta("tune/p/7/ls", '{"added": {}}')
    assert files.get_meta("tune/p/7/ls") is None and list(tmp_path.iterdir()) == []


def test_retire_is_refused_naming_the_run_and_the_way_out(tmp_path):
    with pytest.raises(StoreError) as err:
        ResultFiles(tmp_path).retire("p/ls/0", "p/ls/0~a=1", None, None)
    assert str(err.value) == (f"result files under {tmp_path} cannot move run p/ls/0 aside; collect them into "
                              "runs.db (calibkit bench --collect) and run the bench there")
