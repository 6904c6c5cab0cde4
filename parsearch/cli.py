"""The ``parsearch`` command line: one sub-command per module in :mod:`parsearch.commands`.

Every :class:`~parsearch.errors.ParsearchError` is printed as one paragraph, without a
traceback, and sets the exit code (2 for bad input).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from parsearch import __version__
from parsearch.errors import ParsearchError

# Each module defines ``register(subparsers)``, which adds its parser and sets ``func``.
COMMAND_MODULES: tuple[str, ...] = (
    "plan",
    "run",
    "resume",
    "status",
    "best",
    "top",
    "show",
    "trial",
    "export",
    "report",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="parsearch",
        description="Search the fastest parallel layout (TP x PP x DP x micro-batch) for "
        "training a large language model on a cluster allocation.",
    )
    parser.add_argument("--version", action="version", version=f"parsearch {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"parsearch.commands.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ParsearchError as error:
        print(f"parsearch {args.command}: error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print(f"parsearch {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
