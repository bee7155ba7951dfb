"""``bench --status`` and ``bench --collect`` say what is true: a folder that is not a bench is
refused, a local bench's runs are read from its database, a result the database holds is not
called failed because its file was moved away, a copied folder names its own logs."""

import os
import shutil
import socket

import pytest

from calibkit.bench.collect import collect
from calibkit.cli import main
from calibkit.store import Store
from tests.bench import test_collect
from tests.bench.test_collect import _done, _submitted

queue = test_collect.queue  # the fixture, shared with test_collect

BENCH = ["bench", "--preset", "smoke", "--seeds", "0"]


def _lines(text):
    return [line.split(None, 2) for line in text.splitlines()]


@pytest.mark.parametrize("action", ["--status", "--collect"])
def test_a_folder_that_is_not_a_bench_is_refused_and_left_alone(tmp_path, capsys, action):
    missing = tmp_path / "nope"
    assert main([*BENCH, "--out", str(missing), action]) == 1
    assert capsys.readouterr().err == (f"calibkit bench: error: --out {missing}: no such folder; give the --out "
                                       "folder of a bench (nothing was read or written)\n")
    assert not missing.exists()
    other = tmp_path / "photos"
    other.mkdir()
    (other / "a.jpg").write_bytes(b"x")
    assert main([*BENCH, "--out", str(other), action]) == 1
    assert capsys.readouterr().err == (f"calibkit bench: error: --out {other} is not the folder of a bench: it "
                                       "holds none of runs.db, runs, tune, slurm (nothing was read or written)\n")
    assert sorted(os.listdir(other)) == ["a.jpg"]
    assert main([*BENCH, "--out", str(other / "a.jpg"), action]) == 1
    assert capsys.readouterr().err == (f"calibkit bench: error: --out {other / 'a.jpg'} is a file, not the folder "
                                       "of a bench (nothing was read or written)\n")


def test_tune_refuses_status_with_collect_and_a_folder_that_is_not_a_bench(tmp_path, capsys):
    tune = ["tune", "--preset", "smoke", "--methods", "ls"]
    missing = tmp_path / "nope"
    assert main([*tune, "--out", str(missing), "--collect"]) == 1
    assert capsys.readouterr().err == (f"calibkit tune: error: --out {missing}: no such folder; give the --out "
                                       "folder of a bench (nothing was read or written)\n")
    assert not missing.exists()
    _done(tmp_path, "smoke/ce/0")
    assert main([*tune, "--out", str(tmp_path), "--status", "--collect"]) == 1
    assert capsys.readouterr().err.startswith("calibkit tune: error: --status and --collect: give one of them")
    assert not (tmp_path / "runs.db").exists()


def test_collect_with_no_result_file_does_not_claim_an_import(tmp_path, capsys, queue):
    out = tmp_path / "b"
    _submitted(out, "40", ["smoke/ce/0"])
    queue["tasks"] = {"40_0": "PENDING"}
    assert main([*BENCH, "--methods", "ce", "--out", str(out), "--collect"]) == 0
    assert capsys.readouterr().out == f"collect {out}: no result files to import; {out}/runs.db not created\n"
    assert not (out / "runs.db").exists()


def test_status_and_collect_together_are_refused(tmp_path, capsys):
    _done(tmp_path, "smoke/ce/0")
    assert main([*BENCH, "--out", str(tmp_path), "--status", "--collect"]) == 1
    assert capsys.readouterr().err == ("calibkit bench: error: --status and --collect: give one of them (--status "
                                       "shows each run's state and changes nothing; --collect imports the result "
                                       "files into runs.db, then reports)\n")
    assert not (tmp_path / "runs.db").exists()


def test_status_of_a_local_bench_reads_its_runs_db(tmp_path, capsys):
    out, host = tmp_path / "b", socket.gethostname()
    with Store(out / "runs.db") as db:
        db.claim("smoke/ce/0", preset="smoke", method="ce", seed=0)
        db.finish("smoke/ce/0", run_dir=str(out / "runs" / "smoke" / "ce" / "seed0"))
        db.claim("smoke/ls/0", preset="smoke", method="ls", seed=0)
        db.fail("smoke/ls/0", "Traceback ...\nValueError: bad")
        for method, pid in (("focal", os.getpid()), ("mbls", 2 ** 30)):  # a live process, one that is gone
            db.import_row("runs", {"run_key": f"smoke/{method}/0", "preset": "smoke", "method": method, "seed": 0,
                                   "status": "running", "owner": f"{host}:{pid}:t"})
    assert main([*BENCH, "--methods", "ls", "focal", "mbls", "--out", str(out), "--status"]) == 0
    db = out / "runs.db"
    assert _lines(capsys.readouterr().out) == [
        ["smoke/ce/0", "done", f"{out / 'runs' / 'smoke' / 'ce' / 'seed0'} (recorded in {db})"],
        ["smoke/ls/0", "failed", f"{db}: ValueError: bad"],
        ["smoke/focal/0", "running", f"claimed in {db} by {host}:{os.getpid()}:t"],
        ["smoke/mbls/0", "failed", f"{db}: its process ended before finishing it; run the same command again "
                                   "to resume it"],
        ["bench", "smoke:", "1 done, 2 failed, 1 running"]]


def test_a_result_moved_away_is_still_done_by_the_database(tmp_path, capsys, queue):
    path = _done(tmp_path, "smoke/ce/0")
    _submitted(tmp_path, "40", ["smoke/ce/0"])
    collect(tmp_path)
    shutil.move(path, tmp_path / "result.json.bad")  # e.g. a damaged file set aside
    assert main([*BENCH, "--methods", "ce", "--out", str(tmp_path), "--status"]) == 0
    assert _lines(capsys.readouterr().out) == [
        ["smoke/ce/0", "done", f"recorded in {tmp_path / 'runs.db'}"], ["bench", "smoke:", "1 done"]]
    assert main([*BENCH, "--methods", "ce", "--out", str(tmp_path), "--collect", "--no-report"]) == 0
    assert capsys.readouterr().err == ""  # nothing named missing


def test_status_of_a_copied_slurm_bench_names_the_copys_logs(tmp_path, capsys, queue):
    orig, copy = tmp_path / "cluster", tmp_path / "laptop"
    _submitted(orig, "40", ["smoke/ce/0"])
    shutil.copytree(orig, copy)
    shutil.rmtree(orig)
    assert main([*BENCH, "--methods", "ce", "--out", str(copy), "--status"]) == 0
    assert capsys.readouterr().out.splitlines()[0].split(None, 2) == [
        "smoke/ce/0", "failed", f"task 40_0 ended without a result; see {copy / 'slurm' / 'logs'}"]


@pytest.mark.postgres
def test_status_of_a_bench_on_a_server_reads_the_server(pg_url, tmp_path, capsys):
    from calibkit.store import PostgresStore, redact

    with PostgresStore(pg_url, root=tmp_path) as db:
        db.claim("smoke/ce/0", preset="smoke", method="ce", seed=0)
        db.finish("smoke/ce/0", run_dir=str(tmp_path / "runs" / "smoke" / "ce" / "seed0"))
    assert main([*BENCH, "--methods", "ce", "--out", str(tmp_path), "--store", pg_url, "--status"]) == 0
    assert _lines(capsys.readouterr().out) == [
        ["smoke/ce/0", "done", f"{tmp_path / 'runs' / 'smoke' / 'ce' / 'seed0'} (recorded in {redact(pg_url)})"],
        ["bench", "smoke:", "1 done"]]
