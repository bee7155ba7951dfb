"""``calibkit.bench.attempts``: the work queue and the recording of a run's outcome."""

import dataclasses

import pytest

from calibkit.bench.attempts import (
    Counts,
    Outcome,
    Task,
    attempt,
    broadcast,
    claim_outcome,
    reaping_sleep,
    run_recorded,
    work_queue,
)
from calibkit.distributed import Dist
from calibkit.store import NullStore, Store
from calibkit.train.preempt import Preempted


def test_work_queue_postpones_items_until_ready():
    done, sleeps, ready_after = [], [], {"b": 2}  # "b" becomes ready on its third look

    def ready(item):
        left = ready_after.get(item, 0)
        ready_after[item] = left - 1
        return left <= 0

    work_queue(["a", "b", "c"], ready, done.append, sleep=sleeps.append)
    assert done == ["a", "c", "b"] and len(sleeps) == 1  # one pass found nothing ready: one pause


def test_work_queue_pauses_only_after_a_pass_without_progress():
    log, held = [], {"b": 3}  # another process holds "b" for its first three attempts

    def attempt(item):
        log.append(item)
        if held.get(item):
            held[item] -= 1
            return False
        return None

    work_queue(["a", "b"], lambda item: True, attempt, poll_s=2.5, sleep=lambda s: log.append(("sleep", s)))
    # pass 1 finished "a" (progress: no pause); passes 2 and 3 only postponed "b" (a pause each)
    assert log == ["a", "b", "b", ("sleep", 2.5), "b", ("sleep", 2.5), "b"]
    log.clear()
    work_queue(["x", "y"], lambda item: True, log.append, sleep=lambda s: log.append(("sleep", s)))
    assert log == ["x", "y"]  # nothing postponed: no pause


def test_reaping_sleep_returns_as_soon_as_a_worker_has_ended():
    answers = [[], [], ["worker-1 (pid 7) was killed by SIGKILL"], []]
    slept, logged = [], []
    pause = reaping_sleep(lambda: answers.pop(0), logged.append, sleep=slept.append, step_s=0.5)
    pause(5.0)
    # two steps of half a second, then the third look finds the dead worker: no more sleeping
    assert slept == [0.5, 0.5] and logged == ["worker-1 (pid 7) was killed by SIGKILL"]
    assert answers == [[]]


def test_reaping_sleep_sleeps_the_whole_pause_when_nothing_ends(monkeypatch):
    import time

    clock = [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    slept = []

    def sleep(s):
        slept.append(s)
        clock[0] += s

    looks = []
    reaping_sleep(lambda: looks.append(1) or [], print, sleep=sleep, step_s=0.5)(1.2)
    assert slept == [0.5, 0.5, pytest.approx(0.2)] and len(looks) == 4  # a look after the last step too


def test_claim_outcome_reads_the_status_in_the_table_it_names(tmp_path):
    from calibkit.store import open_store

    db = open_store(tmp_path / "bench", None)
    try:
        assert claim_outcome(db, "runs", "p/ls/0", True) == Outcome.CLAIMED
        assert db.claim("p/ls/0/a=1", table="tuning", preset="p", method="ls", seed=0, hparams={"a": 1})
        assert claim_outcome(db, "tuning", "p/ls/0/a=1", False) == Outcome.ELSEWHERE  # running
        db.finish("p/ls/0/a=1", table="tuning", metrics={})
        # done in the tuning table; the runs table has no such key
        assert claim_outcome(db, "tuning", "p/ls/0/a=1", False) == Outcome.DONE
        assert claim_outcome(db, "runs", "p/ls/0/a=1", False) == Outcome.ELSEWHERE
    finally:
        db.close()


def test_broadcast_passes_the_value_through_without_a_group_and_sends_rank_0s_with_one():
    import torch.distributed as dist

    assert broadcast({"k": 1}, Dist()) == {"k": 1}
    # a one-process gloo group: the broadcast itself runs (rank 0 sends to itself)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    try:
        assert broadcast(("x", 2), Dist(rank=0, world=2)) == ("x", 2)
    finally:
        dist.destroy_process_group()


def _record(work, is_main=True):
    recorded, reported, counts = [], [], Counts()
    run_recorded(work, recorded.append, is_main, counts, reported.append)
    return recorded, reported, counts


def test_a_failure_is_recorded_counted_and_reported_not_raised():
    def broken():
        raise ValueError("bad shape (3, 4)")

    recorded, reported, counts = _record(broken)
    assert counts == Counts(failed=1) and reported == ["FAILED: ValueError: bad shape (3, 4)"]
    assert len(recorded) == 1 and recorded[0].startswith("Traceback") and "bad shape (3, 4)" in recorded[0]
    lines = recorded[0].splitlines()  # the standard traceback text, its parts joined as they are
    assert lines[-1] == "ValueError: bad shape (3, 4)" and all(x.startswith(("Traceback", "  ")) for x in lines[:-1])
    # another rank of a DDP job counts and reports it, but only the main rank writes the record
    recorded, reported, counts = _record(broken, is_main=False)
    assert recorded == [] and counts == Counts(failed=1) and len(reported) == 1
    counts = Counts(done=4, failed=2)  # the count adds up over the runs of a bench
    run_recorded(broken, lambda text: None, True, counts, lambda line: None)
    assert counts == Counts(done=4, failed=3)


def test_success_records_nothing():
    calls = []
    assert _record(lambda: calls.append(1)) == ([], [], Counts()) and calls == [1]


def test_ctrl_c_is_recorded_as_interrupted_and_preemption_unrecorded():
    recorded, counts = [], Counts()

    def interrupt():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_recorded(interrupt, recorded.append, True, counts, print)
    assert recorded == ["interrupted"] and counts == Counts()

    def preempted():
        raise Preempted(3)

    with pytest.raises(Preempted):
        run_recorded(preempted, recorded.append, True, counts, print)
    assert recorded == ["interrupted"] and counts == Counts()  # the run resumes later: no record


# ------------------------------------------------------------------------------ Counts, Outcome, attempt


def test_counts_start_at_zero_and_add_up_by_name():
    c = Counts()
    assert (c.done, c.skipped, c.failed) == (0, 0, 0)
    c.done += 2
    c.failed += 1
    assert c == Counts(done=2, failed=1) and c != Counts(done=2) and dataclasses.asdict(c) == {
        "done": 2, "skipped": 0, "failed": 1}


def test_outcome_values_are_the_names_they_replace():
    assert [(o.name, o.value) for o in Outcome] == [("CLAIMED", "claimed"), ("DONE", "done"),
                                                    ("ELSEWHERE", "elsewhere")]


class _Said:
    """A Report that records what it is told."""

    def __init__(self):
        self.said = []

    def held(self, key, waits):
        self.said.append(("held", key, waits))

    def skipped(self, key):
        self.said.append(("skipped", key))

    def begin(self, key):
        self.said.append(("begin", key))

    def done(self, key, seconds, details):
        self.said.append(("done", key, details))

    def failed(self, key, line, seconds):
        self.said.append(("failed", key, line))


def _task(db, key, made, produced, fail_with=None):
    def produce():
        produced.append(key)
        if fail_with is not None:
            raise fail_with
        return made

    def record(m):
        db.finish(key, metrics=m["metrics"])
        return f" (score {m['metrics']['s']})"

    return Task(key, "runs", f"run {key}", lambda: db.claim(key, preset="p", method="ls", seed=0), produce,
                record, lambda text: db.fail(key, text))


def test_attempt_claims_produces_records_and_counts_each_outcome(tmp_path):
    with Store(tmp_path / "runs.db") as db, Store(tmp_path / "runs.db") as other:
        counts, report, produced, failures = Counts(), _Said(), [], []
        made = {"metrics": {"s": 3}}
        assert attempt(_task(db, "p/ls/0", made, produced), db, Dist(), counts, report, failures) is True
        assert db.get("p/ls/0")["metrics"] == {"s": 3} and counts == Counts(done=1)
        assert report.said == [("begin", "p/ls/0"), ("done", "p/ls/0", " (score 3)")]
        # finished earlier: skipped, not produced again
        assert attempt(_task(db, "p/ls/0", made, produced), db, Dist(), counts, report) is True
        assert produced == ["p/ls/0"] and counts == Counts(done=1, skipped=1) and report.said[-1] == (
            "skipped", "p/ls/0")
        # held by another live process: retried later when waiting, else counted as skipped
        assert other.claim("p/ls/1", preset="p", method="ls", seed=1)
        assert attempt(_task(db, "p/ls/1", made, produced), db, Dist(), counts, report) is False
        assert counts == Counts(done=1, skipped=1) and report.said[-1] == ("held", "p/ls/1", True)
        assert attempt(_task(db, "p/ls/1", made, produced), db, Dist(), counts, report, waits=False) is True
        assert counts == Counts(done=1, skipped=2) and report.said[-1] == ("held", "p/ls/1", False)
        assert produced == ["p/ls/0"]
        # a failure is recorded, counted, reported and listed; the attempt is settled
        task = _task(db, "p/ls/2", made, produced, fail_with=RuntimeError("diverged"))
        assert attempt(task, db, Dist(), counts, report, failures) is True
        assert counts == Counts(done=1, skipped=2, failed=1) and db.status("p/ls/2") == "failed"
        assert report.said[-2:] == [("begin", "p/ls/2"), ("failed", "p/ls/2", "FAILED: RuntimeError: diverged")]
        assert failures == ["run p/ls/2 failed: RuntimeError: diverged"]


def test_attempt_on_another_rank_follows_rank_0s_outcome(monkeypatch):
    import calibkit.bench.attempts as A

    sent = iter([Outcome.CLAIMED])
    monkeypatch.setattr(A, "broadcast", lambda value, dd: next(sent))
    counts, report, produced = Counts(), _Said(), []
    task = Task("p/ls/0", "runs", "run p/ls/0", lambda: NullStore().claim("p/ls/0", preset="p", method="ls", seed=0),
                lambda: produced.append(1) or {}, lambda made: None, lambda text: pytest.fail("rank 1 recorded"))
    assert attempt(task, NullStore(), Dist(rank=1, world=2), counts, report) is True
    assert produced == [1] and counts == Counts(done=1) and report.said[-1] == ("done", "p/ls/0", None)
