"""``local``: this machine as one node; each trial is a group of local rank processes.

Trials run through the node agent (:class:`parsearch.launch.process.NodeRun`, picked by trainer kind
with :func:`parsearch.trainers.node_run`), which gives each rank its own process group, log
file and timeout, so a trial that crashes, hangs or runs out of memory ends as a result,
never as an exception in the driver. Ranks start through :mod:`parsearch.launch.guard`, so
a driver killed with ``kill -9`` takes its trials with it instead of leaving them to compete
with the ones ``resume`` starts. Several trials run at once
when the machine has room for them (``slots``),
each with its own rendezvous port and, on GPUs, its own devices. A space's allocation is one
trial's hardware, so by default one trial runs at a time; ``--slots K`` runs K at once on a
machine with K times the devices (two 4-GPU trials on an 8-GPU node). A space whose trials
span several nodes runs all of them here, as ``torchrun --nnodes`` would on one host.

Options (``--backend-opt key=value``):

* ``workdir``: keep each trial's spec, rank logs and result under ``workdir/<trial id>/``
  (default: a temporary directory removed at the end; the store keeps each log's tail);
* ``grace``: seconds the other ranks of a trial get to fail on their own after one rank
  failed, before they are killed (default 3).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parsearch.backends import Finished, check_options, conclusion_failed, positive_option
from parsearch.errors import BackendError, BackendOptionError
from parsearch.launch.guard import guarded
from parsearch.launch.placement import NodePlacement
from parsearch.launch.process import NodeRun, free_port, visible_devices_var
from parsearch.rank_program import uses_gpu
from parsearch.result import TrialResult, TrialState
from parsearch.tempdirs import owned_tempdir
from parsearch.trial import TrialSpec
from parsearch.trial_kinds import merge_results, node_run

if TYPE_CHECKING:
    from parsearch.space import SearchSpace

OPTIONS = ("workdir", "grace")
POLL_INTERVAL_S = 0.05


@dataclass
class _Trial:
    spec: TrialSpec
    slot: int
    runs: list[NodeRun]
    failed_to_start: TrialResult | None = None


class LocalBackend:
    """Runs up to ``slots`` trials at once on this machine."""

    name = "local"

    def __init__(self, space: SearchSpace, slots: int, workdir: Path | None, grace_s: float):
        self.space = space
        self._slots = slots
        self._grace_s = grace_s
        self._keep = workdir is not None
        self._workdir = workdir or owned_tempdir("local")
        self._free = list(range(slots - 1, -1, -1))
        self._running: dict[str, _Trial] = {}

    @property
    def capacity(self) -> int:
        return self._slots

    def free_slots(self) -> int:
        return len(self._free)

    def submit(self, spec: TrialSpec) -> list[str]:
        if not self._free:
            raise BackendError(f"local backend: all {self._slots} slots are busy")
        slot = self._free.pop()
        trial_dir = self._workdir / spec.trial_id
        port = free_port("127.0.0.1")
        env = self._slot_env(spec, slot)
        hosts = [socket.gethostname()] * spec.nodes  # every node of the trial runs here
        runs = [
            guarded(
                node_run(
                    NodePlacement(
                        spec, node, spec.nodes, "127.0.0.1", port, trial_dir, env=env,
                        grace_s=self._grace_s, hosts=tuple(hosts),
                    )
                )
            )
            for node in range(spec.nodes)
        ]  # fmt: skip
        trial = _Trial(spec, slot, runs)
        self._running[spec.trial_id] = trial
        try:
            for run in runs:
                run.start()
        except (OSError, ValueError) as error:
            for run in runs:
                if run.ranks:
                    run.kill()
            trial.failed_to_start = TrialResult(
                status=TrialState.ERROR, error=f"could not start the trial's ranks: {error}"
            )
        return [os.uname().nodename]

    def _slot_env(self, spec: TrialSpec, slot: int) -> dict[str, str]:
        """On GPUs, the devices of ``slot``: each concurrent trial gets its own."""
        if self._slots == 1 or not uses_gpu(spec):
            return {}
        var = visible_devices_var()
        visible = os.environ.get(var)
        per_trial = spec.ranks_per_node
        devices = (
            visible.split(",") if visible else [str(i) for i in range(self._slots * per_trial)]
        )
        return {var: ",".join(devices[slot * per_trial : (slot + 1) * per_trial])}

    def poll(self, timeout_s: float) -> list[Finished]:
        deadline = time.monotonic() + timeout_s
        while True:
            done = [f for f in map(self._check, list(self._running.values())) if f]
            if done or not self._running or time.monotonic() >= deadline:
                return done
            time.sleep(min(POLL_INTERVAL_S, max(0.0, deadline - time.monotonic())))

    def _check(self, trial: _Trial) -> Finished | None:
        """The trial's result once every node ended, or one failed (the others are killed);
        an exception while concluding it is that trial's error, not the campaign's."""
        try:
            result = trial.failed_to_start or self._outcome(trial)
        except Exception as error:
            for run in trial.runs:
                with contextlib.suppress(Exception):
                    run.kill()
            result = conclusion_failed(self.name, error)
        if result is None:
            return None
        self._release(trial)
        return Finished(trial.spec.trial_id, result)

    def _outcome(self, trial: _Trial) -> TrialResult | None:
        results = [run.poll() for run in trial.runs]
        failed = [r for r in results if r is not None and not r.ok]
        if not failed and any(r is None for r in results):
            return None
        results = [run.kill() for run in trial.runs]  # stop the nodes still running
        return merge_results(trial.spec, results)

    def cancel(self, trial_id: str) -> None:
        trial = self._running.get(trial_id)
        if trial is not None:
            for run in trial.runs:
                if run.ranks:
                    run.kill()
            self._release(trial)

    def _release(self, trial: _Trial) -> None:
        del self._running[trial.spec.trial_id]
        self._free.append(trial.slot)

    def close(self) -> None:
        for trial_id in list(self._running):
            self.cancel(trial_id)
        if not self._keep:
            shutil.rmtree(self._workdir, ignore_errors=True)

    def describe(self) -> dict[str, Any]:
        return {
            "slots": self._slots,
            "host": os.uname().nodename,
            "workdir": str(self._workdir) if self._keep else None,
            "grace_s": self._grace_s,
        }


def create(space: SearchSpace, *, slots: int | None, options: Mapping[str, str]) -> LocalBackend:
    """The local backend; one slot unless ``slots`` says the machine holds more trials."""
    check_options("local", options, OPTIONS)
    workdir = Path(options["workdir"]).expanduser().resolve() if options.get("workdir") else None
    if workdir is not None:
        try:
            workdir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise BackendOptionError(
                f"local option workdir: cannot create {workdir}: {error}"
            ) from None
    grace_s = positive_option("local", options, "grace", 3.0, "seconds")
    return LocalBackend(space, slots or 1, workdir, grace_s)
