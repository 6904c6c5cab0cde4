"""What the store hands back: plain, frozen snapshots of a campaign and of a trial.

Records are read-only copies, not live rows: a driver that wants a change asks the store, which
writes it in one transaction and hands back a fresh record. JSON columns are decoded here, once,
so no caller ever parses store text.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from parsearch.config import ParallelLayout
from parsearch.errors import StoreError
from parsearch.result import TrialState


class CampaignStatus(str, enum.Enum):
    """Lifecycle of a campaign; the driver moves it, ``parsearch status`` shows it."""

    CREATED = "created"
    RUNNING = "running"
    STOPPED = "stopped"
    FINISHED = "finished"


@dataclass(frozen=True)
class Campaign:
    """One search: its space as loaded, how it runs and what it optimises."""

    id: int
    name: str
    space: dict[str, Any]
    space_path: str | None
    seed: int
    budget: int | None
    backend: str
    settings: dict[str, Any]
    versions: dict[str, str]
    objective_metric: str
    created_at: float
    finished_at: float | None
    status: CampaignStatus
    # Why and when it last stopped short of its budget (an error, a signal, its timeout);
    # ``None`` while a driver runs it and once it finished.
    stop_reason: str | None = None
    stopped_at: float | None = None


@dataclass(frozen=True)
class LeaseHolder:
    """The driver that holds a campaign's lease: who runs it, and when it last said so."""

    owner: str
    host: str
    pid: int
    acquired_at: float
    heartbeat_at: float
    generation: int = 0
    stale_after_s: float | None = None


@dataclass(frozen=True, slots=True)
class TrialRecord:
    """One layout of a campaign and everything recorded about it.

    ``objective``, ``tokens_per_s`` and ``peak_mem_bytes`` are copies of figures in
    ``metrics`` kept as columns so that best / top / Pareto queries use an index;
    ``objective`` is set for ok trials only. ``proxy_dp`` is set for a proxy trial: it ran
    ``layout`` on ``proxy_dp`` data-parallel replicas, and its ``metrics`` (``objective``...)
    are full-scale figures *predicted* from that run (``metrics["fidelity"]`` holds what it
    measured); ``None`` for a trial measured at full scale.
    """

    id: int
    campaign_id: int
    number: int
    key: str
    config: dict[str, Any]
    state: TrialState
    attempt: int
    origin: str
    created_at: float
    started_at: float | None
    finished_at: float | None
    duration_s: float | None
    hosts: list[str]
    metrics: dict[str, Any]
    objective: float | None
    tokens_per_s: float | None
    peak_mem_bytes: float | None
    predicted: dict[str, Any] | None
    error: str | None
    log_tail: str
    proxy_dp: int | None = None

    @property
    def layout(self) -> ParallelLayout:
        return ParallelLayout.from_dict(self.config)

    @property
    def fidelity(self) -> str:
        """``full`` (figures measured at full scale) or ``proxy`` (predicted from a proxy)."""
        return "full" if self.proxy_dp is None else "proxy"

    @property
    def run_layout(self) -> ParallelLayout:
        """The layout the trial runs: ``layout``, at ``proxy_dp`` replicas for a proxy."""
        layout = self.layout
        return layout if self.proxy_dp is None else dataclasses.replace(layout, dp=self.proxy_dp)


def fidelity_note(record: TrialRecord) -> str:
    """How a trial's figures were obtained, in the words every reader prints: measured at
    full scale, or predicted from a proxy (whose own figures are ``metrics["fidelity"]``)."""
    if record.proxy_dp is None:
        return "measured at full scale"
    nodes = (record.metrics.get("fidelity") or {}).get("nodes")
    where = f" on {nodes} node{'s' if nodes != 1 else ''}" if nodes else ""
    return f"predicted from a proxy at dp{record.proxy_dp}{where}, not measured at full scale"


# The tables' columns carry the records' field names, so each SELECT list is derived from
# its dataclass and a row maps onto a record by position.
_CAMPAIGN_FIELDS = [field.name for field in dataclasses.fields(Campaign)]
CAMPAIGN_COLUMNS = ", ".join(_CAMPAIGN_FIELDS)
_TRIAL_FIELDS = [field.name for field in dataclasses.fields(TrialRecord)]
TRIAL_COLUMNS = ", ".join(_TRIAL_FIELDS)
_TRIAL_JSON = [_TRIAL_FIELDS.index(name) for name in ("config", "hosts", "metrics", "predicted")]
_TRIAL_STATE = _TRIAL_FIELDS.index("state")
_STATES = {state.value: state for state in TrialState}


def campaign_from_row(row: Sequence[Any]) -> Campaign:
    """A record from a row selected as :data:`CAMPAIGN_COLUMNS`."""
    values = dict(zip(_CAMPAIGN_FIELDS, row, strict=True))
    for name in ("space", "settings", "versions"):
        values[name] = json.loads(values[name])
    values["status"] = CampaignStatus(values["status"])
    return Campaign(**values)


def decode_json_column(texts: Iterable[str | None]) -> list[Any]:
    """Decode many JSON column values (NULL as ``None``) with one parser call.

    One ``json.loads`` per value spends more time entering the decoder than decoding; at
    100 000 trials one call over a JSON array is about twice as fast.
    """
    return json.loads("[" + ",".join("null" if text is None else text for text in texts) + "]")


def trials_from_rows(rows: Sequence[Sequence[Any]]) -> list[TrialRecord]:
    """Records from rows selected as :data:`TRIAL_COLUMNS`."""
    decoded = [decode_json_column(row[i] for row in rows) for i in _TRIAL_JSON]
    records = []
    for row, *json_values in zip(rows, *decoded, strict=True):
        values = list(row)
        for i, value in zip(_TRIAL_JSON, json_values, strict=True):
            values[i] = value
        values[_TRIAL_STATE] = _STATES[values[_TRIAL_STATE]]
        records.append(TrialRecord(*values))
    return records


def to_json(value: Any, what: str) -> str:
    """Encode ``value`` for a JSON column; numpy scalars and arrays become plain numbers/lists.

    Trainers report numpy figures more often than not; refusing them would lose a finished
    trial's result, so they are converted rather than rejected.
    """

    def plain(obj: Any) -> Any:
        if callable(getattr(obj, "tolist", None)):  # numpy (and torch) scalars and arrays
            return obj.tolist()
        raise TypeError(f"{type(obj).__name__} is not JSON serialisable")

    try:
        return json.dumps(value, sort_keys=True, default=plain)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"cannot store {what}: {exc}") from exc
