"""Warm start of the built-in trainer's ranks: fork them from a server that has already
imported torch.

Importing torch and its distributed libraries costs a rank 2-3 s of CPU, which on a small
node is most of a short trial (four ranks on two cores: over 5 s). The node agent therefore
starts the built-in trainer's ranks through :mod:`multiprocessing`'s fork server, preloaded
with the trainer: the server pays the imports once per agent process, each rank is a fork
of it (milliseconds), then behaves exactly as ``python -m parsearch.bench``: its own session
(so the agent can kill its process group), stdout and stderr to its log file, the agent's
environment, the trial directory as working directory. It asks to be SIGKILLed if the fork
server dies, and the server exits when the process that started it does, so a worker that
dies takes its trial's ranks with it.

CUDA is never initialised in the server (importing torch does not), so forked ranks may use
GPUs. Custom commands (the command trainer, guarded commands) are never forked.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import signal
import sys
from multiprocessing.context import BaseContext
from pathlib import Path

PRELOAD = (
    "parsearch.bench.__main__",
    "parsearch.bench.trainer",
    "torch.distributed._tools.mem_tracker",
)
PR_SET_PDEATHSIG = 1


@functools.cache
def _context() -> BaseContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))
    return context


def available() -> bool:
    """Forking needs Linux (``PR_SET_PDEATHSIG``, ``/proc``) and the fork server."""
    return (
        sys.platform.startswith("linux") and "forkserver" in multiprocessing.get_all_start_methods()
    )


class ForkedRank:
    """A rank forked by the server; the same small interface as the agent's spawned ranks."""

    def __init__(self, env: dict[str, str], log: Path, cwd: Path, argv: list[str]) -> None:
        self._process = _context().Process(
            target=_run_rank, args=(env, str(log), str(cwd), argv), daemon=True
        )
        self._process.start()
        self.pid: int = self._process.pid

    def exit_code(self) -> int | None:
        """The exit code (negative: killed by that signal), ``None`` while it runs."""
        return self._process.exitcode

    def signal(self, sig: int) -> None:
        """Signal the rank itself: it may not have made its own process group yet."""
        if self._process.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def reap(self) -> int:
        """Wait for the exit (the server reaps the process) and free the handle."""
        self._process.join()
        code = self._process.exitcode
        self._process.close()
        return code


def _run_rank(env: dict[str, str], log: str, cwd: str, argv: list[str]) -> None:
    """The forked rank: become ``python -m parsearch.bench`` as the agent would start it."""
    server = os.getppid()
    os.setsid()
    _die_with_parent()
    if os.getppid() != server:  # the server died before the request took effect
        os._exit(128 + int(signal.SIGKILL))
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    sys.stdout.reconfigure(line_buffering=True)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    from parsearch.bench.__main__ import main

    raise SystemExit(main(argv))


def _die_with_parent() -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
