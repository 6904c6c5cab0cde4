"""Trainer kinds, found by ``trainer.kind`` through one registry (:data:`TRAINER_KINDS`):
the built-in trainer (:mod:`.builtin`) and the command trainer (:mod:`.command`), each
implementing :class:`~parsearch.trainers.base.TrainerKind`. The space validates a trainer
section with its kind; backends plan a node's run at a placement with :func:`node_run` and
combine a multi-node trial's results with :func:`merge_results`, so none of them knows the
kinds.
Importing this package starts nothing and imports no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from parsearch.launch.placement import NodePlacement
from parsearch.launch.plan import NodePlan
from parsearch.launch.process import NodeRun
from parsearch.probe.kind import ProbeKind
from parsearch.rank_program import uses_gpu
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


def plan_node(placement: NodePlacement) -> NodePlan:
    """One node's processes of a trial, as its trainer kind plans them."""
    return kind_of(placement.spec).plan(placement)


def node_run(placement: NodePlacement) -> NodeRun:
    """A not-yet-started run of one node of a trial, planned by its trainer kind."""
    return NodeRun(placement, plan_node(placement))


def merge_results(spec: TrialSpec, results: Sequence[TrialResult]) -> TrialResult:
    """One trial's result from its nodes' (index = node rank), as its trainer kind sees it."""
    return kind_of(spec).merge(results)


__all__ = ["TRAINER_KINDS", "kind_of", "merge_results", "node_run", "plan_node", "uses_gpu"]
