"""The trainer-kind interface: what the space, the backends and the node agent need from a
kind of trainer, so that none of them knows the kinds (README, "Bringing your own trainer")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from parsearch.launch.process import NodeRun
from parsearch.result import TrialResult
from parsearch.trial import TrialSpec


class TrainerKind(Protocol):
    """One kind of trainer (``trainer.kind`` in a search space).

    * :meth:`validate` checks the space's ``trainer`` section once, when the space is loaded,
      through the kind's typed settings, and returns the plain dict a :class:`TrialSpec`
      carries to the ranks as JSON;
    * :meth:`node_run` plans one node's processes of a trial (argv, environment, files) as a
      not-yet-started :class:`NodeRun`, which launches and watches them and concludes the
      node's :class:`TrialResult` from what they left behind;
    * :meth:`merge` concludes the trial's result from its nodes' results.
    """

    name: str

    def validate(self, section: Mapping[str, Any], source: str) -> dict[str, Any]: ...

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
    ) -> NodeRun: ...

    def merge(self, results: Sequence[TrialResult]) -> TrialResult: ...
