"""``mpi``: one mpi4py rank per node of the allocation; rank 0 drives, the others work.

:func:`serve_if_worker` turns ranks >= 1 into workers before the store is opened (only rank
0 touches it); :func:`create` makes rank 0's backend. How nodes, trials, lost nodes, exit and
hydra's signals are handled, and the ``--backend-opt`` options: docs/guide/cluster.md, "The mpi
backend in detail".
"""

from __future__ import annotations

import atexit
import math
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parsearch.backends import Finished, check_options, positive_option
from parsearch.backends.mpi_worker import (
    BEAT_TAG,
    BYE,
    BYE_WAIT_S,
    CANCEL,
    CANCELLED,
    DONE,
    EXIT,
    HELLO,
    PING,
    POLL_S,
    RUN,
    STARTED,
    WELCOME,
    Mailbox,
    WorkerSettings,
    discard_unreceived,
    hydra_proxies,
    launched_by_hydra,
    serve,
    world,
)
from parsearch.errors import BackendError
from parsearch.launch.node import NodeDone, NodeOrder, NodeSlot, NodeStarted
from parsearch.result import TrialResult, TrialState
from parsearch.trial import TrialSpec
from parsearch.trial_kinds import merge_results, node_run

if TYPE_CHECKING:
    from parsearch.space import SearchSpace

OPTIONS = ("workdir", "grace", "driver_worker", "heartbeat", "lost_after", "driver_timeout")
HELLO_TIMEOUT_S = 60.0
# How long a worker's exit may take before hydra's notice of it (see release_workers): it
# came 0.08-0.14 s after the goodbye here, idle or beside 2 busy processes.
EXIT_NOTICE_WAIT_S = 10.0

_released = False  # rank 0 told the workers to exit (they serve one backend per job)


@dataclass(frozen=True)
class MPISettings:
    """The backend's options, validated."""

    workdir: Path | None = None
    grace_s: float = 3.0
    driver_worker: str = "auto"
    heartbeat_s: float = 1.0
    lost_after_s: float = 30.0
    driver_timeout_s: float = 300.0

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> MPISettings:
        check_options("mpi", options, OPTIONS)
        driver_worker = options.get("driver_worker", "auto")
        if driver_worker not in ("auto", "yes", "no"):
            raise BackendError(
                f"mpi option driver_worker must be auto, yes or no, got {driver_worker!r}"
            )
        workdir = (
            Path(options["workdir"]).expanduser().resolve() if options.get("workdir") else None
        )
        settings = cls(
            workdir=workdir,
            grace_s=positive_option("mpi", options, "grace", 3.0, "seconds"),
            driver_worker=driver_worker,
            heartbeat_s=positive_option("mpi", options, "heartbeat", 1.0, "seconds"),
            lost_after_s=positive_option("mpi", options, "lost_after", 30.0, "seconds"),
            driver_timeout_s=positive_option("mpi", options, "driver_timeout", 300.0, "seconds"),
        )
        if settings.lost_after_s < 3 * settings.heartbeat_s:
            raise BackendError(
                f"mpi option lost_after ({settings.lost_after_s:g} s) must be at least three "
                f"heartbeats ({3 * settings.heartbeat_s:g} s)"
            )
        return settings


@dataclass
class _Node:
    """A node of the job as the driver sees it."""

    rank: int
    host: str
    pid: int
    heard: float
    round: int = 0  # the last ping round it answered
    trial: str | None = None
    lost: str | None = None
    lost_at: float = -math.inf
    # Lost for silence or a stuck loop (not a failed send or hydra's notice of its death):
    # it comes back once its main loop acknowledges the cancel sent when it was lost.
    revivable: bool = False
    owes: str | None = None  # the trial of that cancel


@dataclass
class _Trial:
    spec: TrialSpec
    ranks: list[int]  # the worker rank of each node
    submitted: float
    ordered: set[int] = field(default_factory=set)
    results: dict[int, TrialResult] = field(default_factory=dict)


class MPIBackend:
    """Rank 0's side: hands trials to groups of free worker nodes and collects results."""

    name = "mpi"

    def __init__(self, space: SearchSpace, comm: Any, settings: MPISettings, slots: int | None):
        self.space = space
        self.settings = settings
        self._comm = comm
        self._slots = slots
        self._box = Mailbox(comm)
        self._beats = Mailbox(comm, BEAT_TAG)
        self._nodes = self._greet()
        self._local: NodeSlot | None = None
        if self._driver_works():
            self._nodes[0] = _Node(0, socket.gethostname(), os.getpid(), math.inf)
            self._local = NodeSlot(settings.workdir, settings.grace_s, node_run=node_run)
        self._nodes_per_trial = space.allocation.nodes
        if len(self._nodes) < self._nodes_per_trial:
            raise BackendError(
                f"the trials of {space.source} need {self._nodes_per_trial} nodes, but this MPI "
                f"job has {len(self._nodes)} working ranks (ranks "
                f"{', '.join(map(str, sorted(self._nodes)))}): start one rank per node on at "
                f"least {self._nodes_per_trial} nodes"
            )
        welcome = WorkerSettings(
            workdir=str(settings.workdir) if settings.workdir else None,
            grace_s=settings.grace_s,
            heartbeat_s=settings.heartbeat_s,
            driver_timeout_s=settings.driver_timeout_s,
        )
        for rank in self._remote():
            self._box.send(rank, WELCOME, welcome)
        self._trials: dict[str, _Trial] = {}
        self._done: list[Finished] = []
        self._pinged = time.monotonic()
        self._round = 0
        self._closed = False
        self._usr1: list[tuple[float, int]] = []  # (when, the ping round sent after it)
        self._usr1_previous: Any = None
        self._confirm_s = min(settings.lost_after_s, max(5 * settings.heartbeat_s, 5.0))
        self._hold_usr1()

    def _greet(self) -> dict[int, _Node]:
        """Every worker's hello: its host and pid."""
        nodes: dict[int, _Node] = {}
        missing = set(range(1, self._comm.Get_size()))
        deadline = time.monotonic() + HELLO_TIMEOUT_S
        while missing and time.monotonic() < deadline:
            for source, kind, payload in self._box.receive():
                if kind == HELLO:
                    nodes[source] = _Node(source, payload[0], payload[1], time.monotonic())
                    missing.discard(source)
            time.sleep(POLL_S)
        if missing:
            raise BackendError(
                f"MPI ranks {sorted(missing)} did not report within {HELLO_TIMEOUT_S:g} s; do "
                f"all ranks run `parsearch ... --backend mpi`?"
            )
        return nodes

    def _driver_works(self) -> bool:
        if self.settings.driver_worker != "auto":
            return self.settings.driver_worker == "yes"
        host = socket.gethostname()
        return all(node.host != host for node in self._nodes.values())

    def _remote(self) -> list[int]:
        """Worker ranks not lost."""
        return [rank for rank, node in sorted(self._nodes.items()) if rank and not node.lost]

    def _free(self) -> list[int]:
        return [r for r, n in sorted(self._nodes.items()) if not n.lost and n.trial is None]

    @property
    def capacity(self) -> int:
        """Trials that can run at once, counting the nodes lost for silence up to
        ``lost_after`` ago: they may answer again (a hung file system stalls every node at
        once), so the driver waits that long for them rather than ending the campaign at
        once; a node that stays silent is given up (a dead host: the campaign stops)."""
        now = time.monotonic()
        live = sum(
            1 for node in self._nodes.values() if not node.lost or self._may_return(node, now)
        )
        room = live // self._nodes_per_trial
        return min(room, self._slots) if self._slots else room

    def free_slots(self) -> int:
        return self.room_for(self._nodes_per_trial)

    def room_for(self, nodes: int) -> int:
        """How many more trials of ``nodes`` nodes fit now (proxies are smaller)."""
        self._hold_usr1()
        room = len(self._free()) // nodes
        if self._slots:
            room = min(room, self._slots - len(self._trials))
        return max(0, room)

    def free_nodes(self) -> int:
        """Nodes without a trial (for callers that mix trials of several sizes)."""
        return len(self._free())

    def submit(self, spec: TrialSpec) -> list[str]:
        self._hold_usr1()
        free = self._free()
        if len(free) < spec.nodes or (self._slots and len(self._trials) >= self._slots):
            raise BackendError(
                f"mpi backend: {len(free)} free nodes, {len(self._trials)} trials running; "
                f"trial {spec.trial_id} needs {spec.nodes}"
            )
        trial = _Trial(spec, free[: spec.nodes], time.monotonic())
        self._trials[spec.trial_id] = trial
        for rank in trial.ranks:
            self._nodes[rank].trial = spec.trial_id
        self._order(trial, 0)
        return [self._nodes[rank].host for rank in trial.ranks]

    def _order(self, trial: _Trial, node: int, rendezvous: NodeStarted | None = None) -> None:
        """Start ``node`` of ``trial``; nodes after the first meet at node 0's address."""
        rank = trial.ranks[node]
        addr, port = (rendezvous.addr, rendezvous.port) if rendezvous else (None, None)
        hosts = tuple(self._nodes[r].host for r in trial.ranks)
        order = NodeOrder(trial.spec.to_dict(), node, len(trial.ranks), addr, port, hosts)
        trial.ordered.add(node)
        if rank == 0:
            assert self._local is not None
            self._on_started(0, self._local.start(order))
        else:
            self._box.send(rank, RUN, order)

    def poll(self, timeout_s: float) -> list[Finished]:
        deadline = time.monotonic() + timeout_s
        while True:
            self._pump()
            if self._done or not self._trials or time.monotonic() >= deadline:
                done, self._done = self._done, []
                return done
            time.sleep(POLL_S)

    def _pump(self) -> None:
        """Handle whatever arrived; notice lost nodes; tell the workers we live."""
        for source, kind, payload in self._box.receive():
            node = self._nodes.get(source)
            if node is None:
                continue
            if node.lost:
                if kind == CANCELLED and node.revivable and payload == node.owes:
                    self._readmit(node)
                continue
            node.heard = time.monotonic()
            if kind == STARTED:
                self._on_started(source, payload)
            elif kind == DONE:
                self._on_done(source, payload)
        for source, _, payload in self._beats.receive():
            node = self._nodes.get(source)
            if node is not None and not node.lost:
                node.heard = time.monotonic()
                node.round = max(node.round, payload)
        if self._local is not None and (done := self._local.poll()) is not None:
            self._on_done(0, done)
        for rank in self._box.flush() + self._beats.flush():
            if not self._nodes[rank].lost:
                self._lose(self._nodes[rank], "an MPI message to it failed")
            self._nodes[rank].revivable = False  # a failed send: gone for good
        now = time.monotonic()
        self._hold_usr1()
        self._judge_usr1(now)
        for rank in self._remote():
            node = self._nodes[rank]
            if now - node.heard > self.settings.lost_after_s:
                self._lose(node, f"it sent nothing for {now - node.heard:.0f} s", revivable=True)
        self._check_deadlines(now)
        if now - self._pinged >= self.settings.heartbeat_s:
            self._ping()

    def _check_deadlines(self, now: float) -> None:
        """A node whose trial is ``lost_after`` past its timeout without a result has a
        stuck worker (its heartbeat thread lives, its loop does not): it is lost."""
        for trial in list(self._trials.values()):
            late = now - trial.submitted - trial.spec.timeout_s
            if late > self.settings.lost_after_s:
                for node, rank in enumerate(trial.ranks):
                    if node not in trial.results and rank and not self._nodes[rank].lost:
                        why = f"its trial ran {late:.0f} s past its timeout without a result"
                        self._lose(self._nodes[rank], why, revivable=True)

    def _ping(self) -> int:
        """Send a new ping round; a worker that answers it was alive after this moment."""
        self._round += 1
        for rank in self._remote():
            self._beats.send(rank, PING, self._round)
        self._pinged = time.monotonic()
        return self._round

    def _on_started(self, rank: int, started: NodeStarted) -> None:
        trial = self._trials.get(started.trial_id)
        if trial is None or trial.ranks[started.node] != rank:
            return  # cancelled meanwhile
        if started.node == 0 and started.error is None:
            for node in range(1, len(trial.ranks)):
                self._order(trial, node, started)

    def _on_done(self, rank: int, done: NodeDone) -> None:
        trial = self._trials.get(done.trial_id)
        if trial is None or trial.ranks[done.node] != rank:
            return
        trial.results[done.node] = done.result
        failed = not done.result.ok and done.result.status is not TrialState.INTERRUPTED
        if failed or len(trial.results) == len(trial.ranks):
            result = merge_results(trial.spec, [trial.results[n] for n in sorted(trial.results)])
            if result.ok:
                result.hosts = [self._nodes[r].host for r in trial.ranks]
            self._finish(trial, result)

    def _finish(self, trial: _Trial, result: TrialResult) -> None:
        self._release(trial)
        self._done.append(Finished(trial.spec.trial_id, result))

    def _release(self, trial: _Trial) -> None:
        """Free the trial's nodes, cancelling the ones still running it."""
        del self._trials[trial.spec.trial_id]
        for node, rank in enumerate(trial.ranks):
            worker = self._nodes[rank]
            worker.trial = None
            if node in trial.ordered and node not in trial.results and not worker.lost:
                if rank == 0:
                    assert self._local is not None
                    self._local.cancel(trial.spec.trial_id)
                else:
                    self._box.send(rank, CANCEL, trial.spec.trial_id)

    def _lose(self, node: _Node, why: str, *, revivable: bool = False) -> None:
        node.lost = f"worker rank {node.rank} on {node.host} (pid {node.pid}) lost: {why}"
        node.lost_at = time.monotonic()
        node.revivable, node.owes = revivable, node.trial
        print(f"parsearch mpi: {node.lost}; {len(self._remote())} workers left", file=sys.stderr)
        self._box.send(node.rank, CANCEL, node.trial)  # in case it was only slow
        trial = self._trials.get(node.trial) if node.trial else None
        if trial is not None:
            error = f"node lost: {node.lost}"
            self._finish(trial, TrialResult(TrialState.ERROR, error=error, hosts=[node.host]))

    def _may_return(self, node: _Node, now: float) -> bool:
        """Whether a lost node may still answer: lost for silence, ``lost_after`` ago at most."""
        return node.revivable and now - node.lost_at <= self.settings.lost_after_s

    def _readmit(self, node: _Node) -> None:
        """A node lost for silence answered the cancel: it was only slow (stopped, paused
        by the system, its file system hung), and its slot is free; it gets trials again."""
        node.lost, node.revivable, node.owes = None, False, None
        node.heard = time.monotonic()
        print(
            f"parsearch mpi: worker rank {node.rank} on {node.host} (pid {node.pid}) answers "
            f"again; back in the campaign, {len(self._remote())} workers",
            file=sys.stderr,
        )

    def _hold_usr1(self) -> None:
        """Keep our SIGUSR1 filter in front of the handler installed last, on every call
        from the driver (the session installs its stop handler after making the backend);
        the filter passes stop requests on to it. Only under hydra: ``srun`` sends no such
        notice, and its SIGUSR1 is Slurm's warning before the time limit, which must reach
        the session's handler at once (a filter that waits for every worker's answer while
        the trials load both cores took the warning for a lost node)."""
        if not launched_by_hydra() or threading.current_thread() is not threading.main_thread():
            return
        current = signal.getsignal(signal.SIGUSR1)
        if current != self._on_usr1:
            self._usr1_previous = signal.SIG_DFL if current is None else current
            signal.signal(signal.SIGUSR1, self._on_usr1)

    def _on_usr1(self, signum: int, frame: Any) -> None:
        self._usr1.append((time.monotonic(), 0))

    def _judge_usr1(self, now: float) -> None:
        """Take a SIGUSR1 for hydra's notice of a dead rank when a worker is lost around it
        or fails to answer a ping sent after it (it is then lost now); pass it on as a stop
        request once every worker has answered that ping."""
        for index, (received, round_) in enumerate(self._usr1):
            if not round_:
                self._usr1[index] = (received, self._ping())
        for received, round_ in list(self._usr1):
            silent = [self._nodes[r] for r in self._remote() if self._nodes[r].round < round_]
            lost = [n.lost_at for n in self._nodes.values() if n.lost]
            if any(abs(at - received) <= self._confirm_s for at in lost):
                self._usr1.remove((received, round_))
            elif not silent:
                self._usr1.remove((received, round_))
                if callable(self._usr1_previous):
                    self._usr1_previous(signal.SIGUSR1, None)
            elif now - received >= self._confirm_s:
                self._usr1.remove((received, round_))
                for node in silent:
                    self._lose(node, "mpiexec reported a dead rank and it did not answer")

    def cancel(self, trial_id: str) -> None:
        trial = self._trials.get(trial_id)
        if trial is not None:
            self._release(trial)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for trial in list(self._trials.values()):
            self._release(trial)
        if self._local is not None:
            self._local.close()
        for rank, node in self._nodes.items():
            if node.lost:  # in case it was only slow: it would wait for driver_timeout
                self._box.send(rank, EXIT)
        release_workers(self._box, self._remote())
        if signal.getsignal(signal.SIGUSR1) == self._on_usr1:
            signal.signal(signal.SIGUSR1, self._usr1_previous)

    def describe(self) -> dict[str, Any]:
        return {
            "slots": self._slots,
            "nodes_per_trial": self._nodes_per_trial,
            "workers": [
                {"rank": rank, "host": node.host, "pid": node.pid}
                for rank, node in sorted(self._nodes.items())
            ],
            "driver_worker": self._local is not None,
            "workdir": str(self.settings.workdir) if self.settings.workdir else None,
            "grace_s": self.settings.grace_s,
            "heartbeat_s": self.settings.heartbeat_s,
            "lost_after_s": self.settings.lost_after_s,
            "lost": [node.lost for node in self._nodes.values() if node.lost],
        }


def release_workers(box: Mailbox, ranks: list[int]) -> None:
    """Tell ``ranks`` to exit and wait (a little) for their goodbyes, so none is left
    waiting and ``mpiexec`` ends.

    Under hydra with proxies apart, the workers leave one at a time: hydra (MPICH 5.0.2,
    ``-disable-auto-cleanup``) takes every rank's exit, even after ``MPI_Finalize``, for a
    death, and ``mpiexec`` then writes a SIGUSR1 order to every other proxy; one whose
    proxy had exited a moment before (its last report not yet read) gets the write, which
    kills ``mpiexec`` with SIGPIPE: a campaign that completed ends with exit code 141
    (measured here with 4 workers leaving at once: 3 jobs of 12 idle, 10 of 12 beside 2
    busy processes; with 2 workers, 6 of 12 loaded). The SIGUSR1 that ``mpiexec`` passes
    on for a worker's exit says it has taken that proxy's report; the next worker is told
    to exit only then. Without ``-disable-auto-cleanup`` no such notice comes (nor the
    danger): after :data:`EXIT_NOTICE_WAIT_S` without one, the rest are told at once.
    """
    global _released
    _released = True
    if not hydra_proxies(box.comm) or threading.current_thread() is not threading.main_thread():
        _say_exit(box, ranks)
    else:
        with _ExitNotices() as notices:
            for index, rank in enumerate(ranks):
                seen = notices.count
                if not _say_exit(box, [rank]):
                    continue  # no goodbye (hung or gone): no exit of its to wait for
                if not notices.wait_for_more_than(seen, EXIT_NOTICE_WAIT_S, box):
                    _say_exit(box, ranks[index + 1 :])
                    break
    discard_unreceived(box.comm)  # the beats that crossed the goodbyes


def _say_exit(box: Mailbox, ranks: list[int]) -> set[int]:
    """Tell ``ranks`` to exit and wait up to :data:`BYE_WAIT_S` for their goodbyes; the
    ranks that said goodbye."""
    for rank in ranks:
        box.send(rank, EXIT)
    waiting, left = set(ranks), set()
    deadline = time.monotonic() + BYE_WAIT_S
    while waiting and time.monotonic() < deadline:
        for source, kind, _ in box.receive():
            if kind == BYE:
                waiting.discard(source)
                left.add(source)
        waiting.difference_update(box.flush())
        time.sleep(POLL_S)
    return left


class _ExitNotices:
    """Counts hydra's SIGUSR1s (each: ``mpiexec`` took a rank's exit) while in use; the
    handler it replaced is put back after."""

    def __init__(self) -> None:
        self.count = 0
        self._previous: Any = None

    def __enter__(self) -> _ExitNotices:
        self._previous = signal.signal(signal.SIGUSR1, self._on_notice)
        return self

    def __exit__(self, *_: object) -> None:
        signal.signal(signal.SIGUSR1, self._previous)

    def _on_notice(self, signum: int, frame: Any) -> None:
        self.count += 1

    def wait_for_more_than(self, seen: int, timeout_s: float, box: Mailbox) -> bool:
        """Wait until more than ``seen`` notices came; ``False`` after ``timeout_s``.
        Messages arriving meanwhile (a beat that crossed the goodbye) are dropped."""
        deadline = time.monotonic() + timeout_s
        while self.count <= seen:
            if time.monotonic() >= deadline:
                return False
            for _ in box.receive():
                pass
            time.sleep(POLL_S)
        return True


def _at_exit(comm: Any) -> None:
    """Ignore hydra's SIGUSR1 from the exiting workers for good (Python resets its own
    handlers to the default, fatal one as it shuts down), and release the workers if no
    backend did."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    if not _released:
        release_workers(Mailbox(comm), list(range(1, comm.Get_size())))


def serve_if_worker() -> bool:
    """On ranks >= 1: serve as a worker until the driver is done, then ``True``. On rank 0:
    ``False``, after making sure the workers are released at exit even if no backend is
    ever made, and that hydra's SIGUSR1 outside a campaign does not kill the driver."""
    comm = world()
    if comm.Get_rank() != 0:
        serve(comm)
        return True
    if launched_by_hydra():  # under srun, SIGUSR1 is Slurm's warning: the early handler keeps it
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    atexit.register(_at_exit, comm)
    return False


def create(space: SearchSpace, *, slots: int | None, options: Mapping[str, str]) -> MPIBackend:
    """Rank 0's backend over the job's workers; one per job (they exit when it closes)."""
    settings = MPISettings.from_options(options)
    comm = world()
    if comm.Get_rank() != 0:
        raise BackendError("the mpi backend is made on rank 0; call serve_if_worker() first")
    if _released:
        raise BackendError("this MPI job's workers have exited; start a new job")
    if settings.workdir is not None:
        try:
            settings.workdir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise BackendError(
                f"mpi option workdir: cannot create {settings.workdir}: {error}"
            ) from None
    return MPIBackend(space, comm, settings, slots)
