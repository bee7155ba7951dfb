"""The field rules of :mod:`calibkit.bench.slurm_values`, and their one-line refusals on the
command line (``calibkit bench --executor slurm --dry-run``)."""

import re

import pytest

from calibkit.bench import slurm_values as V
from calibkit.bench.slurm import SlurmOptions
from calibkit.cli import main
from tests.bench.test_slurm_scripts import sbatch_words

TIMES = ["30", "90:00", "12:00:00", "2-0", "1-12:30", "7-00:00:00", "UNLIMITED", "infinite", "0"]
BAD_TIMES = ["garbage", "12h", "1:2:3:4", "-5", "1-2-3", "1-", ":30", "1.5", "", " 30", "12:00:00 "]
MEMS = ["0", "500", "64G", "64g", "512M", "2T", "100K"]
BAD_MEMS = ["lots", "64GB", "G", "-1G", "1.5G", "64 G", "64G;"]
NAMES = ["gpu", "gpu_a100", "long-queue", "x.y", "a+b", "proj:1", "_x"]
BAD_NAMES = ["gpu queue", "-gpu", ".x", "gpu$", "gpu'", "gpu\\", "a,b", ",", "gpu/x", "ü"]


@pytest.mark.parametrize("value", TIMES)
def test_slurm_times(value):
    assert V.check_time(value) == value


@pytest.mark.parametrize("value", MEMS)
def test_memory_sizes(value):
    assert V.check_mem(value) == value


@pytest.mark.parametrize("value", NAMES)
def test_names(value):
    assert V.check_name("--account", value) == value


def test_a_partition_may_be_a_list():
    assert V.check_name("--partition", "gpu,gpu_long", several=True) == "gpu,gpu_long"
    for bad in ("gpu,", ",gpu", "gpu,,cpu"):
        with pytest.raises(ValueError, match="^--partition: .* is not names separated by commas"):
            V.check_name("--partition", bad, several=True)


@pytest.mark.parametrize("option,values", [("--time", BAD_TIMES), ("--mem", BAD_MEMS),
                                           ("--partition", [n for n in BAD_NAMES if n != "a,b"]),
                                           ("--account", BAD_NAMES), ("--qos", BAD_NAMES)])
def test_each_invalid_value_is_refused_naming_its_option(tmp_path, capsys, option, values):
    for value in values:
        if value == "":  # an empty value is "not asked for", as before
            continue
        rc = main(["bench", "--preset", "smoke", "--out", str(tmp_path / "out"), "--executor", "slurm", "--dry-run",
                   f"{option}={value}"])
        err = capsys.readouterr().err.strip()
        assert rc == 1 and err.startswith(f"calibkit bench: error: {option}: {value!r} is not "), (value, err)
        assert "\n" not in err
    assert not (tmp_path / "out" / "slurm").exists()


@pytest.mark.parametrize("char,words", [("\n", "a newline"), ("\r", "a carriage return"), ("\0", "a NUL character"),
                                        ("\t", "a tab"), ("\x1b", "the control character U+001B"),
                                        ("\x85", "the control character U+0085"),
                                        ("\u2028", "the control character U+2028")])
def test_control_characters_are_named(char, words):
    with pytest.raises(ValueError, match="^--qos: contains " + re.escape(words) + ";"):
        V.check_text("--qos", f"normal{char}x")


def test_counts_are_whole_numbers():
    for value, message in ((True, "expected a whole number"), ("2", "expected a whole number"),
                           (1.0, "expected a whole number"), (-1, "must be >= 0")):
        with pytest.raises(ValueError, match=f"^--gpus-per-run.*{message}"):
            SlurmOptions(gpus_per_run=value).validate()
    with pytest.raises(ValueError, match="^--array-parallelism must be >= 1"):
        SlurmOptions(array_parallelism=0).validate()


def test_sbatch_words_read_back_as_given():
    for value in ["--constraint=a100", "--comment=two words", "--comment=a#b", "--comment=it's \"x\"",
                  "--comment=back\\slash", "--comment=$(x) `y` ; && |"]:
        line = f"#SBATCH {V.sbatch_word(value)}"
        assert sbatch_words(line) == [value], line
    assert V.sbatch_word("--constraint=a100") == "--constraint=a100"  # plain values stay as they are


def test_options_of_the_python_api_are_validated():
    with pytest.raises(ValueError, match=r"^--mem: '1 G' is not a memory size"):
        SlurmOptions(mem="1 G").directives(0)
    with pytest.raises(ValueError, match=r"^--sbatch-arg: 'x' is not an sbatch option"):
        SlurmOptions(sbatch_args=("x",)).validate()
    with pytest.raises(ValueError, match=r"^--sbatch-arg: expected a sequence"):
        SlurmOptions(sbatch_args="--x").validate()
    opts = SlurmOptions(partition="gpu,long", time="1-00:00:00", mem="8G", sbatch_args=("--comment=a b",))
    words = opts.directives(2)
    assert words == ["--cpus-per-task=1", "--gres=gpu:2", "--partition=gpu,long", "--time=1-00:00:00", "--mem=8G",
                     '"--comment=a b"']


def test_keys_with_white_space_are_refused():
    assert V.check_key("smoke/ce/0") == "smoke/ce/0"
    with pytest.raises(ValueError, match="holds white space"):
        V.check_key("my preset/ce/0")
