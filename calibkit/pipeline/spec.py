"""One bench or tuning as one typed object, written once to a file that every process of it reads.

A :class:`BenchSpec` says which preset (a shipped name or a TOML file, and the command line's
changes to it), which output directory, and which options (:class:`BenchOptions` or
:class:`TuneOptions`). ``calibkit bench`` and ``calibkit tune`` make one from their arguments; the
extra processes of ``--workers N`` and the tasks of ``--executor slurm`` read the one their starter
wrote (:meth:`BenchSpec.write`, ``OUT/specs/<command>-<digest>.json``) and run from it, so every
process of a bench builds the same preset with the same checks from the same values.

The file (docs/bench.md, "The spec file") is JSON::

    {"version": 1, "command": "bench", "preset": "smoke", "changes": {"lr": 0.001},
     "out": "runs/smoke", "options": {"seeds": [0, 1], "methods": null, ...}}

``version`` is :data:`VERSION`; a file of another version is refused. ``options`` holds every
field of the options except ``log`` (a function; a reading process prints). A ``--store`` URL,
which may hold a password, is never written: the file says ``env:CALIBKIT_WORKER_STORE`` and the
process that starts the workers puts the URL in their environment
(:data:`calibkit.bench.workers.STORE_ENV`).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from calibkit.bench.grid import PRESETS, Preset, with_keep
from calibkit.bench.overrides import with_flags
from calibkit.bench.presetfile import load_preset
from calibkit.bench.workers import STORE_ENV
from calibkit.diskio import atomic_write
from calibkit.errors import UserError
from calibkit.pipeline.options import BenchOptions, TuneOptions

__all__ = ["COMMANDS", "VERSION", "BenchSpec", "read_spec"]

VERSION = 1
COMMANDS = {"bench": BenchOptions, "tune": TuneOptions}
# The preset's changes a spec may hold: the keyword arguments of calibkit.bench.overrides.with_flags.
CHANGES = ("name", "dataset", "model", "epochs", "lr", "batch_size", "val_size", "train_subset", "augment", "ood")
_TUPLES = ("seeds", "methods")


@dataclass(frozen=True)
class BenchSpec:
    """A bench (``command="bench"``) or a tuning (``"tune"``) as one value.

    Attributes:
        command: ``bench`` or ``tune``.
        preset: a shipped preset's name or a preset file's path (written as an absolute path).
        out: the output directory.
        options: a :class:`BenchOptions` (bench) or :class:`TuneOptions` (tune).
        changes: the preset's changes (``with_flags``' keywords, e.g. ``{"lr": 0.001}``).
    """

    command: str
    preset: str
    out: str
    options: BenchOptions | TuneOptions
    changes: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.command not in COMMANDS:
            raise UserError(f"spec: command must be one of {', '.join(COMMANDS)}, got {self.command!r}")
        if not isinstance(self.options, COMMANDS[self.command]):
            raise UserError(f"spec: a {self.command} spec takes a {COMMANDS[self.command].__name__}, got "
                            f"{type(self.options).__name__}")
        unknown = sorted(set(self.changes) - set(CHANGES))
        if unknown:
            raise UserError(f"spec: unknown preset change(s) {', '.join(unknown)}; known: {', '.join(CHANGES)}")
        object.__setattr__(self, "out", os.fspath(self.out))
        object.__setattr__(self, "changes", {k: v for k, v in self.changes.items() if v is not None})

    def load(self) -> Preset:
        """The preset this spec runs: the named one, its changes, the options' checkpoint policy."""
        return with_keep(with_flags(load_preset(self.preset), **self.changes), self.options.keep)

    def to_dict(self) -> dict:
        """The file's content (a ``--store`` URL replaced by ``env:CALIBKIT_WORKER_STORE``)."""
        opts = {f.name: getattr(self.options, f.name) for f in fields(self.options) if f.name != "log"}
        for name in _TUPLES:
            if opts.get(name) is not None:
                opts[name] = list(opts[name])
        if opts["store"] is not None:
            opts["store"] = f"env:{STORE_ENV}"
        # a preset file by its absolute path: a process reading the file may start in another folder
        preset = self.preset if self.preset in PRESETS else os.path.abspath(self.preset)
        return {"version": VERSION, "command": self.command, "preset": preset, "changes": self.changes,
                "out": self.out, "options": opts}

    def path(self) -> Path:
        """Where :meth:`write` puts it: ``OUT/specs/<command>-<12 hex digits of its content>.json``
        (the same bench, the same file; another one beside it, never over it)."""
        text = _text(self.to_dict())
        return Path(self.out) / "specs" / f"{self.command}-{hashlib.sha256(text.encode()).hexdigest()[:12]}.json"

    def write(self) -> Path:
        """Write the file (once every check has passed: a bench that cannot run leaves no trace);
        returns its absolute path."""
        path = self.path()
        path.parent.mkdir(parents=True, exist_ok=True)
        text = _text(self.to_dict())
        atomic_write(path, lambda tmp: Path(tmp).write_text(text))
        return path.resolve()

    def argv(self, path, *more: str) -> list[str]:
        """The calibkit arguments of a process that runs this spec from its file ``path``."""
        return [self.command, "--out", self.out, "--spec", str(path), *more]

    def with_options(self, **changes) -> BenchSpec:
        """This spec with some options changed (``dataclasses.replace`` of its options)."""
        return replace(self, options=replace(self.options, **changes))


def _text(doc: dict) -> str:
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def read_spec(path, command: str | None = None) -> BenchSpec:
    """The :class:`BenchSpec` of a file :meth:`BenchSpec.write` wrote (``command``: the one it must be).

    Raises:
        UserError: not such a file (unreadable, not JSON, another version, an unknown field or
            command), naming the file and the problem.
    """
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"--spec {path}: cannot read a bench spec ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        found = doc.get("version") if isinstance(doc, dict) else None
        raise UserError(f"--spec {path}: spec version {found!r}; this calibkit reads version {VERSION} "
                        "(run the command that wrote it again with this calibkit)")
    if command is not None and doc.get("command") != command:
        raise UserError(f"--spec {path}: a {doc.get('command')!r} spec, not one of calibkit {command}")
    known = {"version", "command", "preset", "changes", "out", "options"}
    if set(doc) != known or doc["command"] not in COMMANDS or not isinstance(doc["options"], dict):
        raise UserError(f"--spec {path}: expected the keys {', '.join(sorted(known))}, got {', '.join(sorted(doc))}")
    cls = COMMANDS[doc["command"]]
    opts = dict(doc["options"])
    names = {f.name for f in fields(cls)} - {"log"}
    if set(opts) != names:
        raise UserError(f"--spec {path}: options {', '.join(sorted(set(opts) ^ names))} do not match "
                        f"a {cls.__name__}")
    for name in _TUPLES:
        if opts.get(name) is not None:
            opts[name] = tuple(opts[name])
    return BenchSpec(doc["command"], doc["preset"], doc["out"], cls(**opts), changes=doc["changes"] or {})
