"""Tie a trial's rank processes to the worker that started them.

The node agent starts every rank in a session of its own, so that a failed trial can be
killed as a group without touching the worker. The other side of that: when the worker
itself dies (``kill -9`` of an MPI worker rank, a Ray actor killed or lost), nothing is left
to kill the ranks, and a trial nobody watches keeps the node's devices busy for the rest of
the campaign. The ``mpi`` and ``ray`` backends therefore start each rank through this file,
run as a plain script (``python -S guard.py PARENT_PID COMMAND...``): it asks the kernel to
SIGKILL it when its parent dies (``PR_SET_PDEATHSIG``) and then ``exec``s the rank's
command, which keeps that request and the process id the agent knows. Linux only;
elsewhere the command runs unguarded.

Ranks the agent forks from its warm fork server (the built-in trainer, see
:mod:`parsearch.launch.prefork`) need no guard: they die with the server, which exits with
this process; guarding them would only cost them the warm start.

It costs one more interpreter start per spawned rank, so as a script it imports nothing
beyond ``os`` and ``sys`` (``typing`` alone took 10-60 ms here). A rank's own children are
not covered (a launcher such as ``torchrun`` that is SIGKILLed leaves its workers).
"""

from __future__ import annotations

import os
import sys

if __name__ != "__main__":  # as a module only: the script must start fast
    from parsearch.launch.process import NodeRun

PR_SET_PDEATHSIG = 1
SIGKILL = 9  # not signal.SIGKILL: importing signal imports enum


def guarded(run: NodeRun) -> NodeRun:
    """``run``, with ranks that die with this process (a driver or a worker, which must
    outlive its ranks' start-up: never a short-lived thread); call before ``run.start()``.

    Only the command's prefix changes, so the agent's handling of a custom command (the
    command trainer) is unaffected."""
    if not run.forks_builtin_trainer():
        guard = [sys.executable, "-S", os.path.abspath(__file__), str(os.getpid())]
        run.command = guard + run.command
    return run


def _exec_guarded(parent: int, command: list[str]) -> None:
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the worker died before the request took effect
            os._exit(128 + SIGKILL)
    os.execvp(command[0], command)


if __name__ == "__main__":
    _exec_guarded(int(sys.argv[1]), sys.argv[2:])
