"""The store of a non-main rank: every read finds nothing, every claim is refused, nothing is kept."""

from calibkit.bench.attempts import Outcome, claim_outcome
from calibkit.store import NullStore


def test_the_null_store_holds_nothing_and_keeps_nothing():
    s = NullStore()
    assert s.claim("p/ce/0", preset="p", method="ce", seed=0, config={"a": 1}) is False
    assert s.claim("p/ls/0/a=1", table="tuning", preset="p", method="ls", seed=0, hparams={"a": 1}) is False
    for write in (lambda: s.finish("p/ce/0", metrics={}), lambda: s.fail("p/ce/0", "boom"),
                  lambda: s.finish("k", table="tuning", metrics={}), lambda: s.fail("k", "boom", table="tuning"),
                  lambda: s.select_candidate("p", "ls", 0, "k", {}), lambda: s.put_meta("m", "v"),
                  lambda: s.retire("p/ce/0", "p/ce/0~x", None, None), s.close):
        assert write() is None
    assert (s.get("p/ce/0"), s.status("p/ce/0"), s.status("k", "tuning"), s.get_meta("m")) == (None,) * 4
    assert s.runs() == [] and s.runs("p", status=None) == [] and s.candidates("p", "ls", 0, None) == []
    assert s.busy_elsewhere("p/ce/0") is False and s.keeps_records is False


def test_a_claim_on_the_null_store_reads_as_held_elsewhere_until_rank_0s_outcome_replaces_it():
    s = NullStore()
    assert claim_outcome(s, "runs", "p/ce/0", s.claim("p/ce/0", preset="p", method="ce", seed=0)) is Outcome.ELSEWHERE
