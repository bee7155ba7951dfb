"""The ``calibkit preset`` command line: its options and help (light: ``calibkit preset --help`` loads no
torch); the command runs in :mod:`calibkit.commands.preset`."""

from __future__ import annotations

import argparse

from calibkit.commands import Handler

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
    p.set_defaults(func=Handler("calibkit.commands.preset"))

