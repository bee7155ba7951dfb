"""The parsers of the subcommands, one module each (``calibkit.cli.COMMANDS``): options, help and the
:class:`calibkit.commands.Handler` that runs the command. They import only light modules, so that
``calibkit --help`` and every ``calibkit CMD --help`` load no torch (``tests/test_imports.py``)."""
