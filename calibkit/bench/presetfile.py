"""Preset files: a :class:`~calibkit.bench.grid.Preset` as TOML, read back exactly.

``calibkit bench``, ``tune`` and ``report`` take ``--preset NAME`` (a shipped preset) or
``--preset FILE.toml``; ``calibkit preset show NAME`` prints a shipped preset in this format and
``calibkit preset check FILE`` validates one. The format (``docs/own_data.md``)::

    name = "mine"                      # top-level keys: the Preset fields
    dataset = "imagefolder"
    data_dir = "data/shapes"
    model = "mymodels:small_mlp"       # a calibkit.models name or "module:factory"
    seeds = [0, 1]
    methods = ["ce", "ls", "mbls"]
    ood = "none"

    [train]                            # TrainConfig fields shared by every run
    epochs = 20
    lr = 0.05

    [losses]                           # per-method loss specs
    mbls = "mbls:margin=6"

    [train_by_method.mixup]            # per-method TrainConfig overrides
    mix_alpha = 0.4

    [maccal]                           # run_maccal keywords
    [csm]                              # CSM settings (sharpness, store, encoder)

    [space.ls]                         # a method's search space, replacing its own grid
    "loss.alpha" = [0.003, 0.01, 0.03]

Every name is checked when the file is read (:func:`parse_preset`): an unknown key, table, method,
search-space address, TrainConfig field, loss parameter or MaC-Cal keyword is one ``ValueError``
naming it, the place it was found and the nearest valid name. TOML has no null: a
:class:`~calibkit.config.TrainConfig` field that may be None is written ``"none"`` (e.g.
``val_size = "none"``: the data set's own protocol); a top-level field left out takes its default.

Decisions where the spec is silent: a space axis given as a list takes, as its published value
(the tie-break of the selection, :class:`~calibkit.bench.grid.Axis`), the method's own default when
the method's own space has that address and the list holds that value, else the middle value of the
list (the lower of the two middle ones); ``{values = [...], default = v}`` sets it explicitly, to
one of the values (:mod:`calibkit.bench.presetcheck`). Values are sorted ascending;
repeats are an error. Relative paths are kept as written (they are read from the working
directory, as command-line paths are).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
from pathlib import Path

import tomllib

from calibkit.bench.grid import BENCH_METHODS, NAME_CHARS, PRESETS, REPORT_FIGURES, TARGETS, Axis, Preset
from calibkit.bench.space import loss_params
from calibkit.config import TrainConfig
from calibkit.errors import UserError, UserFileNotFoundError
from calibkit.losses import LOSSES
from calibkit.methods.maccal.run import run_maccal
from calibkit.rundir import atomic_write
from calibkit.suggest import nearest as nearest  # re-exported: where the preset checks import it

TABLES = ("train", "losses", "train_by_method", "maccal", "csm", "space")
TOP_KEYS = tuple(f.name for f in dataclasses.fields(Preset) if f.name not in TABLES + ("spaces",))
# TrainConfig fields the bench sets per run (from the top-level keys, the method, the seed, the
# command line): they are not [train] keys.
PER_RUN = {"data": "dataset", "data_dir": "data_dir", "model": "model", "loss": "[losses]", "method": "the method",
           "seed": "seeds", "device": "--device", "num_threads": "num_threads", "checkpoint_every": "checkpoint_every",
           "csm_data": "[csm] store"}
CSM_KEYS = ("sharpness", "store", "encoder")
# the reannotation encoders a bench can build without a file of its own (calibkit.bench.twostage)
CSM_ENCODERS = ("classifier", "efficientnet_lite0")
# Preset.modality: anything but "image" skips the methods that mix or generate images
MODALITIES = ("image", "text", "features")
NONE = "none"  # a None TrainConfig value in TOML
# Top-level keys that dump_preset leaves out at their default (the shipped presets' files stay short).
AT_DEFAULT_LEFT_OUT = ("num_threads", "checkpoint_every", "modality", "tune_seed", "report_figures")


def _unknown(what: str, name, valid, where: str = "") -> ValueError:
    return UserError(f"{where}unknown {what} {name!r}{nearest(name, valid)}; valid: {', '.join(map(str, valid))}")


def _train_fields() -> dict:
    return {f.name: f.type for f in dataclasses.fields(TrainConfig)}


def _maccal_keys() -> list[str]:
    params = inspect.signature(run_maccal).parameters
    return [k for k, p in params.items() if p.kind == p.KEYWORD_ONLY and k not in ("data_dir", "device", "log")]


def _loss_params(spec: str, where: str) -> list[str]:
    """The parameter names of a loss spec's loss (its name checked)."""
    name, given = loss_params(spec)
    if name.lower() not in LOSSES:
        raise _unknown("loss", name, list(LOSSES), where)
    valid = [k for k in inspect.signature(LOSSES[name.lower()]).parameters if k not in ("num_classes", "ignore_index")]
    for k in given:
        if k not in valid:
            raise _unknown(f"parameter of loss {name}", k, valid, where)
    return valid


def _train_table(values, where: str, per_run_ok: bool = False) -> dict:
    if not isinstance(values, dict):
        raise UserError(f"{where}: expected a table of TrainConfig fields, got {values!r}")
    fields = _train_fields()
    out = {}
    for k, v in values.items():
        if k in PER_RUN and not per_run_ok:
            raise UserError(f"{where}: {k!r} is set per run; use {PER_RUN[k]} instead")
        if k not in fields:
            raise _unknown("TrainConfig field", k, list(fields), f"{where}: ")
        if v == NONE and "None" in fields[k] and not fields[k].startswith("str"):
            v = None
        out[k] = v

    try:
        TrainConfig.from_dict(out)  # the types of the values
    except ValueError as exc:
        raise UserError(f"{where}: {exc}") from None
    return out


def _method(name, where: str) -> str:
    if name not in BENCH_METHODS:
        raise _unknown("method", name, list(BENCH_METHODS), where)
    return name


def _axis(method: str, address: str, value, where: str) -> Axis:
    if isinstance(value, dict):
        extra = sorted(set(value) - {"values", "default"})
        if extra or "values" not in value:
            raise UserError(f"{where}: an axis is a list of values or {{values = [...], default = v}}, got {value!r}")
        values, default = value["values"], value.get("default")
    else:
        values, default = value, None
    if not isinstance(values, list) or not values or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise UserError(f"{where}: {address!r} must be a non-empty list of numbers, got {values!r}")
    grid = tuple(sorted(float(v) for v in values))
    if len(set(grid)) != len(grid):
        raise UserError(f"{where}: {address!r} repeats a value: {list(values)}")
    own = BENCH_METHODS[method].space.get(address)
    if default is None:
        default = own.default if own is not None and own.default in grid else grid[(len(grid) - 1) // 2]
    if isinstance(default, bool) or not isinstance(default, (int, float)):
        raise UserError(f"{where}: {address!r}: default must be a number, got {default!r}")
    return Axis(grid, float(default))


def _space(method: str, table, loss_spec: str, where: str) -> dict:
    if not isinstance(table, dict) or not table:
        raise UserError(f"{where}: expected a table of search-space addresses, got {table!r}")
    out = {}
    for address, value in table.items():
        target, dot, name = address.partition(".")
        if target not in TARGETS or not dot or not name:
            raise UserError(f"{where}: bad search-space address {address!r}; expected <{'|'.join(TARGETS)}>.<name>"
                             + nearest(address, list(BENCH_METHODS[method].space)))
        valid = {"loss": lambda: _loss_params(loss_spec, f"{where}: "), "train": lambda: list(_train_fields()),
                 "maccal": _maccal_keys, "csm": lambda: ["sharpness"]}[target]()
        if name not in valid:
            raise _unknown(f"{target} setting", name, valid, f"{where}: address {address!r}: ")
        out[address] = _axis(method, address, value, f"{where}: ")
    return out


def check_name(name, where: str = "") -> str:
    """A preset name that can name run directories and database keys (``ValueError`` otherwise,
    starting with ``where``: the preset file's ``"FILE: "`` when it comes from one)."""
    if not isinstance(name, str) or not name or any(c not in NAME_CHARS for c in name) or name.startswith("."):
        raise UserError(f"{where}preset name {name!r}: use letters, digits and {NAME_CHARS[62:]} only "
                         "(it names the run directories)")
    return name


def from_dict(doc: dict, source: str = "preset") -> Preset:
    """A :class:`Preset` from the parsed TOML document ``doc`` (every name checked)."""
    where = f"{source}: "
    for key, value in doc.items():
        if isinstance(value, dict) and key not in TABLES:
            raise _unknown("table", f"[{key}]", [f"[{t}]" for t in TABLES], where)
        if not isinstance(value, dict) and key not in TOP_KEYS:
            raise _unknown("key", key, list(TOP_KEYS), where)
    missing = [k for k in ("name", "dataset", "model", "seeds") if k not in doc]
    if missing:
        raise UserError(f"{where}missing key(s) {', '.join(missing)}")
    kinds = {f.name: str(f.type) for f in dataclasses.fields(Preset)}  # annotations are text (PEP 563)
    top = {}
    for key in TOP_KEYS:
        if key in doc:
            top[key] = _typed(key, kinds[key], doc[key], where)
    check_name(top["name"], where)
    if top.get("modality", "image") not in MODALITIES:
        raise _unknown("modality", top["modality"], MODALITIES, where)
    if top.get("report_figures", REPORT_FIGURES[0]) not in REPORT_FIGURES:
        raise _unknown("report_figures value", top["report_figures"], REPORT_FIGURES, where)
    for m in top.get("methods") or ():
        _method(m, where + "methods: ")
    losses = doc.get("losses", {})
    for m, spec in losses.items():
        _method(m, where + "[losses]: ")
        if not isinstance(spec, str):
            raise UserError(f"{where}[losses] {m}: expected a loss spec string, got {spec!r}")
        _loss_params(spec, f"{where}[losses] {m}: ")
    by_method = {}
    for m, table in doc.get("train_by_method", {}).items():
        by_method[_method(m, where + "[train_by_method]: ")] = _train_table(table, f"{source} [train_by_method.{m}]")
    maccal = dict(doc.get("maccal", {}))
    for k in maccal:
        if k not in _maccal_keys():
            raise _unknown("[maccal] keyword", k, _maccal_keys(), where)
    csm = dict(doc.get("csm", {}))
    for k in csm:
        if k not in CSM_KEYS:
            raise _unknown("[csm] setting", k, CSM_KEYS, where)
    spaces = {}
    for m, table in doc.get("space", {}).items():
        _method(m, where + "[space]: ")
        spec = losses.get(m, BENCH_METHODS[m].loss)
        spaces[m] = _space(m, table, spec, f"{source} [space.{m}]")
    return Preset(**top, train=_train_table(doc.get("train", {}), f"{source} [train]"), losses=dict(losses),
                  train_by_method=by_method, maccal=maccal, csm=csm, spaces=spaces)


def _typed(key: str, kind: str, value, where: str):
    """A top-level value checked against the Preset field's annotation."""
    def bad(expected):
        return UserError(f"{where}{key}: expected {expected}, got {value!r}")

    if kind.startswith("tuple"):
        names = {"methods": "method names", "report_calibrators": "calibrator names"}
        if not isinstance(value, list) or not all(isinstance(v, str if key in names else int)
                                                  and not isinstance(v, bool) for v in value):
            raise bad("a list of " + names.get(key, "integers"))
        return tuple(value)
    if kind.startswith("int"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("an integer")
        return value
    if not isinstance(value, str):
        raise bad("a string")
    return value


def parse_preset(text: str, source: str = "preset") -> Preset:
    """:func:`from_dict` of TOML text (a syntax error names ``source``)."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{source}: invalid TOML ({exc})") from None
    return from_dict(doc, source)


def read_preset_file(path) -> Preset:
    path = Path(path)
    if not path.is_file():
        raise UserFileNotFoundError(f"preset file {path} not found; give an existing preset TOML file or a "
                                    "shipped preset's name (see calibkit preset --help)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not a UTF-8 text file ({exc})") from None
    return parse_preset(text, str(path))


def load_preset(name_or_path: str) -> Preset:
    """A shipped preset by name, or a preset file (a path, or any name ending in ``.toml``)."""
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    if name_or_path.endswith(".toml") or Path(name_or_path).is_file() or "/" in name_or_path:
        return read_preset_file(name_or_path)
    raise UserError(f"unknown preset {name_or_path!r}{nearest(name_or_path, PRESETS)}; a preset is a TOML file "
                     f"or one of: {', '.join(PRESETS)}")


# -- writing ---------------------------------------------------------------------------------------
_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(k: str) -> str:
    return k if _BARE.match(k) else json.dumps(k)


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v) if v == v and abs(v) != float("inf") else ("nan" if v != v else ("inf" if v > 0 else "-inf"))
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if v is None:
        return json.dumps(NONE)
    raise UserError(f"cannot write {v!r} ({type(v).__name__}) to a preset file")


def _table(header: str, values: dict) -> list[str]:
    return [f"[{header}]"] + [f"{_key(k)} = {_value(v)}" for k, v in values.items()] + [""]


def dump_preset(preset: Preset) -> str:
    """The TOML text of ``preset``; :func:`parse_preset` of it gives back an equal preset."""
    defaults = {f.name: f.default for f in dataclasses.fields(Preset) if f.default is not dataclasses.MISSING}
    lines = []
    for key in TOP_KEYS:
        value = getattr(preset, key)
        if value is None:
            continue  # TOML has no null: left out, it takes its default
        if key in AT_DEFAULT_LEFT_OUT and value == defaults.get(key):
            continue
        lines.append(f"{key} = {_value(value)}")
    lines.append("")
    lines += _table("train", preset.train)
    if preset.losses:
        lines += _table("losses", preset.losses)
    for m, values in preset.train_by_method.items():
        lines += _table(f"train_by_method.{m}", values)
    if preset.maccal:
        lines += _table("maccal", preset.maccal)
    if preset.csm:
        lines += _table("csm", preset.csm)
    for m, space in preset.spaces.items():
        lines += [f"[space.{m}]"] + [f"{_key(a)} = {{values = {_value(list(ax.values))}, default = "
                                     f"{_value(ax.default)}}}"
                                     for a, ax in space.items()] + [""]
    return "\n".join(lines)


PRESET_DIR = "presets"  # OUT/presets/<name>.toml: the effective preset of a bench directory


def effective_path(out, name: str) -> Path:
    return Path(out) / PRESET_DIR / f"{check_name(name)}.toml"


def write_effective(preset: Preset, out, overwrite: bool = True) -> Path:
    """Write ``OUT/presets/<name>.toml`` (atomically); ``overwrite=False`` keeps an existing one.

    The temporary file has a unique name: benches on several hosts sharing ``OUT`` write the same
    record at once (the text is the same, so whichever lands last is right).
    """
    path = effective_path(out, preset.name)
    if path.is_file() and not overwrite:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    text = dump_preset(preset)
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return path


def read_effective(out, name: str) -> Preset | None:
    """The effective preset recorded in a bench directory (None: not recorded)."""
    path = effective_path(out, name)
    return read_preset_file(path) if path.is_file() else None


# The fields that define every run of a preset and how it is evaluated: one directory holds one
# value of each per preset name (the searched values are checked run by run by the bench itself).
RUN_FIELDS = ("dataset", "model", "train", "ood", "robust_n", "severities", "modality")


def check_recorded(preset: Preset, out) -> None:
    """Refuse a preset whose runs would differ from those of the same name already in ``out``.

    Raises:
        ValueError: ``OUT/presets/<name>.toml`` records other :data:`RUN_FIELDS` (naming them).
    """
    try:
        recorded = read_effective(out, preset.name)
    except (OSError, ValueError):
        return  # an unreadable record is rewritten by the bench; the runs' own records still hold
    if recorded is None:
        return
    diff = []
    for key in RUN_FIELDS:
        a, b = getattr(recorded, key), getattr(preset, key)
        if key == "train" and a != b:
            diff += [f"train.{k} {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        elif a != b:
            diff.append(f"{key} {a!r} -> {b!r}")
    if diff:
        raise UserError(f"{effective_path(out, preset.name)}: the runs of preset {preset.name} here were made with "
                         f"other settings ({'; '.join(diff)}); choose another --out, or another name (--name)")
