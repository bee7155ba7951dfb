"""The Python API refuses what the command line refuses (the bench cases of ``tools/input_audit.py``
that have an API form), with a :class:`UserError` and nothing created on disk."""

from dataclasses import replace
from pathlib import Path

import pytest

from calibkit.bench.overrides import with_flags
from calibkit.bench.presetfile import load_preset
from calibkit.errors import UserError
from calibkit.pipeline import BenchOptions, TuneOptions, run_bench, run_tune


def _smoke(**flags):
    return with_flags(load_preset("smoke"), **flags)


# (case of tools/input_audit.py, what the API is given, a word the message must hold)
CASES = [
    ("--seeds -1", lambda: run_bench("smoke", "out", BenchOptions(seeds=(-1,))), "seeds"),
    ("--seeds 0 0", lambda: run_bench("smoke", "out", BenchOptions(seeds=(0, 0))), "seeds"),
    ("seeds 2**70", lambda: run_bench("smoke", "out", BenchOptions(seeds=(2**70,))), "2**63"),
    ("--num-threads 0", lambda: run_bench("smoke", "out", BenchOptions(num_threads=0)), "num_threads"),
    ("--keep bogus", lambda: run_bench("smoke", "out", BenchOptions(keep="bogus")), "keep"),
    ("--device banana", lambda: run_bench("smoke", "out", BenchOptions(device="banana")), "banana"),
    ("device tpu", lambda: run_bench("smoke", "out", BenchOptions(device="tpu")), "tpu"),
    ("--max-extensions -1", lambda: run_bench("smoke", "out", BenchOptions(max_extensions=-1)), "max_extensions"),
    ("--store mysql://", lambda: run_bench("smoke", "out", BenchOptions(store="mysql://u@h/db")), "store"),
    ("--store env: (empty name)", lambda: run_bench("smoke", "out", BenchOptions(seeds=(0,), store="env:")), "store"),
    ("--preset missing.toml", lambda: run_bench(Path("missing.toml"), "out", BenchOptions(seeds=(0,))),
     "missing.toml"),
    ("unknown preset name", lambda: run_bench("no_such_preset", "out", BenchOptions(seeds=(0,))), "no_such_preset"),
    ("--methods bogus", lambda: run_bench("smoke", "out", BenchOptions(seeds=(0,), methods=("ce", "bogus"))),
     "bogus"),
    ("--csm-store missing", lambda: run_bench("smoke", "out", BenchOptions(seeds=(0,), csm_store="nostore")),
     "nostore"),
    ("--data-dir missing", lambda: run_bench(_smoke(dataset="tensors"), "out",
                                             BenchOptions(seeds=(0,), data_dir="nodir.npz")), "nodir.npz"),
    ("--epochs 0", lambda: run_bench(_smoke(epochs=0), "out", BenchOptions(seeds=(0,))), "epochs"),
    ("--lr -1", lambda: run_bench(_smoke(lr=-1.0), "out", BenchOptions(seeds=(0,))), "lr"),
    ("--batch-size 0", lambda: run_bench(_smoke(batch_size=0), "out", BenchOptions(seeds=(0,))), "batch_size"),
    ("--val-size 1.5", lambda: run_bench(_smoke(val_size=1.5), "out", BenchOptions(seeds=(0,))), "val_size"),
    ("--train-subset 0", lambda: run_bench(_smoke(train_subset=0), "out", BenchOptions(seeds=(0,))),
     "train_subset"),
    ("--name a/b", lambda: run_bench(replace(load_preset("smoke"), name="a/b"), "out", BenchOptions(seeds=(0,))),
     "a/b"),
    ("report='no'", lambda: BenchOptions(report="no"), "report"),
    ("figures=1", lambda: BenchOptions(figures=1), "figures"),
    ("tune='yes'", lambda: BenchOptions(tune="yes"), "tune"),
    ("log=None", lambda: BenchOptions(log=None), "log"),
    ("a dict for the options", lambda: run_bench("smoke", "out", {"seeds": [0]}), "BenchOptions"),
    ("out=None", lambda: run_bench("smoke", None, BenchOptions(seeds=(0,))), "out"),
    ("tune: --seed -1", lambda: run_tune("smoke", "out", TuneOptions(seed=-1)), "seed"),
    ("tune: a dict", lambda: run_tune("smoke", "out", {"seed": 0}), "TuneOptions"),
    ("tune: device tpu", lambda: TuneOptions(device="tpu"), "tpu"),
    ("tune: store mysql", lambda: TuneOptions(store="mysql://x"), "store"),
    ("tune: out=None", lambda: run_tune("smoke", None, TuneOptions()), "out"),
]


@pytest.mark.parametrize("case, call, word", CASES, ids=[c[0] for c in CASES])
def test_api_refuses_as_the_command_line_and_creates_nothing(case, call, word, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as err:
        call()
    message = str(err.value)
    assert word in message and "\n" not in message.strip(), message
    assert list(tmp_path.iterdir()) == [], case  # nothing written, out/ included


def test_a_missing_file_is_a_user_error_and_still_a_file_not_found_error(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        run_bench(tmp_path / "gone.toml", tmp_path / "out", BenchOptions(seeds=(0,)))
    assert isinstance(err.value, UserError) and "gone.toml" in str(err.value) and "preset" in str(err.value)
