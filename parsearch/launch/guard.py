"""Makes a spawned rank, and everything it starts, die with the process that started it.

When the process watching a trial dies without cleaning up (``kill -9`` of the driver or
of an MPI worker rank, a Ray actor killed or lost), nothing is left to kill the ranks, and a
trial nobody watches keeps the node's devices busy for the rest of the campaign. Launchers
make it worse: ``torchrun`` starts its workers in sessions of their own, and a program may
daemonise, so killing the rank's process group does not reach them. The ``local``, ``mpi``
and ``ray`` backends therefore start each rank through this file, run as a plain script
(``python -S guard.py PARENT_PID COMMAND...``), which stays between the watcher and the
command as a small supervisor:

* it is a *child subreaper* (``PR_SET_CHILD_SUBREAPER``): a descendant whose parent exits
  (a double fork, a daemon) is re-parented to the guard, not to init, so every process the
  command ever started stays in the guard's process tree, whatever sessions it made;
* it asks the kernel for SIGTERM when its parent dies (``PR_SET_PDEATHSIG``), and the
  command for SIGKILL when the guard dies; the command's children that are Python programs
  (torchrun's and deepspeed's workers) ask for SIGKILL when the command dies
  (:mod:`parsearch.launch.rank_site`), so a guard killed with ``kill -9`` still takes
  every rank with it;
* its command line does not name this file (:func:`guard_argv`), so ``pkill -f parsearch``
  meant for the driver does not kill it before it can clean up;
* on SIGTERM, SIGINT or SIGHUP (the agent's kill, or the parent's death) it passes the
  signal to every descendant, gives them ``GRACE_S`` to exit, SIGKILLs the rest, and exits
  by the same signal;
* it ignores SIGUSR1, and so does the command it starts (ignoring survives ``exec``): Slurm's
  warning before the time limit reaches every process of the job step, and it is the
  driver's cue to drain, not the ranks' to die;
* when the command ends, it kills whatever the command left behind the same way, then exits
  with the command's status (killed by a signal: by that signal), so the agent sees the
  command's own exit.

Linux only; elsewhere the command runs unguarded (``exec``). Ranks the agent forks from its
warm fork server (a plan's warm start, see :mod:`parsearch.launch.prefork`) need no guard:
they die with the server, which exits with this process; guarding them would only cost them
the warm start.

It costs one more interpreter start per spawned rank, so as a script it imports nothing
beyond built-in modules (``typing`` alone took 10-60 ms here; ``_signal`` is ``signal``
without its enums).
"""

from __future__ import annotations

import os
import sys
import time

if __name__ != "__main__":  # as a module only: the script must start fast
    from parsearch.launch.process import NodeRun

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
GRACE_S = 0.5  # under the agent's 1 s between SIGTERM and SIGKILL of the rank's group
SIGKILL = 9  # not signal.SIGKILL: importing signal imports enum
SIGTERM = 15
STOP_SIGNALS = (1, 2, 15)  # SIGHUP, SIGINT, SIGTERM
# The guarded command's pid, in its environment (see rank_site's sitecustomize).
LAUNCHER_PID_VAR = "PARSEARCH_GUARDED_PID"
# The scheduler's warning before the time limit (SIGUSR1) is for the driver, which drains;
# srun delivers it to every process of the step, so the guard and its command ignore it.
SIGUSR1 = 10


def guard_argv(parent: int) -> list[str]:
    """The guard's command line, without this file's path in it: ``pkill -f parsearch``
    meant for the driver must not kill the guard first and leave its ranks unwatched. The
    source is loaded from its path spelt in hex (``-I``: nothing from the rank's directory
    or environment can shadow the modules it imports)."""
    path = os.path.abspath(__file__).encode().hex()
    boot = f"exec(compile(open(bytes.fromhex('{path}')).read(), 'rank-guard', 'exec'))"
    return [sys.executable, "-I", "-S", "-c", boot, str(parent)]


def guarded(run: NodeRun) -> NodeRun:
    """``run``, with ranks that die with this process (a driver or a worker, which must
    outlive its ranks' start-up: never a short-lived thread); call before ``run.start()``.

    Only the command's prefix changes, so the plan's handling of its command is
    unaffected."""
    if not run.forks_warm():
        run.command = guard_argv(os.getpid()) + run.command
    return run


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` in the process tree (via /proc), parents first."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        # Fields after the command name (which may contain spaces): state, ppid, ...
        fields = stat.rsplit(b")", 1)[1].split()
        if fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(name))
    found: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


class _Stop(Exception):
    """A stop signal arrived; raised from the handler to leave the wait."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:  # noqa: SIM105 (contextlib is one more import at every rank's start)
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def _reap(command_pid: int, status: int | None) -> int | None:
    """Reap every ended child (orphans come to us); the command's status once seen."""
    while True:
        try:
            pid, code = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return status
        if pid == 0:
            return status
        if pid == command_pid:
            status = code


def _end_descendants(
    signum: int, grace_s: float, command_pid: int, status: int | None
) -> int | None:
    """``signum`` to every descendant, ``grace_s`` for them to exit, SIGKILL for the rest
    (again until none is left: one may fork meanwhile); the command's status if it ended."""
    me = os.getpid()
    _signal_all(descendants(me), signum)
    deadline = time.monotonic() + grace_s
    while True:
        status = _reap(command_pid, status)
        left = descendants(me)
        if not left:  # those that ended since the reap are zombies, ours to reap too
            return _reap(command_pid, status)
        if time.monotonic() >= deadline:
            _signal_all(left, SIGKILL)
        time.sleep(0.01)


def _exit_like(status: int) -> None:
    """Exit as the command did: its exit code, or the signal that killed it."""
    if os.WIFSIGNALED(status):
        import _signal

        signum = os.WTERMSIG(status)
        if signum != SIGKILL:
            _signal.signal(signum, _signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def _supervise(parent: int, command: list[str]) -> None:
    import _signal
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    _signal.signal(SIGUSR1, _signal.SIG_IGN)  # inherited by the command through exec

    def stop(signum: int, _frame: object) -> None:
        for sig in STOP_SIGNALS:  # one stop at a time: the clean-up must not be cut short
            _signal.signal(sig, _signal.SIG_IGN)
        raise _Stop(signum)

    # Held back until the command runs: a stop must find something to stop, and the child
    # must not run this process's handler between fork and exec.
    _signal.pthread_sigmask(_signal.SIG_BLOCK, STOP_SIGNALS)
    for sig in STOP_SIGNALS:
        _signal.signal(sig, stop)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    libc.prctl(PR_SET_PDEATHSIG, SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the watcher died before the request took effect
        os._exit(128 + SIGTERM)
    command_pid = os.fork()
    if command_pid == 0:
        for sig in STOP_SIGNALS:
            _signal.signal(sig, _signal.SIG_DFL)
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, STOP_SIGNALS)
        libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)
        # The command's own children (torchrun's workers) ask for SIGKILL when it dies,
        # in rank_site's sitecustomize: a guard killed anyway takes the whole tree along.
        os.environ[LAUNCHER_PID_VAR] = str(os.getpid())
        try:
            os.execvp(command[0], command)
        except OSError as error:
            os.write(2, f"parsearch guard: cannot run {command[0]!r}: {error}\n".encode())
        os._exit(127)
    status: int | None = None
    try:
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, STOP_SIGNALS)
        while status is None:
            pid, code = os.waitpid(-1, 0)
            if pid == command_pid:
                status = code
        status = _end_descendants(SIGTERM, GRACE_S, command_pid, status)
    except _Stop as received:
        _end_descendants(received.signum, GRACE_S, command_pid, status)
        _exit_like(received.signum)  # a raw wait status of "killed by signum"
    assert status is not None
    _exit_like(status)


if __name__ == "__main__":
    if sys.platform.startswith("linux"):
        _supervise(int(sys.argv[1]), sys.argv[2:])
    else:
        os.execvp(sys.argv[2], sys.argv[2:])
