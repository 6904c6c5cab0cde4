"""What a finished trial reports, whatever ran it (built-in benchmark, user command, simulator).

A trial's state is an enum, as in optuna: the store, the driver and the reports match on it,
never on free-form strings.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any


class TrialState(str, enum.Enum):
    """Lifecycle of a trial in the store. The last six are terminal."""

    QUEUED = "queued"
    RUNNING = "running"
    OK = "ok"
    OOM = "oom"
    TIMEOUT = "timeout"
    ERROR = "error"
    INFEASIBLE = "infeasible"
    INTERRUPTED = "interrupted"

    @property
    def finished(self) -> bool:
        """Finished trials count against the budget and are never re-run."""
        return self in FINISHED_STATES

    @property
    def failed(self) -> bool:
        return self in (TrialState.OOM, TrialState.TIMEOUT, TrialState.ERROR, TrialState.INFEASIBLE)


FINISHED_STATES = frozenset(
    {TrialState.OK, TrialState.OOM, TrialState.TIMEOUT, TrialState.ERROR, TrialState.INFEASIBLE}
)


@dataclass
class TrialResult:
    """The structured outcome of one trial.

    ``metrics`` holds the measured figures with units in their names: ``tokens_per_s``,
    ``tflops_per_device``, ``mfu``, ``step_time_s``, ``peak_mem_bytes`` (max over ranks) and
    whatever else the trainer reports (per-rank peaks, losses, spreads).
    """

    status: TrialState
    metrics: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    log_tail: str = ""
    hosts: list[str] = field(default_factory=list)
    duration_s: float = 0.0

    def __post_init__(self) -> None:
        self.status = TrialState(self.status)

    @property
    def ok(self) -> bool:
        return self.status is TrialState.OK

    def objective(self, metric: str) -> float | str:
        """The value told to DeepHyper: the metric when ok, ``"F_<status>"`` otherwise."""
        if self.ok and metric in self.metrics and self.metrics[metric] is not None:
            return float(self.metrics[metric])
        return f"F_{self.status.value}"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialResult:
        return cls(
            status=TrialState(data["status"]),
            metrics=dict(data.get("metrics") or {}),
            error=data.get("error"),
            log_tail=data.get("log_tail") or "",
            hosts=list(data.get("hosts") or []),
            duration_s=float(data.get("duration_s") or 0.0),
        )
