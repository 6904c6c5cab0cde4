"""Trainers other than the built-in benchmark: the command trainer and its log parsers.

:mod:`parsearch.trainers.command` runs a user's training program from a template filled with
the trial's layout; :mod:`parsearch.trainers.parsers` reads Megatron-LM, Megatron-DeepSpeed,
torchtitan, JSON or user-patterned logs; :mod:`parsearch.trainers.failures` recognises
out-of-memory failures. Importing this package starts nothing and imports no torch.

Backends pick the node run by the trial's trainer with :func:`node_run` and combine a
multi-node trial's results with :func:`merge_results`, so they need not know the kinds.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from parsearch.agent import RESULT_FILE, SPEC_FILE, NodeRun
from parsearch.result import TrialResult, TrialState
from parsearch.trial import TrialSpec


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
) -> NodeRun:
    """A not-yet-started run of one node of ``spec``, for its trainer kind (a machine probe,
    :mod:`parsearch.probe`, runs as a trial whose ranks run the probe program)."""
    if spec.trainer.get("kind") == "probe":
        command = [sys.executable, "-m", "parsearch.probe.rank", "--spec"]
        command += [str(Path(trial_dir).resolve() / SPEC_FILE)]
        command += ["--out", str(Path(trial_dir).resolve() / RESULT_FILE)]
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
    if spec.trainer.get("kind") == "command":
        from parsearch.trainers.command import CommandNodeRun

        return CommandNodeRun(
            spec, node_rank, nnodes, master_addr, master_port, trial_dir, env, grace_s
        )
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


def merge_results(spec: TrialSpec, results: Sequence[TrialResult]) -> TrialResult:
    """One trial's result from its nodes' (index = node rank): a failure if any node failed,
    else node 0's for the built-in trainer, or the last node with metrics for a command
    (Megatron prints from the last rank, which lives on the last node)."""
    if spec.trainer.get("kind") == "command":
        from parsearch.trainers.command import merge_node_results

        return merge_node_results(results)
    failed = [r for r in results if not r.ok and r.status is not TrialState.INTERRUPTED]
    return failed[0] if failed else results[0]
