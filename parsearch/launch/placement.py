"""Where one node's share of a trial runs: the one value a backend hands to a trainer kind
and to the node agent, instead of the same arguments passed through every layer."""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from parsearch.tempdirs import owned_path
from parsearch.trial import TrialSpec

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class NodePlacement:
    """Node ``node_rank`` of ``nnodes`` of ``spec``, meeting the others at
    ``master_addr:master_port``, with its logs and files in ``trial_dir``.

    ``env``: the backend's own variables for the node's processes (e.g. a local slot's
    devices), which win over a trainer's; ``grace_s``: how long the other ranks may keep
    running after one failed; ``hosts``: the trial's nodes, node 0 first, where the backend
    knows them (a command trainer's ``{hosts}`` and ``{hostfile}``); with a rendezvous on
    the loopback address every node runs on this host, so that is the default there (a
    single ``parsearch trial`` writes the host file a campaign would)."""

    spec: TrialSpec
    node_rank: int
    nnodes: int
    master_addr: str
    master_port: int
    trial_dir: Path
    env: Mapping[str, str] = field(default_factory=dict)
    grace_s: float = 3.0
    hosts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "trial_dir", Path(self.trial_dir))
        object.__setattr__(self, "env", dict(self.env))
        hosts = tuple(self.hosts)
        if not hosts and self.master_addr in LOOPBACK:  # every node of the trial runs here
            hosts = (socket.gethostname(),) * self.nnodes
        object.__setattr__(self, "hosts", hosts)

    @cached_property
    def scratch_dir(self) -> Path:
        """The node's scratch directory for the trial, under ``TMPDIR`` of the process that
        runs the node (node-local where ``TMPDIR`` is), named after the trial and node: the
        node agent makes it before the ranks start and removes it when they end, whatever
        the outcome (a command trainer's ``{trial_tmp}``, the ranks' ``PARSEARCH_TRIAL_TMP``).
        """
        return owned_path("trial", f"{self.spec.trial_id}-n{self.node_rank}")

    def global_ranks(self) -> range:
        """The trial's ranks this node runs (the layout's, ``ranks_per_node`` a node)."""
        per_node = self.spec.ranks_per_node
        first = self.node_rank * per_node
        return range(first, min(first + per_node, self.spec.layout.world_size))
