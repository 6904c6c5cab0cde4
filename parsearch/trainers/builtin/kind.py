"""The built-in trainer as a trainer kind (see :mod:`parsearch.trainers.base`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from parsearch.config import ModelSpec, ParallelLayout
from parsearch.errors import SpaceError
from parsearch.launch.placement import NodePlacement
from parsearch.launch.plan import NodePlan
from parsearch.rank_program import rank_program_plan
from parsearch.result import TrialResult, TrialState
from parsearch.trainers.builtin.limits import unsupported

# What the warm fork server imports once for every rank it forks (torch and the trainer).
PRELOAD = (
    "parsearch.trainers.builtin.__main__",
    "parsearch.trainers.builtin.trainer",
    "torch.distributed._tools.mem_tracker",
)
ENTRY = "parsearch.trainers.builtin.__main__:run_and_exit"


class BuiltinKind:
    """Ranks run ``python -m parsearch.trainers.builtin`` (forked warm where they can);
    node 0's rank 0 writes the trial's result."""

    name = "builtin"

    def validate(self, section: Mapping[str, Any], source: str) -> dict[str, Any]:
        from parsearch.trainers.builtin.settings import validate_section

        return validate_section(
            section, lambda field, message: SpaceError(message, source=source, field=field)
        )

    def refusals(self, model: ModelSpec, layout: ParallelLayout) -> list[str]:
        return unsupported(model, layout)

    def plan(self, placement: NodePlacement) -> NodePlan:
        return rank_program_plan(
            placement, "parsearch.trainers.builtin", entry=ENTRY, preload=PRELOAD
        )

    def merge(self, results: Sequence[TrialResult]) -> TrialResult:
        """A failure if any node failed, else node 0's result (rank 0 wrote it)."""
        failed = [r for r in results if not r.ok and r.status is not TrialState.INTERRUPTED]
        return failed[0] if failed else results[0]
