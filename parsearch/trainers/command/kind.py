"""The command trainer as a trainer kind (see :mod:`parsearch.trainers.base`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from parsearch.config import ModelSpec, ParallelLayout
from parsearch.launch.placement import NodePlacement
from parsearch.launch.plan import NodePlan
from parsearch.result import TrialResult


class CommandKind:
    """The user's program from a filled template; metrics parsed from its log."""

    name = "command"

    def validate(self, section: Mapping[str, Any], source: str) -> dict[str, Any]:
        from parsearch.trainers.command.trainer import validate_section

        return validate_section(section, source)

    def refusals(self, model: ModelSpec, layout: ParallelLayout) -> list[str]:
        """None of its own: what a user's trainer refuses, its space says (``exclude``)."""
        return []

    def plan(self, placement: NodePlacement) -> NodePlan:
        from parsearch.trainers.command.trainer import CommandNode

        return CommandNode(placement).plan()

    def merge(self, results: Sequence[TrialResult]) -> TrialResult:
        """A failure if any node failed (the most telling), else the last node's metrics
        (Megatron prints from the last rank, which lives on the last node)."""
        from parsearch.trainers.command.trainer import merge_node_results

        return merge_node_results(results)
