"""Tie a trial's rank processes to the worker that started them.

The node agent starts every rank in a session of its own, so that a failed trial can be
killed as a group without touching the worker. The other side of that: when the worker
itself dies (``kill -9`` of an MPI worker rank, a Ray actor killed or lost), nothing is left
to kill the ranks, and a trial nobody watches keeps the node's devices busy for the rest of
the campaign. The ``mpi`` and ``ray`` backends therefore start each rank through this file,
run as a plain script (``python -S guard.py PARENT_PID COMMAND...``, fast: no site, no
package import): it asks the kernel to SIGKILL it when its parent dies
(``PR_SET_PDEATHSIG``) and then ``exec``s the rank's command, which keeps that request and
the process id the agent knows. Linux only; elsewhere the command runs unguarded.

A rank's own children are not covered (a launcher such as ``torchrun`` that is SIGKILLed
leaves its workers); the built-in trainer starts none.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from parsearch.agent import NodeRun

PR_SET_PDEATHSIG = 1


def guarded(run: NodeRun) -> NodeRun:
    """``run`` with every rank started through the guard; call before ``run.start()``.

    Only the command's prefix changes, so the agent's handling of a custom command (the
    command trainer) is unaffected. The parent is this process, which must outlive its
    ranks' start-up: the driver or a worker, never a short-lived thread."""
    prefix = [sys.executable, "-S", str(Path(__file__).resolve()), str(os.getpid())]
    run.command = prefix + run.command
    return run


def _exec_guarded(parent: int, command: list[str]) -> None:
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the worker died before the request took effect
            os._exit(128 + int(signal.SIGKILL))
    os.execvp(command[0], command)


if __name__ == "__main__":
    _exec_guarded(int(sys.argv[1]), sys.argv[2:])
