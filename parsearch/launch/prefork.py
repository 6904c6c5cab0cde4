"""Warm start of a node's ranks: fork them from a server that has already imported what
they import (torch, for the built-in trainer).

Importing torch and its distributed libraries costs a rank 2-3 s of CPU, which on a small
node is most of a short trial (four ranks on two cores: over 5 s). When a plan allows it
(:class:`~parsearch.launch.plan.WarmStart`: the modules to preload and the entry function
by name), the node agent therefore starts the ranks through a fork server, one per agent
process and set of preloaded modules, that has imported them once. Each rank is a fork of
it (milliseconds) that then calls the entry function, behaving exactly as the plan's
command started by the agent: its own session (the agent kills its process group), stdout
and stderr to its log file, the agent's environment, the trial directory as working
directory.

Lifetime: the server is supervised from its first instruction. Before it imports anything
heavy (torch takes seconds) it asks the kernel for SIGKILL when the agent's process ends
(``PR_SET_PDEATHSIG``), then checks that its parent is still that process (it may have died
before the request took effect); the thread that starts the server is the one that reads its
replies, which lives as long as the server (the kernel sends the signal when the thread that
forked the server ends, not the process). Every rank it forks asks the same of the server, so
a driver or worker killed at any moment, start-up included, takes the server and its ranks
with it. The agent's end of the server's stdin closing also ends the server at once
(``os._exit``, no interpreter clean-up: 9-11 s with torch loaded), as does a reply it can no
longer write. The server reaps its ranks and reports each exit code.

Protocol (one JSON object per line): the server announces ``{"ready"}`` (false if CUDA got
initialised while importing: the agent then starts ranks as new programs); request
``{"id", "env", "log", "cwd", "entry", "args"}``, replies ``{"id", "pid"}`` when forked and
``{"pid", "exit"}`` when a rank has ended.

CUDA is never initialised in the server (importing torch does not), so forked ranks may use
GPUs. Commands without a warm start (the command trainer, guarded commands) are never
forked.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import ClassVar

from parsearch.launch.plan import WarmStart

PR_SET_PDEATHSIG = 1
KILLED_WITH_SERVER = -int(signal.SIGKILL)
# The server's program, run with ``python -c``: its first instructions, before the import of
# parsearch and of the preloaded modules, make it die with the agent's process (argv[1]). A
# module would import parsearch's package first; ctypes and os are all this needs.
BOOTSTRAP = (
    "import ctypes, os, sys\n"
    f"ctypes.CDLL(None).prctl({PR_SET_PDEATHSIG}, {int(signal.SIGKILL)}, 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]):\n"  # the agent died before the request took effect
    f"    os._exit({128 + int(signal.SIGKILL)})\n"
    "from parsearch.launch.prefork import serve\n"
    "serve(sys.argv[2:])\n"
)


def available(preload: tuple[str, ...]) -> bool:
    """Whether ranks can be forked: on Linux (``fork``, ``PR_SET_PDEATHSIG``), from a
    server that imported ``preload`` without initialising CUDA (a CUDA context does not
    survive a fork). Starts the server if needed and waits for it to be ready."""
    return sys.platform.startswith("linux") and ForkServer.get(preload).ready()


class ForkServer:
    """The agent's side: starts the server on first use, sends requests, and a reader
    thread collects the pids and exit codes it reports."""

    _instances: ClassVar[dict[tuple[str, ...], ForkServer]] = {}
    _instance_lock = threading.Lock()

    @classmethod
    def get(cls, preload: tuple[str, ...]) -> ForkServer:
        """This process's server preloading ``preload``, started (again, if the last one
        died) on demand."""
        with cls._instance_lock:
            server = cls._instances.get(preload)
            if server is None or server.dead:
                server = cls._instances[preload] = cls(preload)
            return server

    def __init__(self, preload: tuple[str, ...]) -> None:
        self._changed = threading.Condition()
        self._pids: dict[int, int] = {}
        self._exits: dict[int, int] = {}
        self._next_id = 0
        self._usable: bool | None = None
        self.dead = False
        started: Future[subprocess.Popen[str]] = Future()
        threading.Thread(
            target=self._start_and_read,
            args=(preload, started),
            name="parsearch-fork-server",
            daemon=True,
        ).start()
        self._process = started.result()  # or raises what Popen raised

    def ready(self) -> bool:
        """Wait until the server has imported the trainer; whether it can fork ranks."""
        with self._changed:
            while self._usable is None and not self.dead:
                self._changed.wait()
            return bool(self._usable) and not self.dead

    def fork(self, warm: WarmStart, env: dict[str, str], log: Path, cwd: Path) -> int:
        """Fork a rank that calls ``warm.entry``; its pid."""
        with self._changed:
            request_id = self._next_id
            self._next_id += 1
            request = {"id": request_id, "env": env, "log": str(log), "cwd": str(cwd)}
            request |= {"entry": warm.entry, "args": list(warm.args)}
            self._process.stdin.write(json.dumps(request) + "\n")
            self._process.stdin.flush()
            while request_id not in self._pids:
                if self.dead:
                    raise OSError("the fork server died")
                self._changed.wait()
            return self._pids.pop(request_id)

    def exit_code(self, pid: int) -> int | None:
        """A rank's reported exit code; ``None`` while it runs (if the server died, every
        rank it had not reported was killed with it)."""
        with self._changed:
            if pid in self._exits:
                return self._exits[pid]
            return KILLED_WITH_SERVER if self.dead else None

    def server_exit(self) -> int | None:
        """The server's own exit code once it is gone (negative: killed by that signal)."""
        return self._process.returncode if self.dead else None

    def wait(self, pid: int) -> int:
        with self._changed:
            while pid not in self._exits and not self.dead:
                self._changed.wait()
            return self._exits.pop(pid, KILLED_WITH_SERVER)

    def _start_and_read(
        self, preload: tuple[str, ...], started: Future[subprocess.Popen[str]]
    ) -> None:
        """Start the server, then read its replies until it is gone.

        In this thread, which outlives the server: the kernel sends the server its
        parent-death signal when the thread that forked it ends, not the process, and an
        agent's caller may be a short-lived thread."""
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        # torch.cuda.is_available() through NVML, without creating a CUDA context.
        env["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
        try:
            process = subprocess.Popen(
                [sys.executable, "-c", BOOTSTRAP, str(os.getpid()), *preload],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                text=True,
                start_new_session=True,
            )
        except Exception as error:  # the caller's to handle, as if it had started the server
            started.set_exception(error)
            return
        started.set_result(process)
        self._read(process)

    def _read(self, process: subprocess.Popen[str]) -> None:
        for line in process.stdout:
            message = json.loads(line)
            with self._changed:
                if "ready" in message:
                    self._usable = message["ready"]
                elif "exit" in message:
                    self._exits[message["pid"]] = message["exit"]
                else:
                    self._pids[message["id"]] = message["pid"]
                self._changed.notify_all()
        process.wait()
        with self._changed:  # the server is gone, and its ranks with it
            self.dead = True
            self._changed.notify_all()


class ForkedRank:
    """A rank forked by the server; the same small interface as the agent's spawned ranks."""

    def __init__(self, warm: WarmStart, env: dict[str, str], log: Path, cwd: Path) -> None:
        self._server = ForkServer.get(warm.preload)
        self.pid = self._server.fork(warm, env, log, cwd)
        self._code: int | None = None

    def exit_code(self) -> int | None:
        """The exit code (negative: killed by that signal), ``None`` while it runs."""
        if self._code is None:
            self._code = self._server.exit_code(self.pid)
        return self._code

    def server_exit(self) -> int | None:
        """The fork server's exit code when the server died, which took this rank with it."""
        if self._code != KILLED_WITH_SERVER:
            return None
        return self._server.server_exit()

    def signal(self, sig: int) -> None:
        """Signal the rank itself: it may not have made its own process group yet."""
        if self.exit_code() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def reap(self) -> int:
        if self._code is None:
            self._code = self._server.wait(self.pid)
        return self._code


def serve(preload: list[str]) -> None:
    """The server: import ``preload``, then fork a rank per request until stdin closes.

    Requests are read from the file descriptor with ``select`` and our own line buffer (a
    buffered reader could hold a second request while ``select`` waits for more bytes).

    The scheduler's warning before the time limit (SIGUSR1) is for the driver alone, but
    ``srun`` delivers it to every process of the step: the server and the ranks it forks
    ignore it (first, before the imports that take seconds), so a drain lets them finish.

    A reply that cannot be written (the agent's end of the pipe is gone) ends the server as
    end-of-file does, at once and silently: its stderr is the agent's log, where a
    BrokenPipeError traceback would only stand for an agent that ended."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    try:
        _serve(preload)
    except BrokenPipeError:
        os._exit(0)


def _serve(preload: list[str]) -> None:
    for module in preload:
        importlib.import_module(module)
    torch = sys.modules.get("torch")  # imported by a preloaded module, or not at all
    ready = torch is None or not torch.cuda.is_initialized()
    replies = sys.stdout
    replies.write(json.dumps({"ready": ready}) + "\n")
    replies.flush()
    pending = b""
    while True:
        _report_exits(replies)
        if b"\n" not in pending:
            ready, _, _ = select.select([0], [], [], 0.05)
            if ready:
                chunk = os.read(0, 1 << 16)
                if not chunk:  # the agent's process is gone: exit, the ranks die with us
                    # At once: finalising an interpreter that imported torch took 9-11 s
                    # (measured, 2 cores busy with the ranks), which the ranks outlived.
                    os._exit(0)
                pending += chunk
            continue
        line, pending = pending.split(b"\n", 1)
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            try:
                _run_rank(request)  # leaves through os._exit
            finally:
                os._exit(1)  # the child must never return to the server's loop
        replies.write(json.dumps({"id": request["id"], "pid": pid}) + "\n")
        replies.flush()


def _report_exits(replies) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        replies.write(json.dumps({"pid": pid, "exit": os.waitstatus_to_exitcode(status)}) + "\n")
        replies.flush()


def _run_rank(request: dict) -> None:
    """In the forked child: become the plan's command (its entry function), as the agent
    starts it."""
    server = os.getppid()
    os.setsid()
    _die_with_parent()
    if os.getppid() != server:  # the server died before the request took effect
        os._exit(128 + int(signal.SIGKILL))
    out = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    devnull = os.open(os.devnull, os.O_RDONLY)
    for source, target in ((devnull, 0), (out, 1), (out, 2)):
        os.dup2(source, target)
    os.close(out)
    os.close(devnull)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    module, function = request["entry"].split(":")
    getattr(importlib.import_module(module), function)(request["args"])


def _die_with_parent() -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
