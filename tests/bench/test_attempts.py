"""``calibkit.bench.attempts``: the work queue and the recording of a run's outcome."""

import pytest

from calibkit.bench.attempts import broadcast, claim_outcome, run_recorded, work_queue
from calibkit.distributed import Dist
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


def test_claim_outcome_reads_the_status_in_the_table_it_names(tmp_path):
    from calibkit.store import open_store

    db = open_store(tmp_path / "bench", None)
    try:
        assert claim_outcome(db, "runs", "p/ls/0", True) == "claimed"
        assert db.claim_candidate("p/ls/0/a=1", preset="p", method="ls", seed=0, hparams={"a": 1})
        assert claim_outcome(db, "tuning", "p/ls/0/a=1", False) == "elsewhere"  # running
        db.finish_candidate("p/ls/0/a=1", metrics={})
        # done in the tuning table; the runs table has no such key
        assert claim_outcome(db, "tuning", "p/ls/0/a=1", False) == "done"
        assert claim_outcome(db, "runs", "p/ls/0/a=1", False) == "elsewhere"
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
    recorded, reported, counts = [], [], {"failed": 0}
    run_recorded(work, recorded.append, is_main, counts, reported.append)
    return recorded, reported, counts


def test_a_failure_is_recorded_counted_and_reported_not_raised():
    def broken():
        raise ValueError("bad shape (3, 4)")

    recorded, reported, counts = _record(broken)
    assert counts == {"failed": 1} and reported == ["FAILED: ValueError: bad shape (3, 4)"]
    assert len(recorded) == 1 and recorded[0].startswith("Traceback") and "bad shape (3, 4)" in recorded[0]
    lines = recorded[0].splitlines()  # the standard traceback text, its parts joined as they are
    assert lines[-1] == "ValueError: bad shape (3, 4)" and all(x.startswith(("Traceback", "  ")) for x in lines[:-1])
    # another rank of a DDP job counts and reports it, but only the main rank writes the record
    recorded, reported, counts = _record(broken, is_main=False)
    assert recorded == [] and counts == {"failed": 1} and len(reported) == 1
    counts = {"failed": 2}  # the count adds up over the runs of a bench
    run_recorded(broken, lambda text: None, True, counts, lambda line: None)
    assert counts == {"failed": 3}


def test_success_records_nothing():
    calls = []
    assert _record(lambda: calls.append(1)) == ([], [], {"failed": 0}) and calls == [1]


def test_ctrl_c_is_recorded_as_interrupted_and_preemption_unrecorded():
    recorded, counts = [], {"failed": 0}

    def interrupt():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_recorded(interrupt, recorded.append, True, counts, print)
    assert recorded == ["interrupted"] and counts == {"failed": 0}

    def preempted():
        raise Preempted(3)

    with pytest.raises(Preempted):
        run_recorded(preempted, recorded.append, True, counts, print)
    assert recorded == ["interrupted"] and counts == {"failed": 0}  # the run resumes later: no record
