"""``calibkit preset``: print a preset as a TOML file, or check a preset file without running it."""

from __future__ import annotations

import argparse

EPILOG = """\
examples:
  calibkit preset show default > mine.toml          # a starting point: edit, then
  calibkit preset check mine.toml                   # every name and value checked, nothing run
  calibkit bench --preset mine.toml --out runs/mine

The format (tables [train], [losses], [train_by_method.<m>], [maccal], [csm], [space.<m>]):
docs/own_data.md.
"""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "preset", help="print a preset as TOML (show) or validate a preset file (check)",
        description="Preset files for calibkit bench, tune and report (--preset FILE).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    s = sub.add_parser("show", help="print a shipped preset (or a preset file, normalised) as TOML")
    s.add_argument("preset", metavar="NAME|FILE")
    c = sub.add_parser("check", help="validate a preset file (names, types, values) without running anything")
    c.add_argument("preset", metavar="NAME|FILE")
    p.set_defaults(func=run)


def run(args) -> int:
    from calibkit.bench.presetfile import dump_preset, load_preset

    preset = load_preset(args.preset)
    if args.action == "show":
        print(dump_preset(preset), end="")
        return 0
    from calibkit.bench.presetcheck import check_preset

    print(check_preset(preset, source=args.preset))
    return 0
