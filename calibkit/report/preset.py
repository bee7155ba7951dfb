"""The report's preset: which preset the runs were made under, its note, and its settings.

A bench records its effective preset in ``OUT/presets/<name>.toml``
(:func:`calibkit.bench.presetfile.write_effective`); the report reads it back (a shipped preset's
definition is the fallback for directories written before presets were recorded) and shows its
note in the intro and every setting in a "Preset" section, so a reader can rerun exactly these
runs with ``--preset OUT/presets/<name>.toml``.
"""

from __future__ import annotations

from calibkit.bench.grid import PRESETS
from calibkit.bench.presetfile import PRESET_DIR, dump_preset, read_effective
from calibkit.report.render import Section
from calibkit.report.tables import Table


def recorded_preset(out_dir, name: str):
    """The effective preset of ``name`` in ``out_dir``, else the shipped one of that name, else None."""
    found = read_effective(out_dir, name)
    return found if found is not None else PRESETS.get(name)


def report_calibrators(preset) -> tuple[str, ...] | None:
    """The calibrators the report fits for ``preset``: its ``report_calibrators`` (None: every
    calibrator of the registry but the opt-in ones; also when no preset is known)."""
    return None if preset is None else preset.report_calibrators


def preset_rows(preset) -> list[list[str]]:
    """``[setting, value]`` rows of every setting of ``preset`` (its TOML text, one line a row)."""
    rows, table = [], ""
    for line in dump_preset(preset).splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("["):
            table = line + " "
            continue
        key, _, value = line.partition(" = ")
        if key != "note":
            rows.append([table + key.strip('"'), value.strip('"') if value.startswith('"') else value])
    return rows


def preset_section(ctx) -> list:
    """Report builder: the preset's note and settings (nothing when no preset is known)."""
    preset = recorded_preset(ctx.out_dir, ctx.preset)
    if preset is None:
        return []
    recorded = (ctx.out_dir / PRESET_DIR / f"{ctx.preset}.toml").is_file()
    path = f"{ctx.out_dir}/{PRESET_DIR}/{ctx.preset}.toml"
    where = (f"Recorded in `{path}`: `calibkit bench --preset {path} --out {ctx.out_dir}` reruns these runs."
             if recorded else
             f"The shipped preset `{ctx.preset}` (`calibkit preset show {ctx.preset}`).")
    text = (f"{preset.note}\n\n" if preset.note else "") + where
    return [Section(f"Preset {ctx.preset}", text, [Table(["setting", "value"], preset_rows(preset), key_columns=2)],
                    terminal=False)]


def effective_settings(done: list[dict]) -> str:
    """What the finished runs ``done`` were run with, read from the runs themselves (never from the
    preset's note, which describes the preset as written): methods, seeds and epochs, e.g.
    ``"2 methods (ce, ls), 1 seed (0), 3 epochs"``. Epochs that differ by method are given as a range."""
    methods = list(dict.fromkeys(r["method"] for r in done))
    seeds = sorted({r["seed"] for r in done})
    epochs = sorted({e for r in done if (e := _epochs(r.get("config") or {})) is not None})
    if not epochs:
        ep = "epochs not recorded"
    elif len(epochs) == 1:
        ep = f"{epochs[0]} epoch{'s' if epochs[0] != 1 else ''}"
    else:
        ep = f"{epochs[0]}-{epochs[-1]} epochs (by method)"
    return (f"{len(methods)} method{'s' if len(methods) != 1 else ''} ({', '.join(map(str, methods))}), "
            f"{len(seeds)} seed{'s' if len(seeds) != 1 else ''} ({', '.join(map(str, seeds))}), {ep}")


def _epochs(config: dict) -> int | None:
    """The training epochs a run's row records: its method's override, else the preset's ``train``
    settings (a bench's rows, :meth:`calibkit.bench.producers.RunFactory.config_record`), else a flat
    ``epochs`` (a run's own ``config.json``)."""
    for source in (config.get("train_overrides"), config.get("train"), config):
        if isinstance(source, dict) and source.get("epochs") is not None:
            return source["epochs"]
    return None


def note_for_runs(name: str, preset, done: list[dict]) -> str:
    """The preset's note as the report shows it: as written when it describes ``done`` (a preset
    without command-line changes, ``+`` in its name, whose seeds and epochs the runs used), else
    labelled as the description of the preset as written, so that a "2 seeds" in it is not read as a
    fact about runs of one seed (:func:`effective_settings` gives the facts)."""
    note = preset.note if preset is not None else ""
    if not note:
        return ""
    seeds = {r["seed"] for r in done}
    epochs = {e for r in done if (e := (r.get("config") or {}).get("epochs")) is not None}  # unrecorded: unknown
    want = preset.train.get("epochs")  # None: TrainConfig's default, whatever the runs recorded
    same = "+" not in name and seeds == set(preset.seeds) and (want is None or not epochs or epochs == {want})
    return note if same else f"The preset as written (these runs changed its settings, see above): {note}"
