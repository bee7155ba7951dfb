"""Every value calibkit writes into a SLURM job script, checked for its field and quoted.

A job script is a bash program: a value that holds a newline becomes a command line of its own,
and runs on the cluster. The values are therefore checked twice, where they enter (the command
line, :meth:`calibkit.bench.slurm.SlurmOptions.validate`, :func:`calibkit.commands.check_executor`)
and again where the script is written (:func:`calibkit.bench.slurm.script_text`), so that the
Python API is held to the same rules. Decided:

* **Everywhere**: control characters (newline, carriage return, NUL, escape, the rest of C0 and
  C1, DEL) and Unicode line or paragraph separators are refused, with one line naming the option.
* **--partition, --account, --qos**: names of letters, digits and ``_ . + - :`` (starting with a
  letter, a digit or ``_``); ``--partition`` may list several, separated by commas (sbatch reads
  a comma-separated list there). SLURM itself accepts more in a name (its configuration files
  take almost any word), but a name outside this class is not worth a script that can be
  misread; a cluster's names are practically always inside it.
* **--time**: SLURM's formats, ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S`` (whole
  numbers), or ``UNLIMITED`` / ``INFINITE`` (any case).
* **--mem**: a whole number with an optional unit ``K``, ``M``, ``G`` or ``T`` (any case;
  sbatch's default unit is M).
* **Counts** (GPUs, CPUs, array parallelism, the signal's lead time): integers (not booleans,
  not strings), at least their minimum.
* **--sbatch-arg**: an option (it starts with ``-``), written only as an ``#SBATCH`` line, quoted
  in sbatch's own syntax (:func:`sbatch_word`), so one argument stays one argument.
* **Command lines** of the script: every word through :func:`shlex.quote`; a word holding a
  password (a store URL, a connection string) is refused: a job script is a file other users of
  the cluster may read, so a password reaches a task through PGPASSWORD, ``~/.pgpass`` or a
  ``passfile`` instead.
* **Keys** of the index -> key map (one ``INDEX KEY`` line each, read with ``awk``): no white space.
"""

from __future__ import annotations

import re
import unicodedata

from calibkit.errors import UserError
from calibkit.store.secrets import redact

_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.:+-]*"
_NAMES = {False: re.compile(_NAME), True: re.compile(rf"{_NAME}(?:,{_NAME})*")}
_TIME = re.compile(r"\d+(?::\d+){0,2}|\d+-\d+(?::\d+){0,2}")
_UNLIMITED = ("UNLIMITED", "INFINITE")
_MEM = re.compile(r"\d+[KMGT]?", re.I)
# What an #SBATCH word may hold unquoted: sbatch splits at white space, reads quotes and
# backslashes, and takes an unescaped '#' as the start of a comment.
_PLAIN_WORD = re.compile(r"[A-Za-z0-9_.,:=+/%@-]+")
_CHAR_NAMES = {"\n": "a newline", "\r": "a carriage return", "\0": "a NUL character", "\t": "a tab"}


def control_char(value: str) -> str | None:
    """The first control character (or line separator) of ``value``, in words; None if none."""
    for char in value:
        if unicodedata.category(char) in ("Cc", "Zl", "Zp"):
            return _CHAR_NAMES.get(char, f"the control character U+{ord(char):04X}")
    return None


def check_text(option: str, value) -> str:
    """``value`` as text, refused when it holds a control character.

    Raises:
        ValueError: ``"OPTION: contains a newline; ..."``.
    """
    text = str(value)
    bad = control_char(text)
    if bad:
        raise UserError(f"{option}: contains {bad}; a value written into a SLURM job script must be one line "
                         "of printable characters")
    return text


def check_name(option: str, value: str, several: bool = False) -> str:
    """A partition (``several``: a comma-separated list), account or QOS name."""
    text = check_text(option, value)
    if not _NAMES[several].fullmatch(text):
        what = "names separated by commas" if several else "a name"
        raise UserError(f"{option}: {text!r} is not {what} of letters, digits and _ . + - : "
                         "(starting with a letter, a digit or _)")
    return text


def check_time(value: str, option: str = "--time") -> str:
    """A SLURM time limit."""
    text = check_text(option, value)
    if not (_TIME.fullmatch(text) or text.upper() in _UNLIMITED):
        raise UserError(f"{option}: {text!r} is not a SLURM time: minutes, minutes:seconds, hours:minutes:seconds, "
                         "days-hours, days-hours:minutes, days-hours:minutes:seconds (whole numbers), or UNLIMITED")
    return text


def check_mem(value: str, option: str = "--mem") -> str:
    """A SLURM memory size."""
    text = check_text(option, value)
    if not _MEM.fullmatch(text):
        raise UserError(f"{option}: {text!r} is not a memory size: a whole number with an optional unit "
                         "K, M, G or T (e.g. 64G; without a unit, megabytes)")
    return text


def check_count(option: str, value, minimum: int, unit: str = "") -> int:
    """An integer count of at least ``minimum`` (``unit``, e.g. ``" second"``, for the message)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserError(f"{option}: expected a whole number, got {value!r}")
    if value < minimum:
        raise UserError(f"{option} must be >= {minimum}{unit}, got {value}")
    return value


def check_sbatch_arg(value: str, option: str = "--sbatch-arg") -> str:
    """One more sbatch option: it starts with ``-``."""
    text = check_text(option, value)
    if not text.startswith("-"):
        raise UserError(f"{option}: {text!r} is not an sbatch option (e.g. --constraint=a100); it is written as "
                         "an #SBATCH line and nowhere else")
    return text


def sbatch_word(value: str) -> str:
    """``value`` as one word of an ``#SBATCH`` line: as it is when it holds only plain characters,
    else in double quotes with ``\\``, ``"``, ``'`` and ``#`` escaped by a backslash (what sbatch's
    own reader of these lines understands, in old and new releases alike)."""
    text = check_text("an #SBATCH value", value)
    if _PLAIN_WORD.fullmatch(text):
        return text
    return '"' + re.sub(r"""([\\"'#])""", r"\\\1", text) + '"'


def check_word(option: str, value) -> str:
    """One word of a command line in a job script: one line, and no password in it."""
    text = check_text(option, value)
    if redact(text) != text:
        raise UserError(f"{option}: holds a password, which is never written into a job script (other users "
                         "may read it); give it through PGPASSWORD, ~/.pgpass or a passfile")
    return text


def check_argv(argv) -> list[str]:
    """The calibkit arguments of a task, each checked by :func:`check_word` and named by the
    option it follows (``--data-dir: contains a newline; ...``)."""
    checked, option = [], "a calibkit argument"
    for word in argv:
        checked.append(check_word(option, word))
        option = word if isinstance(word, str) and word.startswith("--") else "a calibkit argument"
    return checked


def check_key(key: str) -> str:
    """A run or candidate key of an index -> key map: one word of one line."""
    text = check_text("a run key", key)
    if not text or any(c.isspace() for c in text):
        raise UserError(f"run key {text!r}: holds white space, which the script's index -> key map cannot hold "
                         "(a preset or method name with a space?)")
    return text
