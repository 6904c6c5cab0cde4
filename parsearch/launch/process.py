"""The node agent: starts one node's ranks of a trial, watches them, and always cleans up.

Every backend (local, MPI, Ray) runs trials through this module, so a trial that runs out of
memory, hangs or crashes only ever kills its own processes, never a worker:

* what runs is a trainer kind's :class:`~parsearch.launch.plan.NodePlan` (command,
  environment, files, how the result is concluded); the agent knows no trainer;
* each rank is a process in its own session, so killing its process group also kills
  anything it started. A plan that allows it (the built-in trainer's, unchanged) has its
  ranks forked from a server that has imported the trainer already
  (:mod:`parsearch.launch.prefork`: milliseconds instead of seconds a rank); any other
  command is started as a new program;
* its stdout and stderr go to ``<trial_dir>/rank<N>.log``, never to a pipe that could fill up
  and block it; only a bounded tail of a log is ever read back;
* each node of a trial gets a scratch directory of its own under ``TMPDIR``
  (:attr:`~parsearch.launch.placement.NodePlacement.scratch_dir`), made before its ranks
  start and removed when they end, whatever the outcome: ``PARSEARCH_TRIAL_TMP`` in the
  ranks' environment, ``{trial_tmp}`` in a command template, and the value of every
  variable named in ``PARSEARCH_TRIAL_TMP_VARS`` (the agent's own environment), e.g. a
  library's cache that trials must not share or leave behind (MIOpen's, on Frontier). An
  agent killed with ``kill -9`` leaves it to the next parsearch on the node
  (:mod:`parsearch.tempdirs`);
* ``spec.timeout_s`` is enforced; when one rank fails the others get ``grace_s`` seconds to
  finish or fail on their own (their logs then say why), then are killed, because a rank
  whose peer died may wait in a collective forever;
* a started program's exit is observed with ``waitid(WNOWAIT)``, which leaves it a zombie
  until its process group has been killed, so the group id cannot be reused by an unrelated
  process before we signal it (forked ranks are reaped by their server, which reports).

:class:`NodeRun` is the non-blocking form (``start``/``poll``/``kill``) the backends use;
:func:`run_node` the blocking one, and :func:`run_local` runs every node of a trial on this
machine.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from parsearch.launch.device_memory import device_use
from parsearch.launch.memory import peak_rss, trees
from parsearch.launch.oom import looks_like_oom
from parsearch.launch.placement import NodePlacement
from parsearch.launch.plan import NodePlan
from parsearch.launch.rank_errors import (
    ERROR_FILE_VAR,
    TORCHRUN_LOG_DIR_VAR,
    RankError,
    error_file,
    first_error,
    node_files,
    torchrun_log_dir,
)
from parsearch.launch.rank_site import SITE_DIR
from parsearch.result import TrialResult, TrialState
from parsearch.tempdirs import make_owned
from parsearch.trial import TrialSpec

if TYPE_CHECKING:
    from parsearch.launch.prefork import ForkedRank

# What a rank prints when a *peer* died: it failed as a consequence, not as the cause.
COLLATERAL_MARKERS = (
    "connection reset by peer",
    "connection closed by peer",
    "broken pipe",
    "socket timeout",
    "communicator was aborted",
    "collective operation timeout",
)
# The agent's own measure of a node's peak memory per process (parsearch.launch.memory), in a
# result's metrics; sampled at most this often while the ranks run.
MEASURED_RSS = "measured_peak_rss_bytes"
MEASURED_DEVICE = "measured_peak_device_bytes"  # NVML's view, sampled (device_memory)
MEMORY_SAMPLE_S = 0.25
TAIL_BYTES = 64 * 1024
TAIL_LINES = 200
OK_TAIL_BYTES = 4 * 1024
RENDEZVOUS_ATTEMPTS = 3
# The ranks' variable naming their node's scratch directory for the trial, and the agent's
# variable listing (space- or comma-separated) more variables to set to it.
TRIAL_TMP_VAR = "PARSEARCH_TRIAL_TMP"
TRIAL_TMP_VARS = "PARSEARCH_TRIAL_TMP_VARS"


def free_port(host: str = "") -> int:
    """A TCP port that was free a moment ago (for a rendezvous: bind it soon).

    Drawn at random below the kernel's ephemeral range when it can be: a port the kernel
    handed out itself is soon handed out again to the next outgoing connection (a busy node
    makes thousands for its trials' collectives), and the rendezvous then fails with
    EADDRINUSE."""
    low = _ephemeral_low()
    for _ in range(64):
        port = random.randrange(10000, low) if low > 10000 else 0
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def read_tail(path: Path, max_bytes: int = TAIL_BYTES, max_lines: int = TAIL_LINES) -> str:
    """The last ``max_lines`` lines within the last ``max_bytes`` bytes of a file."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            data = handle.read(max_bytes)
    except OSError:
        return ""
    lines = data.decode("utf-8", errors="replace").splitlines()
    return "\n".join(lines[-max_lines:])


def _collateral(text: str) -> bool:
    lowered = text.lower()
    return any(marker in lowered for marker in COLLATERAL_MARKERS)


def visible_devices_var() -> str:
    """ROCm (``/dev/kfd``, or ROCR_VISIBLE_DEVICES already in use) or CUDA; one of the two
    only, because both filters would apply one after the other."""
    if "ROCR_VISIBLE_DEVICES" in os.environ or Path("/dev/kfd").exists():
        return "ROCR_VISIBLE_DEVICES"
    return "CUDA_VISIBLE_DEVICES"


def _group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is in process group ``pgid`` (via /proc)."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        # Fields after the command name (which may contain spaces) start with the state.
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


class SpawnedRank:
    """A rank started as a new program (``subprocess``), child of this process."""

    def __init__(self, command: list[str], env: dict[str, str], log: Path, cwd: Path) -> None:
        with log.open("wb") as out:
            self._popen = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=True,
            )
        self.pid = self._popen.pid

    def exit_code(self) -> int | None:
        """The exit code (negative: killed by that signal) of the ended rank, without
        reaping it (its pid, hence its process group id, stays ours); ``None`` while it runs."""
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return self._popen.returncode
        if info is None or info.si_pid == 0:
            return None
        if info.si_code == os.CLD_EXITED:
            return info.si_status
        return -info.si_status

    def server_exit(self) -> None:
        """No fork server: a spawned rank's end is its own."""

    def signal(self, sig: int) -> None:
        """Nothing to add to signalling its process group: it was created in its own."""

    def reap(self) -> int:
        return self._popen.wait()


@dataclass
class _Rank:
    rank: int
    pid: int
    log: Path
    process: SpawnedRank | ForkedRank
    exit_code: int | None = None
    peak_rss_bytes: int = 0  # measured: the largest process of its tree (launcher: workers)
    peak_device_bytes: int = 0  # the largest device memory sample of one of its processes


class NodeRun:
    """One node's ranks of one trial, started by :meth:`start` and watched by :meth:`poll`."""

    def __init__(self, placement: NodePlacement, plan: NodePlan) -> None:
        self.placement = placement
        self.plan = plan
        self.spec = placement.spec
        self.node_rank = placement.node_rank
        self.nnodes = placement.nnodes
        # Absolute: forked ranks start in the fork server's directory, not ours.
        self.trial_dir = placement.trial_dir.resolve()
        self.cwd = plan.cwd if plan.cwd is not None else self.trial_dir
        self.command = list(plan.argv)  # a backend may prefix a guard
        self.grace_s = placement.grace_s
        self.ranks: list[_Rank] = []
        self.result: TrialResult | None = None
        self._start = 0.0
        self._first_failure: tuple[float, int] | None = None
        self._sampled_at = -math.inf

    def global_ranks(self) -> range:
        """The ranks of this node's processes (one process per node: the node's rank)."""
        if self.plan.per_node:
            return range(self.node_rank, self.node_rank + 1)
        return self.placement.global_ranks()

    def start(self) -> NodeRun:
        """Write the plan's files and start this node's ranks."""
        world = self.spec.layout.world_size
        if self.nnodes * self.spec.ranks_per_node < world or not self.global_ranks():
            raise ValueError(
                f"node {self.node_rank} of {self.nnodes} has no ranks of a {world}-rank trial "
                f"at {self.spec.ranks_per_node} ranks per node"
            )
        if not self.cwd.is_dir() and self.plan.cwd is not None:
            raise NotADirectoryError(f"{self.plan.cwd_field}: {self.cwd} is not a directory")
        self.trial_dir.mkdir(parents=True, exist_ok=True)
        for name, text in self.plan.files.items():
            path = self.trial_dir / name
            tmp = path.with_name(f".{name}.{os.getpid()}.{self.node_rank}.tmp")
            tmp.write_text(text)
            tmp.replace(path)
        self._clear_error_files()
        make_owned(self.placement.scratch_dir)
        self._start = time.monotonic()
        try:
            self._start_ranks()
        except BaseException:
            if not self.ranks:  # else the caller kills them, which removes the directory
                self._remove_scratch()
            raise
        return self

    def _start_ranks(self) -> None:
        local_ranks = self.global_ranks()
        forked = self.forks_warm()
        for local, rank in enumerate(local_ranks):
            log = self.trial_dir / f"rank{rank}.log"
            env = self.rank_env(rank, local, len(local_ranks))
            if forked:
                from parsearch.launch.prefork import ForkedRank

                process = ForkedRank(self.plan.warm, env, log, self.trial_dir)
            else:
                process = SpawnedRank(self.command, env, log, self.cwd)
            self.ranks.append(_Rank(rank, process.pid, log, process))

    def _clear_error_files(self) -> None:
        """Remove an earlier attempt's error files of this node, make their folder."""
        for path in node_files(self.trial_dir, self.global_ranks(), self.node_rank):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        error_file(self.trial_dir, self.node_rank).parent.mkdir(parents=True, exist_ok=True)

    def first_error(self) -> RankError | None:
        """The first error a process of this node (or a worker of its launcher) recorded
        itself (:mod:`parsearch.launch.rank_errors`)."""
        launcher = None
        if self.plan.per_node:
            launcher = (self.node_rank, self.node_rank * self.spec.ranks_per_node)
        return first_error(self.trial_dir, [r.rank for r in self.ranks], launcher)

    def _remove_scratch(self) -> None:
        shutil.rmtree(self.placement.scratch_dir, ignore_errors=True)

    def forks_warm(self) -> bool:
        """Whether the ranks may be forked warm (:mod:`parsearch.launch.prefork`): the plan
        allows it and its command is unchanged (a backend may prefix a guard)."""
        warm = self.plan.warm
        if warm is None or self.command != list(self.plan.argv):
            return False
        from parsearch.launch import prefork

        return prefork.available(warm.preload)

    def rank_env(self, rank: int, local: int, local_world: int) -> dict[str, str]:
        """The environment of one rank: the plan's, the launcher variables torch, Megatron
        and DeepSpeed read, and its device; then the plan's ``drop_env`` removed. The scratch
        directory's variables come before the plan's, which may set them otherwise."""
        env = dict(os.environ)
        scratch = str(self.placement.scratch_dir)
        for var in re.split(r"[\s,]+", os.environ.get(TRIAL_TMP_VARS, "").strip()):
            if var:
                env[var] = scratch
        env[TRIAL_TMP_VAR] = scratch
        env.update(self.plan.env)
        env.update(self.placement.env)
        env.setdefault("OMP_NUM_THREADS", "1")
        env["PYTHONUNBUFFERED"] = "1"
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(local),
            WORLD_SIZE=str(self.spec.layout.world_size),
            LOCAL_WORLD_SIZE=str(local_world),
            GROUP_RANK=str(self.node_rank),
            NODE_RANK=str(self.node_rank),
            MASTER_ADDR=self.placement.master_addr,
            MASTER_PORT=str(self.placement.master_port),
        )
        # Torch's error file, where the process (a launcher: torchrun's copy of its first
        # failed worker's) records an uncaught exception; torchrun's own per-worker files.
        if ERROR_FILE_VAR not in self.plan.env:
            env[ERROR_FILE_VAR] = str(error_file(self.trial_dir, rank))
        if self.plan.per_node and TORCHRUN_LOG_DIR_VAR not in self.plan.env:
            env[TORCHRUN_LOG_DIR_VAR] = str(torchrun_log_dir(self.trial_dir, self.node_rank))
        # Make the rank's source importable when it runs from the trial directory, and
        # every uncaught exception recorded in the error file (rank_site's sitecustomize).
        package_root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(SITE_DIR), package_root, env.get("PYTHONPATH")])
        )
        if self.plan.bind_devices:
            var = visible_devices_var()
            visible = env.get(var)
            devices = visible.split(",") if visible else None
            env[var] = devices[local % len(devices)] if devices else str(local)
        for var in self.plan.drop_env:
            env.pop(var, None)
        return env

    @property
    def pids(self) -> list[int]:
        return [r.pid for r in self.ranks]

    def poll(self) -> TrialResult | None:
        """The result once every rank has ended (or been killed), else ``None``."""
        if self.result is not None:
            return self.result
        now = time.monotonic()
        if now - self._sampled_at >= MEMORY_SAMPLE_S:
            self._sample_memory()
            self._sampled_at = now
        for rank in self.ranks:
            if rank.exit_code is None:
                rank.exit_code = rank.process.exit_code()
                if rank.exit_code not in (None, 0) and self._first_failure is None:
                    self._first_failure = (now, rank.rank)
        if all(r.exit_code is not None for r in self.ranks):
            return self._finish(None)
        if now - self._start > self.spec.timeout_s:
            return self._finish(TrialState.TIMEOUT)
        if self._first_failure is not None and now - self._first_failure[0] > self.grace_s:
            return self._finish(None)
        return None

    def kill(self) -> TrialResult:
        """Cancel: kill every rank and report the trial as interrupted (if it had not
        already finished)."""
        if self.result is not None:
            return self.result
        return self._finish(TrialState.INTERRUPTED)

    def wait(self, poll_interval_s: float = 0.05) -> TrialResult:
        """Block until :meth:`poll` has a result; an exception here (e.g. Ctrl-C) kills the
        ranks before it propagates."""
        try:
            while (result := self.poll()) is None:
                time.sleep(poll_interval_s)
            return result
        finally:
            if self.result is None:
                self.kill()

    def _sample_memory(self) -> None:
        """Each rank's peak resident set so far (its process and every descendant), and
        the device memory its processes hold (NVML, where there is one)."""
        found = trees(rank.pid for rank in self.ranks)
        peaks, on_devices = peak_rss(found), device_use(found)
        for rank in self.ranks:
            rank.peak_rss_bytes = max(rank.peak_rss_bytes, peaks.get(rank.pid, 0))
            rank.peak_device_bytes = max(rank.peak_device_bytes, on_devices.get(rank.pid, 0))

    def _finish(self, forced: TrialState | None) -> TrialResult:
        """Kill whatever is left, reap every rank, and build the result."""
        still_running = {r.rank for r in self.ranks if r.exit_code is None}
        self._sample_memory()
        self._kill_groups()
        for rank in self.ranks:
            code = rank.process.reap()
            if rank.exit_code is None:
                rank.exit_code = code
        self._remove_scratch()
        result = self._classify(forced, still_running)
        measured = max((rank.peak_rss_bytes for rank in self.ranks), default=0)
        if measured:
            result.metrics[MEASURED_RSS] = measured
        on_device = max((rank.peak_device_bytes for rank in self.ranks), default=0)
        if on_device:
            result.metrics[MEASURED_DEVICE] = on_device
        if self.plan.conclusion is not None:
            result = self.plan.conclusion.conclude(self, result)
        self.result = result
        self.result.hosts = [socket.gethostname()]
        self.result.duration_s = time.monotonic() - self._start
        return self.result

    def _kill_groups(self, term_wait_s: float = 1.0) -> None:
        """SIGTERM each rank's process group, then SIGKILL what is left."""

        def alive() -> list[_Rank]:
            return [r for r in self.ranks if _group_alive(r.pid) or r.process.exit_code() is None]

        for sig, wait_s in ((signal.SIGTERM, term_wait_s), (signal.SIGKILL, 5.0)):
            left = alive()
            for rank in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(rank.pid, sig)
                rank.process.signal(sig)
            deadline = time.monotonic() + wait_s
            while left and time.monotonic() < deadline:
                time.sleep(0.02)
                left = alive()

    def _classify(self, forced: TrialState | None, killed: set[int]) -> TrialResult:
        failed = [r for r in self.ranks if r.rank not in killed and r.exit_code != 0]
        if forced is TrialState.INTERRUPTED:
            return TrialResult(status=forced, error="cancelled")
        tails = {r.rank: read_tail(r.log) for r in self.ranks}
        oom = [r for r in self.ranks if looks_like_oom(tails[r.rank])]
        if forced is TrialState.TIMEOUT and not oom:
            stuck = sorted(killed)
            return TrialResult(
                status=TrialState.TIMEOUT,
                error=f"timed out after {self.spec.timeout_s:g} s; ranks {stuck} still running",
                log_tail=tails[stuck[0]] if stuck else "",
            )
        if oom:
            return TrialResult(
                status=TrialState.OOM,
                error=f"rank {oom[0].rank} ran out of memory",
                log_tail=tails[oom[0].rank],
            )
        if failed and all(_stopped_from_outside(r) for r in failed):
            # Nobody here sent it: the scheduler ending the job (scancel, a requeue, the time
            # limit) signals every process of the job step. Not this layout's outcome: the
            # trial runs again when the campaign continues.
            worst = failed[0]
            return TrialResult(
                status=TrialState.INTERRUPTED,
                error=f"rank {worst.rank} {_describe_rank_exit(worst)}, a signal parsearch "
                "did not send (the job ending?); it runs again when the campaign continues",
                log_tail=tails[worst.rank],
            )
        if failed:
            worst = self._culprit(failed, tails)
            error = f"rank {worst.rank} {_describe_rank_exit(worst)}"
            tail = tails[worst.rank]
            recorded = self.first_error()
            if recorded is not None:
                named = self.plan.per_node or recorded.rank != worst.rank
                error = f"{error}: {recorded.describe(with_rank=named)}"
                tail = _with_callstack(tail, recorded)
            return TrialResult(status=TrialState.ERROR, error=error, log_tail=tail)
        return self._success()

    def _culprit(self, failed: list[_Rank], tails: dict[int, str]) -> _Rank:
        """The rank that failed first for a reason of its own: ranks whose peer died fail
        too, sometimes within the same poll, with a connection error."""
        first = self._first_failure[1] if self._first_failure else failed[0].rank
        ordered = sorted(failed, key=lambda r: r.rank != first)
        causes = [r for r in ordered if not _collateral(tails[r.rank])]
        return (causes or ordered)[0]

    def _success(self) -> TrialResult:
        """Every rank exited 0 (the plan's conclusion reads what they left behind)."""
        tail = read_tail(self.ranks[0].log, OK_TAIL_BYTES)
        return TrialResult(status=TrialState.OK, log_tail=tail)


def _stopped_from_outside(rank: _Rank) -> bool:
    """Whether a rank that ended by itself (the agent had not started killing) was stopped by
    a signal that asks a program to stop (SIGTERM, SIGINT, SIGHUP), directly or through its
    fork server: SIGKILL is the OOM killer's as often as anyone's, and is not counted."""
    server_exit = rank.process.server_exit()
    code = server_exit if server_exit is not None else rank.exit_code
    return code is not None and -code in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _describe_rank_exit(rank: _Rank) -> str:
    """How a rank ended; a forked rank killed because its fork server died says so (its
    SIGKILL is the server's death, not the OOM killer)."""
    server_exit = rank.process.server_exit()
    if server_exit is not None:
        return f"was killed with its fork server, which {_describe_exit(server_exit)}"
    return _describe_exit(rank.exit_code)


def _with_callstack(tail: str, recorded: RankError, max_chars: int = 8192) -> str:
    """The log tail, and after it the failed rank's traceback from its error file when the
    log lacks it (a launcher that shows one rank's output, ``--local-ranks-filter=0``)."""
    stack = recorded.callstack.strip()
    if not stack or stack.splitlines()[-1].strip() in tail:
        return tail
    who = "its" if recorded.rank is None else f"rank {recorded.rank}'s"
    return f"{tail}\n--- {who} traceback, from its error file ---\n{stack[-max_chars:]}"


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else -code
        hint = " (the kernel's OOM killer sends SIGKILL)" if -code == signal.SIGKILL else ""
        return f"was killed by {name}{hint}"
    return f"exited with code {code}"


# Plans a node's processes for a placement: a trainer kind's plan (parsearch.trainers).
Planner = Callable[[NodePlacement], NodePlan]


def run_node(placement: NodePlacement, plan: NodePlan) -> TrialResult:
    """Run this node's ranks of a trial to the end and return the node's result."""
    return NodeRun(placement, plan).start().wait()


def run_together(runs: list[NodeRun]) -> list[TrialResult]:
    """Start every node of one trial and wait until all have ended or one has failed; the
    others are then killed, since a trial whose node failed cannot finish. Each node's
    result, in order."""
    try:
        for run in runs:
            run.start()
        while True:
            results = [run.poll() for run in runs]
            if any(r is not None and not r.ok for r in results) or all(
                r is not None for r in results
            ):
                break
            time.sleep(0.05)
    finally:
        results = [run.kill() for run in runs]
    return results


def run_local(
    spec: TrialSpec,
    planner: Planner,
    trial_dir: Path | None = None,
    env: dict[str, str] | None = None,
) -> TrialResult:
    """Run every node of ``spec`` on this machine (one :class:`NodeRun` each, planned by
    ``planner``, one rendezvous on 127.0.0.1). When one node fails the others are killed.
    Without ``trial_dir`` the logs go to a temporary directory that is removed afterwards
    (the result keeps their tail). A rendezvous port taken in the meantime (EADDRINUSE) is
    retried on another port."""
    for _ in range(RENDEZVOUS_ATTEMPTS):
        result = _run_local_once(spec, planner, trial_dir, env)
        if not _port_was_taken(result):
            break
    return result


def _port_was_taken(result: TrialResult) -> bool:
    return not result.ok and "EADDRINUSE" in result.log_tail


def _run_local_once(
    spec: TrialSpec, planner: Planner, trial_dir: Path | None, env: dict[str, str] | None
) -> TrialResult:
    with contextlib.ExitStack() as stack:
        if trial_dir is None:
            trial_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="parsearch-")))
        port = free_port("127.0.0.1")
        placements = [
            NodePlacement(spec, node, spec.nodes, "127.0.0.1", port, trial_dir, env or {})
            for node in range(spec.nodes)
        ]
        results = run_together([NodeRun(placement, planner(placement)) for placement in placements])
        failed = [r for r in results if not r.ok and r.status is not TrialState.INTERRUPTED]
        return failed[0] if failed else results[0]
