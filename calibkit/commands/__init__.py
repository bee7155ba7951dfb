"""The subcommands of the ``calibkit`` command line (one module each; see ``calibkit.cli``)."""

from __future__ import annotations


def add_num_threads(parser) -> None:
    """Declare ``--num-threads N`` on a subcommand's parser (``calibkit.cli.main`` applies it)."""
    parser.add_argument("--num-threads", type=int, metavar="N",
                        help="torch CPU threads (default: torch's; one is often fastest on a shared machine)")


def apply_num_threads(args) -> None:
    """``torch.set_num_threads(args.num_threads)`` when the command declared and was given it.

    Raises:
        ValueError: a thread count below 1.
    """
    threads = getattr(args, "num_threads", None)
    if threads is None:
        return
    if threads < 1:
        raise ValueError(f"--num-threads must be >= 1, got {threads}")
    import torch

    torch.set_num_threads(threads)
