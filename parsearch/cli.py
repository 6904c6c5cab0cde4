"""The ``parsearch`` command line: one sub-command per module in :mod:`parsearch.commands`.

Every :class:`~parsearch.errors.ParsearchError` is printed as one paragraph, without a
traceback, and sets the exit code (2 for bad input). A reader that stops reading
(``parsearch plan ... | head``) ends the command quietly with 141, as SIGPIPE ends a C tool.
"""

from __future__ import annotations

import argparse
import importlib
import os
import select
import sys
from collections.abc import Sequence

from parsearch.commands import COMMANDS
from parsearch.errors import ParsearchError, UsageError
from parsearch.sanitize import shown
from parsearch.version import __version__

# 128 + SIGPIPE: what a shell reports for a tool its pipe's reader stopped.
BROKEN_PIPE_EXIT = 141


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


def _open_standard_streams() -> None:
    """Point a closed stdin, stdout or stderr (``parsearch run ... >&-``) at /dev/null.

    Left closed, the next file opened takes its descriptor, and whatever is printed lands in
    it (the store's database, a trial's log), while Python has no ``sys.stdout`` to print to
    at all. With /dev/null what is printed is dropped and the command runs as it would.
    """
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, mode, closefd=False))  # noqa: SIM115


def main(argv: Sequence[str] | None = None) -> int:
    _open_standard_streams()
    argv = sys.argv[1:] if argv is None else list(argv)
    if _command_of(argv) in ("run", "resume"):
        from parsearch.campaign.signals import early_stops_held

        with early_stops_held():  # from before the imports that take seconds
            return _run(argv)
    return _run(argv)


def _run(argv: list[str]) -> int:
    parser = build_parser(_command_of(argv))
    try:
        args = parser.parse_args(argv)  # --help prints too
        _require_working_directory()
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at interpreter exit
        return code
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise  # another pipe (a subprocess's, a socket's): a real failure
        _silence_stdout()
        return BROKEN_PIPE_EXIT
    except ParsearchError as error:
        # shown(): a message may quote a trainer's words or a file's bytes (no escapes pass).
        print(f"parsearch {args.command}: error: {shown(str(error))}", file=sys.stderr)
        for note in getattr(error, "__notes__", ()):  # what was kept, how to go on
            print(f"  {shown(str(note))}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print(f"parsearch {args.command}: interrupted", file=sys.stderr)
        return 130


def _require_working_directory() -> None:
    """Refuse to start in a working directory that was deleted: relative paths (``--store
    a.db``), ``{launch_dir}`` and the trials' directories would all fail part-way."""
    try:
        os.getcwd()
    except OSError as error:
        raise UsageError(
            f"the current working directory cannot be read ({error.strerror}: it was deleted "
            "or its permissions changed); cd to an existing directory and run again"
        ) from None


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe nobody reads any more (``poll`` reports an error on it)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no fd (a test's capture), no poll
        return False


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the flush at interpreter exit does not raise again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
