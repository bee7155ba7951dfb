"""The report's preset: which preset the runs were made under, its note, and its settings.

A bench records its effective preset in ``OUT/presets/<name>.toml``
(:func:`calibkit.bench.presetfile.write_effective`); the report reads it back (a shipped preset's
definition is the fallback for directories written before presets were recorded) and shows its
note in the intro and every setting in a "Preset" section, so a reader can rerun exactly these
runs with ``--preset OUT/presets/<name>.toml``.
"""

from __future__ import annotations


def recorded_preset(out_dir, name: str):
    """The effective preset of ``name`` in ``out_dir``, else the shipped one of that name, else None."""
    from calibkit.bench.grid import PRESETS
    from calibkit.bench.presetfile import read_effective

    found = read_effective(out_dir, name)
    return found if found is not None else PRESETS.get(name)


def preset_rows(preset) -> list[list[str]]:
    """``[setting, value]`` rows of every setting of ``preset`` (its TOML text, one line a row)."""
    from calibkit.bench.presetfile import dump_preset

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
    from calibkit.bench.presetfile import PRESET_DIR
    from calibkit.report.render import Section
    from calibkit.report.tables import Table

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
