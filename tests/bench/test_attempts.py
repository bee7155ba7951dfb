"""``calibkit.bench.attempts``: the work queue and the recording of a run's outcome."""

import pytest

from calibkit.bench.attempts import run_recorded, work_queue
from calibkit.train.preempt import Preempted


def test_work_queue_postpones_items_until_ready():
    done, sleeps, ready_after = [], [], {"b": 2}  # "b" becomes ready on its third look

    def ready(item):
        left = ready_after.get(item, 0)
        ready_after[item] = left - 1
        return left <= 0

    work_queue(["a", "b", "c"], ready, done.append, sleep=sleeps.append)
    assert done == ["a", "c", "b"] and len(sleeps) == 1  # one pass found nothing ready: one pause


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
    # another rank of a DDP job counts and reports it, but only the main rank writes the record
    recorded, reported, counts = _record(broken, is_main=False)
    assert recorded == [] and counts == {"failed": 1} and len(reported) == 1


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
