"""The ``parsearch`` command line: one sub-command per module in :mod:`parsearch.commands`.

Every :class:`~parsearch.errors.ParsearchError` is printed as one paragraph, without a
traceback, and sets the exit code (2 for bad input).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from parsearch.commands import COMMANDS
from parsearch.errors import ParsearchError
from parsearch.version import __version__


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser, with the full sub-parser of ``command`` only (``None``: all of them).

    The other sub-commands get their name and help alone, so that ``parsearch --help`` and
    every run import one command module, not eight and their dependencies.
    """
    parser = argparse.ArgumentParser(
        prog="parsearch",
        description="Search the fastest parallel layout (TP x PP x DP x micro-batch) for "
        "training a large language model on a cluster allocation.",
    )
    parser.add_argument("--version", action="version", version=f"parsearch {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        if command is None or name == command:
            importlib.import_module(f"parsearch.commands.{name}").register(subparsers)
        else:
            subparsers.add_parser(name, help=help_text)
    return parser


def _command_of(argv: Sequence[str]) -> str:
    """The sub-command ``argv`` names (its first word that is not an option), or ``""``."""
    first = next((word for word in argv if not word.startswith("-")), "")
    return first if first in COMMANDS else ""


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_command_of(argv))
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ParsearchError as error:
        print(f"parsearch {args.command}: error: {error}", file=sys.stderr)
        for note in getattr(error, "__notes__", ()):  # what was kept, how to go on
            print(f"  {note}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print(f"parsearch {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
