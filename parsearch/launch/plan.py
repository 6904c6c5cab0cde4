"""What a trainer kind asks the node agent to run on one node: the processes' command,
environment and files, whether they may be forked warm, and how the node's result is
concluded from what they left behind. The agent (:class:`parsearch.launch.process.NodeRun`)
executes a plan knowing no trainer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from parsearch.result import TrialResult

if TYPE_CHECKING:
    from parsearch.launch.process import NodeRun


@dataclass(frozen=True)
class WarmStart:
    """The processes may be forked from a warm server (:mod:`parsearch.launch.prefork`)
    that imported ``preload`` once, instead of started as ``argv``: a forked process calls
    ``entry`` (``"module:function"``) with ``args``, and must behave as ``argv`` would."""

    preload: tuple[str, ...]
    entry: str
    args: tuple[str, ...]


class Conclusion(Protocol):
    """How a trainer kind turns the agent's verdict on a node (exit codes, timeouts,
    out-of-memory lines; ``ok`` when every process exited 0) into the node's result."""

    def conclude(self, run: NodeRun, verdict: TrialResult) -> TrialResult: ...


@dataclass(frozen=True)
class NodePlan:
    """One node's processes of a trial.

    ``argv``: each process's command; ``env``: added to every process's environment (the
    launcher variables ``RANK``, ``MASTER_ADDR``, ... are the agent's, then ``drop_env``
    removes any of them); ``files``: written into the trial directory (name -> text) before
    the processes start; ``cwd``: where they start (default: the trial directory), named
    ``cwd_field`` in an error; ``bind_devices``: each process sees one device (by local
    rank) of those visible; ``per_node``: one process for the node (logged as
    ``rank<node_rank>.log``) instead of one per rank; ``warm``: may be forked warm;
    ``conclusion``: concludes the node's result (default: the agent's verdict)."""

    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    cwd_field: str = "cwd"
    bind_devices: bool = False
    drop_env: tuple[str, ...] = ()
    per_node: bool = False
    warm: WarmStart | None = None
    conclusion: Conclusion | None = None
