"""A trial as it travels from the driver to a backend, a node agent and a trainer.

It is plain data (JSON round-trip) because it crosses process, MPI and Ray boundaries.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from parsearch.config import AllocationSpec, ModelSpec, ParallelLayout


def nodes_spanned(layout: ParallelLayout, allocation: AllocationSpec) -> int:
    """Nodes of ``allocation`` a trial of ``layout`` spans (a proxy fewer than the whole)."""
    return max(1, -(-layout.world_size // allocation.devices_per_node))


@dataclass
class TrialSpec:
    """Everything a worker needs to run one layout, and nothing about the search.

    ``trainer`` is the space's trainer section as loaded (``kind`` is ``"builtin"`` or
    ``"command"``, plus its settings such as ``steps``, ``warmup_steps``, ``schedule``).
    ``nodes`` is how many nodes of ``allocation.devices_per_node`` devices the trial spans.
    ``memory_cap_bytes`` is the space's ``memory_cap``: a trial measured above it is ``oom``.
    ``launch_dir`` is the directory the campaign was created in (``{launch_dir}``), kept with
    the campaign so a ``resume`` from elsewhere runs the same commands; ``None``: the current
    directory (a single ``parsearch trial``, or a campaign older than the field).
    """

    trial_id: str
    model: ModelSpec
    layout: ParallelLayout
    allocation: AllocationSpec
    trainer: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = 600.0
    seed: int = 0
    memory_cap_bytes: int | None = None
    launch_dir: str | None = None

    @property
    def nodes(self) -> int:
        return nodes_spanned(self.layout, self.allocation)

    @property
    def ranks_per_node(self) -> int:
        return min(self.layout.world_size, self.allocation.devices_per_node)

    def to_dict(self) -> dict[str, Any]:
        return {
            "trial_id": self.trial_id,
            "model": dataclasses.asdict(self.model),
            "layout": self.layout.to_dict(),
            "allocation": dataclasses.asdict(self.allocation),
            "trainer": dict(self.trainer),
            "timeout_s": self.timeout_s,
            "seed": self.seed,
            "memory_cap_bytes": self.memory_cap_bytes,
            "launch_dir": self.launch_dir,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialSpec:
        return cls(
            trial_id=str(data["trial_id"]),
            model=ModelSpec(**data["model"]),
            layout=ParallelLayout.from_dict(data["layout"]),
            allocation=AllocationSpec(**data["allocation"]),
            trainer=dict(data.get("trainer") or {}),
            timeout_s=float(data.get("timeout_s", 600.0)),
            seed=int(data.get("seed", 0)),
            memory_cap_bytes=data.get("memory_cap_bytes"),
            launch_dir=data.get("launch_dir"),
        )

    @classmethod
    def from_json(cls, text: str) -> TrialSpec:
        return cls.from_dict(json.loads(text))
