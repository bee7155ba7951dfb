"""``calibkit preset``: print a preset as a TOML file, or check a preset file without running it."""

from __future__ import annotations

from calibkit.bench.presetcheck import check_preset
from calibkit.bench.presetfile import dump_preset, load_preset


def run(args) -> int:
    preset = load_preset(args.preset)
    if args.action == "show":
        print(dump_preset(preset), end="")
        return 0

    print(check_preset(preset, source=args.preset))
    return 0
