"""The command trainer as a trainer kind (see :mod:`parsearch.trainers.base`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from parsearch.launch.process import NodeRun
from parsearch.result import TrialResult
from parsearch.trial import TrialSpec


class CommandKind:
    """The user's program from a filled template; metrics parsed from its log."""

    name = "command"

    def validate(self, section: Mapping[str, Any], source: str) -> dict[str, Any]:
        from parsearch.trainers.command.trainer import validate_section

        return validate_section(section, source)

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
        from parsearch.trainers.command.trainer import CommandNodeRun

        return CommandNodeRun(
            spec, node_rank, nnodes, master_addr, master_port, trial_dir, env, grace_s, hosts
        )

    def merge(self, results: Sequence[TrialResult]) -> TrialResult:
        """A failure if any node failed (the most telling), else the last node's metrics
        (Megatron prints from the last rank, which lives on the last node)."""
        from parsearch.trainers.command.trainer import merge_node_results

        return merge_node_results(results)
