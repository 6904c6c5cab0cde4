"""``ray``: each trial gets a placement group of one bundle per node, and one actor per bundle.

An actor runs its node's share of the trial (:class:`~parsearch.launch.node.NodeSlot`,
so the ranks start through the node agent and die with the actor). The actor of node 0
picks a free port on its node and reports it with the node's IP address; the driver then
starts the other nodes' actors with that rendezvous (``MASTER_ADDR`` = node 0's IP). A
bundle holds the devices of one node of the trial: ``{"CPU": ranks_per_node}`` on CPU,
``{"GPU": ranks_per_node}`` when the trial uses GPUs (Ray then sets each actor's
``CUDA_VISIBLE_DEVICES``, which the ranks inherit). Bundles are placed with ``SPREAD``: on
distinct machines where the cluster has them, together on a single machine otherwise.

Nothing here blocks: the driver waits on the actors' replies with ``ray.wait``. An actor
that dies (``ray.kill``, its node lost) surfaces as ``ActorDiedError`` on the next reply:
the trial ends as ``error`` ("node lost"), its other actors are stopped, and the campaign
goes on with what the cluster has left (capacity follows the alive nodes). A trial whose
placement group is not ready within ``start_timeout`` ends as ``error`` too.

Options (``--backend-opt key=value``):

* ``address``: an existing cluster (``auto``, ``host:port`` or ``ray://host:port``), whose
  nodes have parsearch installed (the actors import it); without it a local cluster is
  started, and stopped at the end;
* ``num_cpus``: CPUs of that local cluster (default: this machine's);
* ``workdir``: trial directories under ``workdir/<trial id>/`` on each node (default: a
  temporary directory per actor, removed at the end);
* ``grace``: seconds a trial's other ranks get after one failed (default 3);
* ``start_timeout``: seconds a trial may wait for its nodes (default 600).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parsearch.backends import Finished, check_options, positive_option
from parsearch.errors import BackendError, BackendOptionError
from parsearch.launch.node import NodeDone, NodeOrder, NodeSlot, NodeStarted
from parsearch.rank_program import uses_gpu
from parsearch.result import TrialResult, TrialState
from parsearch.trial import TrialSpec
from parsearch.trial_kinds import merge_results, node_run

if TYPE_CHECKING:
    from parsearch.space import SearchSpace

OPTIONS = ("address", "num_cpus", "workdir", "grace", "start_timeout")
WAIT_S = 0.5  # an actor answers a wait at least this often, so a cancel is never held long


def _bundle_nodes(group: Any) -> dict[int, tuple[str, str]]:
    """(host name, address) of the node Ray placed each bundle of ``group`` on, by bundle
    (Ray places a group whole before any of its actors runs); empty once it is removed."""
    import ray
    from ray.util import placement_group_table

    bundles = placement_group_table(group).get("bundles_to_node_id", {})
    nodes = {n["NodeID"]: (n["NodeManagerHostname"], n["NodeManagerAddress"]) for n in ray.nodes()}
    return {index: nodes.get(node_id, ("", "")) for index, node_id in bundles.items()}


def _group_hosts() -> tuple[str, ...]:
    """The hosts of the calling actor's placement group, bundle 0 first: the trial's nodes."""
    from ray.util import get_current_placement_group

    group = get_current_placement_group()
    if group is None:
        return ()
    placed = _bundle_nodes(group)
    return tuple(placed[index][0] for index in sorted(placed))


class NodeActor:
    """One node of one trial, inside a Ray actor (made with ``ray.remote`` when used)."""

    def __init__(self, workdir: str | None, grace_s: float, omp_threads: str | None):
        import ray

        # Ray sets OMP_NUM_THREADS to the actor's CPUs, which every rank would inherit:
        # ranks run one thread each unless the user said otherwise (2 per rank ran 5-10x
        # slower here).
        if omp_threads is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = omp_threads
        address = ray.util.get_node_ip_address()
        self.slot = NodeSlot(
            Path(workdir) if workdir else None, grace_s, address, node_run=node_run
        )

    def start(self, order: NodeOrder) -> NodeStarted:
        return self.slot.start(replace(order, hosts=_group_hosts()))

    def wait(self, timeout_s: float) -> NodeDone | None:
        """The node's result once its ranks ended, or ``None`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while (done := self.slot.poll()) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        return done

    def close(self) -> None:
        self.slot.close()


@dataclass
class _Trial:
    spec: TrialSpec
    group: Any  # the placement group
    actors: list[Any]
    submitted: float
    started: dict[int, NodeStarted] = field(default_factory=dict)
    results: dict[int, TrialResult] = field(default_factory=dict)


@dataclass(frozen=True)
class _Reply:
    """What an outstanding actor call was for."""

    trial_id: str
    node: int
    kind: str  # "start" or "wait"


class RayBackend:
    """Runs trials as placement groups of node actors on a Ray cluster."""

    name = "ray"

    def __init__(self, space: SearchSpace, options: Mapping[str, str], slots: int | None):
        import ray

        self.space = space
        self._slots = slots
        self._workdir = options.get("workdir")
        self._grace_s = positive_option("ray", options, "grace", 3.0)
        self._start_timeout_s = positive_option("ray", options, "start_timeout", 600.0)
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            init: dict[str, Any] = {
                "include_dashboard": False,
                "log_to_driver": False,
                "namespace": f"parsearch-{uuid.uuid4().hex[:8]}",
            }
            if "address" in options:
                init["address"] = options["address"]
            elif "num_cpus" in options:
                init["num_cpus"] = int(positive_option("ray", options, "num_cpus", 1))
            try:
                ray.init(**init)
            except (ConnectionError, RuntimeError, ValueError) as error:
                raise BackendError(f"ray: cannot start or reach the cluster: {error}") from None
        self._actor = ray.remote(NodeActor)
        self._trials: dict[str, _Trial] = {}
        self._replies: dict[Any, _Reply] = {}
        self._retiring: dict[Any, list[Any]] = {}  # placement group -> close() replies
        self._done: list[Finished] = []
        self._closed = False

    def _node_room(self) -> int:
        """How many trial nodes (of the space's size) the alive cluster nodes hold at once."""
        import ray

        gpu = self.space.allocation.device != "cpu" and self.space.trainer.get("device") != "cpu"
        per_node = min(self.space.allocation.devices_per_node, self.space.world_size)
        resource = "GPU" if gpu else "CPU"
        return sum(
            int(node["Resources"].get(resource, 0) // per_node)
            for node in ray.nodes()
            if node.get("Alive")
        )

    def require_room(self) -> None:
        """Refuse, before any campaign starts, a cluster too small for one trial: the driver
        would otherwise find no room, wait, and fail as if nodes had been lost."""
        if self.capacity:
            return
        import ray

        gpu = self.space.allocation.device != "cpu" and self.space.trainer.get("device") != "cpu"
        resource = "GPU" if gpu else "CPU"
        per_node = min(self.space.allocation.devices_per_node, self.space.world_size)
        have = [int(n["Resources"].get(resource, 0)) for n in ray.nodes() if n.get("Alive")]
        fix = (
            f"start the local cluster with --backend-opt num_cpus={per_node}"
            if self._owns_ray and not gpu
            else f"use a cluster with nodes of at least {per_node} {resource}s"
        )
        raise BackendOptionError(
            f"the Ray cluster is smaller than one trial: a trial of {self.space.source} needs "
            f"{self.space.allocation.nodes} node(s) of {per_node} {resource}s each, and the "
            f"cluster's {len(have)} alive node(s) have {have or 'no'} {resource}s; {fix}, or "
            "shrink the space's allocation"
        )

    @property
    def capacity(self) -> int:
        room = self._node_room() // self.space.allocation.nodes
        return min(room, self._slots) if self._slots else room

    def free_nodes(self) -> int:
        """Trial nodes free now (for callers that mix trials of several sizes)."""
        busy = sum(len(t.actors) for t in self._trials.values())
        busy += sum(len(replies) for replies in self._retiring.values())
        return max(0, self._node_room() - busy)

    def free_slots(self) -> int:
        return self.room_for(self.space.allocation.nodes)

    def room_for(self, nodes: int) -> int:
        """How many more trials of ``nodes`` nodes fit now (proxies are smaller)."""
        room = self.free_nodes() // nodes
        if self._slots:
            room = min(room, self._slots - len(self._trials) - len(self._retiring))
        return max(0, room)

    def submit(self, spec: TrialSpec) -> list[str]:
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if self.free_nodes() < spec.nodes:
            raise BackendError(
                f"ray backend: no room for the {spec.nodes} nodes of {spec.trial_id}"
            )
        gpu = uses_gpu(spec)
        bundle = {"GPU" if gpu else "CPU": spec.ranks_per_node}
        group = placement_group([dict(bundle) for _ in range(spec.nodes)], strategy="SPREAD")
        actors = [
            self._actor.options(
                name=f"parsearch-{spec.trial_id}-node{node}",
                num_cpus=0 if gpu else spec.ranks_per_node,
                num_gpus=spec.ranks_per_node if gpu else 0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=group, placement_group_bundle_index=node
                ),
            ).remote(self._workdir, self._grace_s, os.environ.get("OMP_NUM_THREADS"))
            for node in range(spec.nodes)
        ]
        trial = _Trial(spec, group, actors, time.monotonic())
        self._trials[spec.trial_id] = trial
        self._start(trial, 0)
        return []  # not known until Ray places the group; the result names them

    def _start(self, trial: _Trial, node: int, rendezvous: NodeStarted | None = None) -> None:
        addr, port = (rendezvous.addr, rendezvous.port) if rendezvous else (None, None)
        order = NodeOrder(trial.spec.to_dict(), node, len(trial.actors), addr, port)
        reply = trial.actors[node].start.remote(order)
        self._replies[reply] = _Reply(trial.spec.trial_id, node, "start")

    def poll(self, timeout_s: float) -> list[Finished]:
        import ray

        deadline = time.monotonic() + timeout_s
        while True:
            self._retire()
            if self._replies:
                wait = max(0.0, min(deadline - time.monotonic(), WAIT_S))
                ready, _ = ray.wait(list(self._replies), num_returns=1, timeout=wait)
                if ready:
                    ready, _ = ray.wait(
                        list(self._replies), num_returns=len(self._replies), timeout=0
                    )
                for reply in ready:
                    self._answer(reply, self._replies.pop(reply))
            self._check_start_timeouts()
            if self._done or not self._trials or time.monotonic() >= deadline:
                done, self._done = self._done, []
                return done

    def _answer(self, reply: Any, about: _Reply) -> None:
        import ray
        from ray.exceptions import RayError

        trial = self._trials.get(about.trial_id)
        if trial is None:
            return
        try:
            value = ray.get(reply)
        except RayError as error:
            first = (
                str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            )
            where = trial.started.get(about.node)
            # An actor that died before its start returned never said where it ran; its
            # placement group's bundle did.
            host, addr = (
                (where.host, where.addr)
                if where
                else _bundle_nodes(trial.group).get(about.node, ("", ""))
            )
            on = f" on {host} ({addr})" if host else ""
            self._finish(
                trial,
                TrialResult(
                    TrialState.ERROR,
                    error=f"node lost: the actor of node {about.node}{on} failed: {first}",
                    hosts=[host] if host else [],
                ),
            )
            return
        if about.kind == "start":
            trial.started[about.node] = value
            if about.node == 0 and value.error is None:
                for node in range(1, len(trial.actors)):
                    self._start(trial, node, value)
            self._wait(trial, about.node)
        elif value is None:
            self._wait(trial, about.node)
        else:
            self._on_done(trial, value)

    def _wait(self, trial: _Trial, node: int) -> None:
        reply = trial.actors[node].wait.remote(WAIT_S)
        self._replies[reply] = _Reply(trial.spec.trial_id, node, "wait")

    def _on_done(self, trial: _Trial, done: NodeDone) -> None:
        trial.results[done.node] = done.result
        failed = not done.result.ok and done.result.status is not TrialState.INTERRUPTED
        if failed or len(trial.results) == len(trial.actors):
            result = merge_results(trial.spec, [trial.results[n] for n in sorted(trial.results)])
            if result.ok:
                result.hosts = [trial.started[n].host for n in sorted(trial.started)]
            self._finish(trial, result)

    def _check_start_timeouts(self) -> None:
        now = time.monotonic()
        for trial in list(self._trials.values()):
            if 0 not in trial.started and now - trial.submitted > self._start_timeout_s:
                self._finish(
                    trial,
                    TrialResult(
                        TrialState.ERROR,
                        error=f"ray could not place the trial's {len(trial.actors)} nodes "
                        f"within {self._start_timeout_s:g} s",
                    ),
                )

    def _finish(self, trial: _Trial, result: TrialResult) -> None:
        self._release(trial)
        self._done.append(Finished(trial.spec.trial_id, result))

    def _release(self, trial: _Trial) -> None:
        """Stop the trial's actors (their ranks are killed), then free the placement group."""
        del self._trials[trial.spec.trial_id]
        for reply, about in list(self._replies.items()):
            if about.trial_id == trial.spec.trial_id:
                del self._replies[reply]
        self._retiring[trial.group] = [actor.close.remote() for actor in trial.actors]

    def _retire(self) -> None:
        """Remove the placement groups whose actors have closed (or died)."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for group, closing in list(self._retiring.items()):
            ready, _ = ray.wait(closing, num_returns=len(closing), timeout=0)
            if len(ready) == len(closing):
                remove_placement_group(group)  # also ends its actors
                del self._retiring[group]

    def cancel(self, trial_id: str) -> None:
        trial = self._trials.get(trial_id)
        if trial is not None:
            self._release(trial)

    def close(self) -> None:
        import ray

        if self._closed:
            return
        self._closed = True
        for trial in list(self._trials.values()):
            self._release(trial)
        deadline = time.monotonic() + 10.0
        while self._retiring and time.monotonic() < deadline:
            self._retire()
            time.sleep(0.05)
        if self._owns_ray:
            ray.shutdown()

    def describe(self) -> dict[str, Any]:
        import ray

        return {
            "slots": self._slots,
            "nodes": sum(1 for node in ray.nodes() if node.get("Alive")),
            "cluster_resources": ray.cluster_resources(),
            "workdir": self._workdir,
            "grace_s": self._grace_s,
            "start_timeout_s": self._start_timeout_s,
        }


def create(space: SearchSpace, *, slots: int | None, options: Mapping[str, str]) -> RayBackend:
    """A backend on the Ray cluster at ``address``, or on a local one it starts."""
    check_options("ray", options, OPTIONS)
    if "address" in options and "num_cpus" in options:
        raise BackendOptionError(
            "ray options address and num_cpus exclude each other: num_cpus sizes a local cluster"
        )
    options = dict(options)
    if options.get("workdir"):
        workdir = Path(options["workdir"]).expanduser().resolve()
        try:
            workdir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise BackendOptionError(
                f"ray option workdir: cannot create {workdir}: {error}"
            ) from None
        options["workdir"] = str(workdir)
    try:
        import ray  # noqa: F401
    except ModuleNotFoundError:
        raise BackendError(
            "backend 'ray' needs the package 'ray' (pip install 'parsearch[ray]')"
        ) from None
    backend = RayBackend(space, options, slots)
    try:
        backend.require_room()
    except BaseException:
        backend.close()
        raise
    return backend
