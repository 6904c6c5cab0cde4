"""Trainer kinds, found by ``trainer.kind`` through one registry (:data:`TRAINER_KINDS`):
the built-in trainer (:mod:`.builtin`) and the command trainer (:mod:`.command`), each
implementing :class:`~parsearch.trainers.base.TrainerKind`. The space validates a trainer
section with its kind; backends plan a node's run with :func:`node_run` and combine a
multi-node trial's results with :func:`merge_results`, so none of them knows the kinds.
Importing this package starts nothing and imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from parsearch.launch.process import NodeRun
from parsearch.probe.kind import ProbeKind
from parsearch.result import TrialResult
from parsearch.trainers.base import TrainerKind
from parsearch.trainers.builtin.kind import BuiltinKind
from parsearch.trainers.command.kind import CommandKind
from parsearch.trial import TrialSpec

TRAINER_KINDS: dict[str, TrainerKind] = {kind.name: kind for kind in (BuiltinKind(), CommandKind())}
# What a trial may run but a space may not name: the machine probe (`parsearch probe`).
_TRIAL_KINDS: dict[str, TrainerKind] = {**TRAINER_KINDS, "probe": ProbeKind()}


def kind_of(spec: TrialSpec) -> TrainerKind:
    """The trainer kind of a trial (``builtin`` unless its section says otherwise)."""
    return _TRIAL_KINDS[spec.trainer.get("kind", "builtin")]


def node_run(
    spec: TrialSpec,
    node_rank: int,
    nnodes: int,
    master_addr: str,
    master_port: int,
    trial_dir: Path,
    *,
    env: Mapping[str, str] | None = None,
    grace_s: float = 3.0,
    hosts: Sequence[str] = (),
) -> NodeRun:
    """A not-yet-started run of one node of ``spec``, for its trainer kind. ``hosts``: the
    trial's nodes, node 0 first (a command trainer's ``{hosts}`` and ``{hostfile}``)."""
    return kind_of(spec).node_run(
        spec,
        node_rank,
        nnodes,
        master_addr,
        master_port,
        trial_dir,
        env=env,
        grace_s=grace_s,
        hosts=hosts,
    )


def merge_results(spec: TrialSpec, results: Sequence[TrialResult]) -> TrialResult:
    """One trial's result from its nodes' (index = node rank), as its trainer kind sees it."""
    return kind_of(spec).merge(results)
