"""The trainer-kind interface: what the space, the backends and the node agent need from a
kind of trainer, so that none of them knows the kinds (docs/guide/trainers.md, "Bringing your
own trainer")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from parsearch.config import ModelSpec, ParallelLayout
from parsearch.launch.placement import NodePlacement
from parsearch.launch.plan import NodePlan
from parsearch.result import TrialResult


class TrainerKind(Protocol):
    """One kind of trainer (``trainer.kind`` in a search space).

    * :meth:`validate` checks the space's ``trainer`` section once, when the space is loaded,
      through the kind's typed settings, and returns the plain dict a :class:`TrialSpec`
      carries to the ranks as JSON;
    * :meth:`plan` plans one node's processes of a trial at a :class:`NodePlacement` (argv,
      environment, files, whether they may be forked from a warm server, and the
      conclusion that turns what they left behind into the node's :class:`TrialResult`);
      the node agent (:class:`parsearch.launch.process.NodeRun`) executes the plan;
    * :meth:`merge` concludes the trial's result from its nodes' results;
    * :meth:`refusals` says why the kind cannot run a layout that divides (what it does not
      implement), so the space refuses it before anything runs, as its ``exclude`` rules do.
    """

    name: str

    def validate(self, section: Mapping[str, Any], source: str) -> dict[str, Any]: ...

    def refusals(self, model: ModelSpec, layout: ParallelLayout) -> list[str]: ...

    def plan(self, placement: NodePlacement) -> NodePlan: ...

    def merge(self, results: Sequence[TrialResult]) -> TrialResult: ...
