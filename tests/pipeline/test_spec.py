"""``calibkit.pipeline.spec``: one bench as one value, written once, read back as the same value."""

import json
from dataclasses import replace

import pytest

from calibkit.bench.grid import PRESETS, with_keep
from calibkit.bench.overrides import with_flags
from calibkit.errors import UserError
from calibkit.pipeline import BenchOptions, BenchSpec, TuneOptions, read_spec
from calibkit.pipeline.spec import VERSION


def _every_option():
    return BenchOptions(seeds=(2, 0), methods=("ls", "ce"), data_dir="/d", device="cuda:1", num_threads=3,
                        csm_store="/c", csm_build=True, store=None, keep="last", tune=True, max_extensions=4,
                        report=False, figures=False, alpha=0.05)


def test_a_bench_spec_reads_back_as_the_same_value(tmp_path):
    spec = BenchSpec("bench", "smoke", str(tmp_path / "o"), _every_option(),
                     changes={"lr": 0.1 + 0.2, "val_size": 0.25, "epochs": 3, "augment": False, "name": "mine",
                              "model": None})
    path = spec.write()
    assert path == (tmp_path / "o" / "specs" / path.name).resolve() and path.name.startswith("bench-")
    again = read_spec(path, "bench")
    assert again == spec and again.options.seeds == (2, 0)  # order kept: the bench runs them in this order
    assert again.changes["lr"] == 0.1 + 0.2  # a float read back bit for bit
    assert "model" not in again.changes  # an unchanged field is not a change
    assert again.load() == with_keep(with_flags(PRESETS["smoke"], name="mine", lr=0.1 + 0.2, val_size=0.25, epochs=3,
                                                augment=False), "last")
    doc = json.loads(path.read_text())
    assert doc["version"] == VERSION == 1 and doc["command"] == "bench" and "log" not in doc["options"]
    # the same values, the same file; others, another file beside it
    assert spec.write() == path and len(list(path.parent.iterdir())) == 1
    other = spec.with_options(seeds=(1,))
    assert other.write() != path and len(list(path.parent.iterdir())) == 2
    assert read_spec(other.path(), "bench").options == replace(spec.options, seeds=(1,))


def test_a_tune_spec_and_a_preset_file_by_its_absolute_path(tmp_path, monkeypatch):
    from calibkit.bench.presetfile import dump_preset

    (tmp_path / "mine.toml").write_text(dump_preset(PRESETS["smoke"]))
    monkeypatch.chdir(tmp_path)
    spec = BenchSpec("tune", "mine.toml", "o", TuneOptions(methods=("ls",), seed=4))
    assert spec.preset == "mine.toml"  # as given (an error names it so)
    again = read_spec(spec.write())
    assert again.preset == str(tmp_path / "mine.toml")  # a task may start in another directory
    assert again == replace(spec, preset=again.preset) and again.load() == spec.load()


def test_a_store_url_never_reaches_the_file(tmp_path):
    url = "postgresql://calib:s3cretpw@db/x"
    spec = BenchSpec("bench", "smoke", str(tmp_path), BenchOptions(store=url))
    text = spec.write().read_text()
    assert "s3cretpw" not in text and "db/x" not in text
    assert read_spec(spec.path()).options.store == "env:CALIBKIT_WORKER_STORE"


def test_a_bad_spec_is_refused_naming_the_file_and_the_problem(tmp_path):
    spec = BenchSpec("bench", "smoke", str(tmp_path), BenchOptions())
    path = spec.write()
    doc = json.loads(path.read_text())
    bad = tmp_path / "bad.json"
    for change, message in (({"version": 2}, "spec version 2; this calibkit reads version 1"),
                            ({"command": "report"}, "expected the keys"),
                            ({"extra": 1}, "expected the keys"),
                            ({"options": {**doc["options"], "colour": 1}}, "options colour do not match"),
                            ({"options": {**doc["options"], "alpha": 2}}, "alpha must be a number in (0, 1)"),
                            ({"changes": {"colour": "red"}}, "unknown preset change(s) colour")):
        bad.write_text(json.dumps({**doc, **change}))
        with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
            read_spec(bad)
    with pytest.raises(UserError, match=r"a 'bench' spec, not one of calibkit tune"):
        read_spec(path, "tune")
    bad.write_text("{")
    with pytest.raises(UserError, match=rf"^--spec {bad}: cannot read a bench spec"):
        read_spec(bad)
    with pytest.raises(UserError, match="a bench spec takes a BenchOptions, got TuneOptions"):
        BenchSpec("bench", "smoke", "o", TuneOptions())
