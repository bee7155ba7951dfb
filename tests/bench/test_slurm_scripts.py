"""Hostile values in every option that reaches an ``--executor slurm`` job script: each is refused
with one line naming its option, or written so that bash and sbatch read exactly the intended
words (``bash -n`` passes, no line but the expected ones, nothing executed)."""

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from calibkit.bench.slurm import Array, SlurmOptions, script_text
from calibkit.cli import main
from calibkit.data.idx import FMNIST_DIR as FMNIST  # the smoke preset's data

BENIGN = "BENIGN0"
HOSTILE = ["x\ntouch pwned", "x; touch pwned", "$(touch pwned)", "`touch pwned`", "x'y\"z", "two words",
           "x && touch pwned", "x #y", "x\rtouch pwned", "x\0y", "100%j\\n"]

CONTROL = {"\n": "a newline", "\r": "a carriage return", "\0": "a NUL character"}


def sbatch_words(line: str) -> list[str]:
    """The arguments sbatch reads from an ``#SBATCH`` line (its reader: white space separates,
    '"' and "'" quote, a backslash escapes, an unescaped '#' outside quotes ends the line)."""
    text, words, word, quote, escaped, started = line[len("#SBATCH"):], [], "", None, False, False
    for char in text:
        if escaped:
            word, escaped, started = word + char, False, True
        elif char == "\\":
            escaped = True
        elif quote:
            if char == quote:
                quote = None
            else:
                word += char
        elif char in "\"'":
            quote, started = char, True
        elif char == "#":
            break
        elif char.isspace():
            if started:
                words.append(word)
            word, started = "", False
        else:
            word, started = word + char, True
    assert quote is None, line
    return words + ([word] if started else [])


def bash_words(line: str, cwd: Path) -> list[str]:
    """The words bash makes of one command line of a script (its command replaced by a printer;
    ``$key`` set), run in ``cwd`` so that an injected ``touch`` would leave a file there."""
    words = shlex.split(line, posix=True)
    assert words, line
    head = line.split(" ", 1)
    body = ("p " + head[1] if len(head) > 1 else "p").removesuffix(" &")
    if words[0].startswith("keys="):  # an assignment: print the value
        body = f'{line}; p "$keys"'
    script = f"p() {{ printf '%s\\0' \"$@\"; }}; key=KEY\n{body}\n"
    out = subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, check=True).stdout
    return out.decode().split("\0")[:-1]


def write(out, *extra):
    argv = ["bench", "--preset", "smoke", "--seeds", "0", "--methods", "ce", "--out", str(out), "--executor", "slurm",
            "--dry-run", *extra]
    return main(argv)


SPEC = re.compile(r"specs/bench-[0-9a-f]{12}\.json")


def script(out) -> list[str]:
    """The CE array's script, its spec file's name (a digest of the bench's values) as ``bench-SPEC``."""
    return SPEC.sub("specs/bench-SPEC.json", (Path(out) / "slurm" / "001-ce.sh").read_text()).splitlines()


def spec_of(out):
    """The spec file the CE array's tasks read."""
    from calibkit.pipeline.spec import read_spec

    (name,) = SPEC.findall((Path(out) / "slurm" / "001-ce.sh").read_text())
    return read_spec(Path(out) / name, "bench")


def check_lines(base: list[str], lines: list[str], benign: str, hostile: str, cwd: Path):
    """``lines`` are ``base`` with ``benign`` read as ``hostile`` by sbatch and by bash: the same
    number of lines, each #SBATCH line the same words, each command line the same words; the job
    name made of plain characters only; in --output (a file name pattern) '%' doubled."""
    assert len(lines) == len(base), "\n".join(lines)
    for old, new in zip(base, lines):
        if old.startswith("#SBATCH --job-name="):
            assert re.fullmatch(r"--job-name=[A-Za-z0-9_.+-]+", new.removeprefix("#SBATCH ")), new
        elif old.startswith("#SBATCH"):
            value = hostile.replace("%", "%%") if old.startswith("#SBATCH --output=") else hostile
            assert sbatch_words(new) == [w.replace(benign, value) for w in sbatch_words(old)], new
        elif old.startswith("#") or not old.strip():
            assert new.startswith("#") or not new.strip(), new
        elif old != new:
            assert bash_words(new, cwd) == [w.replace(benign, hostile) for w in bash_words(old, cwd)], new
    assert not list(cwd.iterdir()), "a command ran"


@pytest.mark.parametrize("hostile", HOSTILE)
@pytest.mark.parametrize("option", ["--partition", "--account", "--qos", "--time", "--mem"])
def test_resource_options_refuse_every_hostile_value(tmp_path, capsys, option, hostile):
    assert write(tmp_path / "out", option, hostile) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"calibkit bench: error: {option}: ") and "\n" not in err
    assert not (tmp_path / "out" / "slurm").exists()


@pytest.mark.parametrize("hostile", HOSTILE)
@pytest.mark.parametrize("option", ["--out", "--data-dir", "--csm-store", "--name"])
def test_words_of_the_command_line_stay_words(tmp_path, capsys, option, hostile):
    """A path, a device, a preset name: refused (a control character; a preset name that cannot
    be a run key), else one word of the command line, and the #SBATCH lines read as meant."""
    run_in = tmp_path / "cwd"
    run_in.mkdir()
    if option == "--out":
        base_out, out, extra, base_extra = tmp_path / "b" / BENIGN, tmp_path / "h" / hostile, [], []
    elif option in ("--data-dir", "--csm-store"):  # a folder of that name (the data set's files; a --csm-store
        values = [tmp_path / "b" / BENIGN, tmp_path / "h" / hostile]  # must exist even when csm does not run)
        for folder in values if not any(c in hostile for c in CONTROL) else values[:1]:
            folder.parent.mkdir(parents=True, exist_ok=True)
            if option == "--data-dir":
                folder.symlink_to(FMNIST)
            else:
                folder.mkdir()
        base_out, out, extra, base_extra = tmp_path / "b" / "o", tmp_path / "h" / "o", [option, str(values[1])], [
            option, str(values[0])]
    else:
        base_out, out = tmp_path / "b" / "o", tmp_path / "h" / "o"
        extra, base_extra = [option, hostile], [option, BENIGN]
    assert write(base_out, *base_extra) == 0
    capsys.readouterr()
    rc = write(out, *extra)
    err = capsys.readouterr().err
    bad = next((c for c in CONTROL if c in hostile), None)
    if bad:
        assert rc == 1 and err.strip() == (f"calibkit bench: error: {option}: contains {CONTROL[bad]}; a value "
                                           "written into a SLURM job script must be one line of printable characters")
        return
    if rc != 0:  # refused by its own check (a preset name that cannot be a run key): one line
        assert len(err.strip().splitlines()) == 1, err
        return
    base = [line.replace(str(tmp_path / "b"), str(tmp_path / "h")) for line in script(base_out)]
    check_lines(base, script(out), BENIGN, hostile, run_in)
    subprocess.run(["bash", "-n", str(out / "slurm" / "001-ce.sh")], check=True)
    # the tasks read every other value from the spec file, exactly as given
    spec = spec_of(out)
    given = {"--out": (spec.out, str(out)), "--name": (spec.changes.get("name"), hostile)}.get(option)
    if option in ("--data-dir", "--csm-store"):
        given = (getattr(spec.options, option[2:].replace("-", "_")), extra[1])
    assert given[0] == given[1]


@pytest.mark.parametrize("hostile", HOSTILE)
def test_a_device_is_checked_before_any_script_is_written(tmp_path, capsys, hostile):
    assert write(tmp_path / "out", "--device", hostile) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("calibkit bench: error: ") and "device" in err and "\n" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("hostile", HOSTILE)
def test_sbatch_arg_is_one_quoted_sbatch_line(tmp_path, capsys, hostile):
    assert write(tmp_path / "b", f"--sbatch-arg=--comment={BENIGN}") == 0
    capsys.readouterr()
    rc = write(tmp_path / "h", f"--sbatch-arg=--comment={hostile}")
    err = capsys.readouterr().err
    bad = next((c for c in CONTROL if c in hostile), None)
    if bad:
        assert rc == 1 and err.startswith(f"calibkit bench: error: --sbatch-arg: contains {CONTROL[bad]};"), err
        return
    lines = script(tmp_path / "h")
    run_in = tmp_path / "cwd"
    run_in.mkdir()
    base = [line.replace(str(tmp_path / "b"), str(tmp_path / "h")) for line in script(tmp_path / "b")]
    check_lines(base, lines, BENIGN, hostile, run_in)
    assert f"--comment={hostile}" in [w for line in lines if line.startswith("#SBATCH") for w in sbatch_words(line)]
    subprocess.run(["bash", "-n", str(tmp_path / "h" / "slurm" / "001-ce.sh")], check=True)


@pytest.mark.parametrize("arg", ["constraint=a100", "a100", "", "--x\n--y"])
def test_sbatch_arg_that_is_no_option_is_refused(tmp_path, capsys, arg):
    assert write(tmp_path / "out", f"--sbatch-arg={arg}") == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("calibkit bench: error: --sbatch-arg: ") and "\n" not in err


def test_the_python_api_is_checked_where_the_script_is_written(tmp_path):
    """SlurmOptions and the task arguments are checked again in script_text (no CLI in front)."""
    array = Array("ce", "bench", {0: "smoke/ce/0"})
    keys, logs = tmp_path / "k.keys", tmp_path / "logs"
    argv = ["bench", "--preset", "smoke", "--out", str(tmp_path)]
    with pytest.raises(ValueError, match=r"^--partition: contains a newline;"):
        script_text(array, "n", keys, logs, argv, SlurmOptions(partition="gpu\ntouch pwned"))
    with pytest.raises(ValueError, match=r"^--time: 'soon' is not a SLURM time"):
        script_text(array, "n", keys, logs, argv, SlurmOptions(time="soon"))
    with pytest.raises(ValueError, match=r"^--gpus-per-run: expected a whole number"):
        script_text(array, "n", keys, logs, argv, SlurmOptions(gpus_per_run="2\ntouch pwned"))
    with pytest.raises(ValueError, match=r"^--data-dir: contains a newline;"):
        script_text(array, "n", keys, logs, [*argv, "--data-dir", "/d\ntouch pwned"], SlurmOptions())
    with pytest.raises(ValueError, match=r"^--out: contains a newline;"):
        script_text(array, "n", tmp_path / "a\nb" / "k.keys", logs, argv, SlurmOptions())
    with pytest.raises(ValueError, match="not a stage"):
        script_text(Array("ce\ntouch pwned", "bench", {0: "k"}), "n", keys, logs, argv, SlurmOptions())


def test_a_password_is_never_written_into_a_script(tmp_path):
    array = Array("ce", "bench", {0: "smoke/ce/0"})
    for url in ("postgresql://u:s3cret@db/x", "postgresql://db/x?password=s3cret", "host=db password=s3cret"):
        with pytest.raises(ValueError, match=r"^--store: holds a password.*PGPASSWORD, ~/.pgpass or a passfile"):
            script_text(array, "n", tmp_path / "k", tmp_path / "logs", ["bench", "--store", url], SlurmOptions())
