"""``calibkit.pipeline.options``: the options of the bench and the tuning, refused when made."""

import pytest

from calibkit.errors import UserError
from calibkit.pipeline import BenchOptions, TuneOptions


@pytest.mark.parametrize("field, value, message", [
    ("seeds", (0, 0), "seeds: repeated seed in [0, 0]"),
    ("seeds", (0, -1), "seeds: every seed must be an integer >= 0, got -1"),
    ("seeds", (), "seeds: give at least one seed"),
    ("seeds", 3, "seeds: expected a sequence of integers, got 3"),
    ("methods", "ls", "methods: expected a sequence of method names, got 'ls'"),
    ("num_threads", 0, "num_threads must be an integer >= 1 (or None: the preset's), got 0"),
    ("max_extensions", -1, "max_extensions must be an integer >= 0 (0: never extend a grid), got -1"),
    ("keep", "sometimes", "keep: unknown checkpoint policy 'sometimes'"),
    ("alpha", 1.0, "alpha must be a number in (0, 1)"),
])
def test_bad_options_are_refused_when_made(field, value, message):
    with pytest.raises(UserError) as err:
        BenchOptions(**{field: value})
    assert str(err.value).startswith(message)


def test_options_hold_tuples_and_tune_options_carry_the_shared_fields():
    opts = BenchOptions(seeds=[1, 0], methods=["ls"], keep="last", max_extensions=0, data_dir="d", tune=True)
    assert opts.seeds == (1, 0) and opts.methods == ("ls",)
    tune = opts.tune_options()
    assert (tune.methods, tune.keep, tune.max_extensions, tune.data_dir, tune.seed, tune.report) == \
        (("ls",), "last", 0, "d", None, False)
    with pytest.raises(UserError, match="^seed: every seed must be an integer >= 0, got -2$"):
        TuneOptions(seed=-2)
