"""The built-in trainer as a trainer kind (see :mod:`parsearch.trainers.base`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from parsearch.errors import SpaceError
from parsearch.launch.process import NodeRun
from parsearch.result import TrialResult, TrialState
from parsearch.trial import TrialSpec


class BuiltinKind:
    """Ranks run ``python -m parsearch.trainers.builtin`` (forked warm where it can); node 0's
    rank 0 writes the trial's result."""

    name = "builtin"

    def validate(self, section: Mapping[str, Any], source: str) -> dict[str, Any]:
        from parsearch.trainers.builtin.settings import validate_section

        return validate_section(
            section, lambda field, message: SpaceError(message, source=source, field=field)
        )

    def node_run(
        self,
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
        return NodeRun(
            spec,
            node_rank,
            nnodes,
            master_addr,
            master_port,
            trial_dir,
            env=dict(env or {}),
            grace_s=grace_s,
        )

    def merge(self, results: Sequence[TrialResult]) -> TrialResult:
        """A failure if any node failed, else node 0's result (rank 0 wrote it)."""
        failed = [r for r in results if not r.ok and r.status is not TrialState.INTERRUPTED]
        return failed[0] if failed else results[0]
