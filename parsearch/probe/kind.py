"""A machine probe as a kind of trial: its ranks run :mod:`parsearch.probe.rank` instead of a
trainer, through the same backends and node agent (never offered to a space's ``trainer``)."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from parsearch.errors import SpaceError
from parsearch.launch.process import RESULT_FILE, SPEC_FILE, NodeRun
from parsearch.result import TrialResult, TrialState
from parsearch.trial import TrialSpec


class ProbeKind:
    """Every rank runs the probe program; node 0's rank 0 writes the result."""

    name = "probe"

    def validate(self, section: Mapping[str, Any], source: str) -> dict[str, Any]:
        raise SpaceError("a probe is started by `parsearch probe`", source=source, field="trainer")

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
        where = Path(trial_dir).resolve()
        command = [sys.executable, "-m", "parsearch.probe.rank", "--spec", str(where / SPEC_FILE)]
        command += ["--out", str(where / RESULT_FILE)]
        return NodeRun(
            spec,
            node_rank,
            nnodes,
            master_addr,
            master_port,
            trial_dir,
            command=command,
            env=dict(env or {}),
            grace_s=grace_s,
        )

    def merge(self, results: Sequence[TrialResult]) -> TrialResult:
        """A failure if any node failed, else node 0's result (rank 0 wrote it)."""
        failed = [r for r in results if not r.ok and r.status is not TrialState.INTERRUPTED]
        return failed[0] if failed else results[0]
