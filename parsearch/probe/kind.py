"""A machine probe as a kind of trial: its ranks run :mod:`parsearch.probe.rank` instead of a
trainer, through the same backends and node agent (never offered to a space's ``trainer``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from parsearch.errors import SpaceError
from parsearch.launch.placement import NodePlacement
from parsearch.launch.plan import NodePlan
from parsearch.rank_program import rank_program_plan
from parsearch.result import TrialResult, TrialState


class ProbeKind:
    """Every rank runs the probe program; node 0's rank 0 writes the result."""

    name = "probe"

    def validate(self, section: Mapping[str, Any], source: str) -> dict[str, Any]:
        raise SpaceError("a probe is started by `parsearch probe`", source=source, field="trainer")

    def plan(self, placement: NodePlacement) -> NodePlan:
        # Rank 0 always writes its result: without one the probe failed, it is not "ok with
        # no figures" (the fit would find nothing to fit).
        return rank_program_plan(placement, "parsearch.probe.rank")

    def merge(self, results: Sequence[TrialResult]) -> TrialResult:
        """A failure if any node failed, else node 0's result (rank 0 wrote it)."""
        failed = [r for r in results if not r.ok and r.status is not TrialState.INTERRUPTED]
        return failed[0] if failed else results[0]
