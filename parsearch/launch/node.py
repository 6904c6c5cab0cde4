"""One node's share of a trial, run by a worker whatever carries its orders.

The ``mpi`` backend's worker ranks (and a driver that works its own node), and the ``ray``
backend's actors, all do the same thing on their node: take an order (this trial, node k of
n, rendezvous at host:port), start the node's ranks through the node agent, report how they
started, watch them, and kill them when the trial is cancelled. :class:`NodeSlot` is that,
for at most one trial at a time (a node's devices belong to one trial). Orders and reports
are plain picklable data, so MPI messages and Ray calls carry them unchanged.

Ranks are guarded (:mod:`parsearch.launch.guard`), so they die with the worker; each
node also writes ``node<k>.json`` (host, worker pid, rank pids) into the trial directory,
which says where a trial ran and lets tests find the worker to kill.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from parsearch.launch.guard import guarded
from parsearch.launch.placement import NodePlacement
from parsearch.launch.process import NodeRun, free_port
from parsearch.result import TrialResult, TrialState
from parsearch.tempdirs import owned_tempdir
from parsearch.trial import TrialSpec

# Plans one node's run of a trial for its trainer kind: parsearch.trainers.node_run.
NodeRunFactory = Callable[[NodePlacement], NodeRun]


@dataclass(frozen=True)
class NodeOrder:
    """Run node ``node`` of ``nnodes`` of a trial, meeting the others at ``addr:port``.

    Node 0 gets neither: it is the rendezvous, at its own address and a port it finds free
    there (so concurrent trials never share one), both of which it reports; the other
    nodes are ordered once the driver knows them. ``hosts``: the trial's nodes, node 0
    first, where the backend knows them when it orders (a command's ``{hosts}``)."""

    spec: dict[str, Any]
    node: int
    nnodes: int
    addr: str | None = None
    port: int | None = None
    hosts: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodeDone:
    """A node's ranks of a trial ended (or never started): the node's result."""

    trial_id: str
    node: int
    result: TrialResult


@dataclass(frozen=True)
class NodeStarted:
    """How a node's ranks started (``error`` when they could not; ``pids`` is then empty).

    ``started_at`` is wall-clock time, comparable across the nodes of one cluster."""

    trial_id: str
    node: int
    addr: str
    port: int
    host: str
    pid: int
    pids: list[int]
    started_at: float
    error: str | None = None


class NodeSlot:
    """Runs this node's part of at most one trial at a time.

    ``workdir``: trial directories go to ``workdir/<trial id>/``; ``None``: a temporary
    directory, removed by :meth:`close`. ``addr``: how the other nodes reach this one
    (default: the host name). ``node_run`` plans a node's run for the trial's trainer kind
    (the backend passes :func:`parsearch.trainers.node_run`: launching knows no trainer).
    """

    def __init__(
        self,
        workdir: Path | None,
        grace_s: float = 3.0,
        addr: str | None = None,
        *,
        node_run: NodeRunFactory,
    ):
        self._node_run = node_run
        self.host = socket.gethostname()
        self.addr = addr or self.host
        self.grace_s = grace_s
        self._keep = workdir is not None
        self.workdir = workdir or owned_tempdir("node")
        self._run: NodeRun | None = None
        self._failed: TrialResult | None = None

    @property
    def trial_id(self) -> str | None:
        return self._run.spec.trial_id if self._run is not None else None

    def start(self, order: NodeOrder) -> NodeStarted:
        """Start the node's ranks of ``order``; never raises for a trial that cannot start
        (the failure is the next :meth:`poll` result)."""
        spec = TrialSpec.from_dict(order.spec)
        addr = order.addr or self.addr
        port = order.port or free_port()
        trial_dir = self.workdir / spec.trial_id
        run = guarded(
            self._node_run(
                NodePlacement(
                    spec,
                    order.node,
                    order.nnodes,
                    addr,
                    port,
                    trial_dir,
                    grace_s=self.grace_s,
                    hosts=order.hosts,
                )
            )
        )
        self._run, self._failed = run, None
        error = None
        try:
            run.start()
        except (OSError, ValueError) as exc:
            if run.ranks:
                run.kill()
            error = f"could not start node {order.node}'s ranks on {self.host}: {exc}"
            self._failed = TrialResult(status=TrialState.ERROR, error=error, hosts=[self.host])
        started = NodeStarted(
            trial_id=spec.trial_id,
            node=order.node,
            addr=addr,
            port=port,
            host=self.host,
            pid=os.getpid(),
            pids=[] if error else run.pids,
            started_at=time.time(),
            error=error,
        )
        if trial_dir.is_dir():
            path = trial_dir / f"node{order.node}.json"
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(json.dumps(asdict(started)))
            tmp.replace(path)
        return started

    def poll(self) -> NodeDone | None:
        """The node's result once its ranks ended (then the slot is free), else ``None``."""
        run = self._run
        if run is None:
            return None
        result = self._failed or run.poll()
        if result is None:
            return None
        self._run = None
        return NodeDone(run.spec.trial_id, run.node_rank, result)

    def cancel(self, trial_id: str) -> None:
        """Kill the ranks of ``trial_id`` if they run here (nothing is reported)."""
        if self._run is not None and self.trial_id == trial_id:
            if self._run.ranks:
                self._run.kill()
            self._run = None

    def close(self) -> None:
        """Kill whatever runs and remove the temporary trial directories."""
        if self._run is not None:
            self.cancel(self._run.spec.trial_id)
        if not self._keep:
            shutil.rmtree(self.workdir, ignore_errors=True)
