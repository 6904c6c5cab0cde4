"""What a trial may run, found by its ``trainer.kind``: the space's trainer kinds
(:data:`parsearch.trainers.TRAINER_KINDS`) and the machine probe (`parsearch probe`), which a
trial may run but a space may not name. Backends plan a node's run at a placement with
:func:`node_run` and combine a multi-node trial's results with :func:`merge_results`, so none
of them knows the kinds.

It sits above both the trainers and the probe, since the probe's rank program trains the
built-in trainer's model: the registry inside ``trainers`` would make the two import each
other. Importing it starts nothing and imports no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from parsearch.launch.placement import NodePlacement
from parsearch.launch.plan import NodePlan
from parsearch.launch.process import NodeRun
from parsearch.probe.kind import ProbeKind
from parsearch.result import TrialResult
from parsearch.trainers import TRAINER_KINDS
from parsearch.trainers.base import TrainerKind
from parsearch.trial import TrialSpec

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
