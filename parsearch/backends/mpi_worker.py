"""The MPI plumbing both sides share, and the worker ranks' loop.

Every message is a ``(kind, payload)`` pair, sent with ``isend`` and received after
``improbe`` found it, so no rank ever blocks in MPI: MPICH's blocking receive busy-polls
(about 65% of a core per idle rank, measured here), which would steal CPU from the very
trials being timed. Ranks sleep between looks instead.

Two channels (tags): orders and reports (:data:`TAG`), handled by the worker's main loop,
and pings and heartbeats (:data:`BEAT_TAG`), handled by a thread of their own (mpi4py asks
for ``MPI_THREAD_MULTIPLE``). A main loop can be busy for seconds, starting a trial's
ranks (the first built-in trial warms the agent's fork server: importing torch, slow on a
loaded node or a parallel file system); the heartbeat must not stop meanwhile, or the
driver would take a busy worker for a dead one. What the thread proves is that the process
lives; a main loop that hangs is caught by the driver's deadline on the trial instead.

Workers ignore SIGINT, SIGTERM and SIGUSR1: ``mpiexec`` and ``srun`` pass those to every
rank, and it is the driver's job to drain (let running trials finish, then tell the
workers to exit). A worker exits when the driver says so, or when it has heard nothing
from the driver for ``driver_timeout`` seconds (the driver was killed), so the job ends.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parsearch.launch.node import NodeSlot
from parsearch.trial_kinds import node_run

TAG = 0x7073
BEAT_TAG = 0x7074
POLL_S = 0.01
BEAT_POLL_S = 0.05
BYE_WAIT_S = 5.0

# driver -> worker, TAG
WELCOME = "welcome"  # WorkerSettings
RUN = "run"  # parsearch.launch.node.NodeOrder
CANCEL = "cancel"  # trial id (None: no trial, only the acknowledgement is wanted)
EXIT = "exit"  # None
# worker -> driver, TAG
HELLO = "hello"  # (host, pid)
STARTED = "started"  # parsearch.launch.node.NodeStarted
DONE = "done"  # parsearch.launch.node.NodeDone
CANCELLED = "cancelled"  # the trial id of a CANCEL, once this node no longer runs it
BYE = "bye"  # None: the worker is leaving
# BEAT_TAG
PING = "ping"  # driver -> worker, a round number: answered at once with a BEAT
BEAT = "beat"  # worker -> driver, the last ping round seen: the worker lives

# What marks a process as a member of this MPI job. A trial's ranks must not inherit it:
# a trainer that is itself an MPI program (or reads OMPI_COMM_WORLD_RANK, as DeepSpeed
# does) would otherwise attach to the campaign's job instead of starting its own.
JOB_VARIABLES = ("PMI_", "PMIX_", "HYDI_", "OMPI_COMM_WORLD_", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")


@dataclass(frozen=True)
class WorkerSettings:
    """What the driver tells its workers once it has read its options."""

    workdir: str | None = None
    grace_s: float = 3.0
    heartbeat_s: float = 1.0
    driver_timeout_s: float = 300.0


def world() -> Any:
    """``MPI.COMM_WORLD``; the first call imports mpi4py, which starts MPI.

    MPICH's ``MPI_Finalize`` is collective by default: after a worker died, every other
    rank would wait at exit for it forever. ``MPIR_CVAR_NO_COLLECTIVE_FINALIZE`` makes it
    local; the driver and its workers say goodbye to each other before they exit instead.
    """
    os.environ.setdefault("MPIR_CVAR_NO_COLLECTIVE_FINALIZE", "1")
    from mpi4py import MPI

    if "MPI_LOCALNRANKS" in os.environ:  # hydra's; gone from the environment below
        _hydra["local_ranks"] = int(os.environ["MPI_LOCALNRANKS"])
    for name in [name for name in os.environ if name.startswith(JOB_VARIABLES)]:
        del os.environ[name]
    return MPI.COMM_WORLD


# How many ranks share this rank's hydra proxy (``MPI_LOCALNRANKS``), read by :func:`world`
# before it removes the job's variables; None when MPICH's hydra (``mpiexec``) did not start
# this process (``srun``'s PMI sets no ``MPI_LOCALNRANKS``).
_hydra: dict[str, int | None] = {"local_ranks": None}


def launched_by_hydra() -> bool:
    """Whether hydra started this rank: hydra signals SIGUSR1 to the ranks when one of them
    dies, where under ``srun`` SIGUSR1 is Slurm's warning before the time limit."""
    return _hydra["local_ranks"] is not None


def hydra_proxies(comm: Any) -> bool:
    """Whether hydra started this job with more than one proxy (ranks on several hosts, or
    ``-hosts n0,n1,... -ppn 1`` on one): only then can one proxy outlive another."""
    local_ranks = _hydra["local_ranks"]
    return local_ranks is not None and local_ranks < comm.Get_size()


class Mailbox:
    """Non-blocking messages on one tag of ``comm``: sends complete in the background (a
    result with a long log tail goes by rendezvous, so only when the peer receives it).
    One per thread."""

    def __init__(self, comm: Any, tag: int = TAG):
        self.comm = comm
        self.tag = tag
        self._pending: list[tuple[int, Any]] = []

    def send(self, dest: int, kind: str, payload: Any = None) -> None:
        self._pending.append((dest, self.comm.isend((kind, payload), dest=dest, tag=self.tag)))

    def flush(self) -> list[int]:
        """Progress pending sends; return the ranks a send failed to (gone)."""
        from mpi4py import MPI

        failed, pending = [], []
        for dest, request in self._pending:
            try:
                if not request.Test():
                    pending.append((dest, request))
            except MPI.Exception:
                failed.append(dest)
        self._pending = pending
        return failed

    @property
    def idle(self) -> bool:
        """No send is still pending."""
        return not self._pending

    def receive(self) -> Iterator[tuple[int, str, Any]]:
        """``(source, kind, payload)`` for every message that has arrived, without waiting."""
        from mpi4py import MPI

        status = MPI.Status()
        while message := self.comm.improbe(source=MPI.ANY_SOURCE, tag=self.tag, status=status):
            kind, payload = message.recv()
            yield status.Get_source(), kind, payload


def serve(comm: Any) -> None:
    """Be a worker: run the driver's orders on this node until told to exit."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)
    worker = _Worker(comm)
    heartbeat = threading.Thread(target=worker.beat, name="parsearch-heartbeat", daemon=True)
    heartbeat.start()
    try:
        try:
            told_to_exit = worker.serve()
        finally:
            # The beats stop before the goodbye, so that none reaches the driver after it.
            worker.stopping.set()
            heartbeat.join()
        if told_to_exit:
            worker.say_bye()
    finally:
        if worker.slot is not None:
            worker.slot.close()
    discard_unreceived(comm)


def discard_unreceived(comm: Any, settle_s: float = 0.1) -> int:
    """Receive and drop whatever is still addressed to this rank; how many there were.

    MPICH's ``MPI_Finalize`` fails when a message was never received ("communicator being
    freed has unmatched messages": a heartbeat that crossed the goodbye, a ping the
    heartbeat thread no longer answers), and then skips telling the launcher that the rank
    finalized; hydra takes that for a crash and SIGKILLs the whole job, so a campaign that
    completed would end with exit code 9. Every rank calls this last, once its peers have
    nothing more to send it, and waits ``settle_s`` for anything still on its way.
    """
    from mpi4py import MPI

    dropped = 0
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < settle_s:
        message = comm.improbe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)
        if message is None:
            time.sleep(POLL_S)
            continue
        message.recv()
        dropped += 1
        quiet_since = time.monotonic()
    return dropped


class _Worker:
    def __init__(self, comm: Any):
        self.comm = comm
        self.box = Mailbox(comm)
        self.settings = WorkerSettings()
        self.slot: NodeSlot | None = None  # made when the driver's welcome arrives
        self.heard = time.monotonic()  # from the driver, on either channel
        self.stopping = threading.Event()
        self.box.send(0, HELLO, (socket.gethostname(), os.getpid()))

    def serve(self) -> bool:
        """The main loop; ``True`` when the driver said exit, ``False`` when it fell silent."""
        while True:
            for _, kind, payload in self.box.receive():
                self.heard = time.monotonic()
                if kind == EXIT:
                    return True
                self.handle(kind, payload)
            if self.slot is not None and (done := self.slot.poll()) is not None:
                self.box.send(0, DONE, done)
            silent = time.monotonic() - self.heard
            if self.box.flush() or silent > self.settings.driver_timeout_s:
                print(
                    f"parsearch mpi worker {self.comm.Get_rank()}: the driver is gone "
                    f"(silent for {silent:.0f} s); exiting",
                    file=sys.stderr,
                )
                return False
            time.sleep(POLL_S)

    def handle(self, kind: str, payload: Any) -> None:
        if kind == WELCOME:
            self.settings = payload
            workdir = Path(payload.workdir) if payload.workdir else None
            self.slot = NodeSlot(workdir, payload.grace_s, node_run=node_run)
        elif kind == RUN and self.slot is not None:
            self.box.send(0, STARTED, self.slot.start(payload))
        elif kind == CANCEL:
            if self.slot is not None and payload is not None:
                self.slot.cancel(payload)
            self.box.send(0, CANCELLED, payload)

    def beat(self) -> None:
        """The heartbeat thread: answer pings at once, and beat every ``heartbeat`` s."""
        box = Mailbox(self.comm, BEAT_TAG)
        last_round, beat = 0, 0.0
        while not self.stopping.wait(BEAT_POLL_S):
            for _, _, payload in box.receive():
                self.heard = time.monotonic()
                last_round = payload
                box.send(0, BEAT, last_round)
            if time.monotonic() - beat >= self.settings.heartbeat_s:
                box.send(0, BEAT, last_round)
                beat = time.monotonic()
            box.flush()
        deadline = time.monotonic() + BYE_WAIT_S  # let the last beats go before MPI ends
        while not box.idle and not box.flush() and time.monotonic() < deadline:
            time.sleep(POLL_S)

    def say_bye(self) -> None:
        """Tell the driver we leave, and give the message time to go before MPI ends."""
        self.box.send(0, BYE)
        deadline = time.monotonic() + BYE_WAIT_S
        while not self.box.flush() and not self.box.idle and time.monotonic() < deadline:
            time.sleep(POLL_S)
