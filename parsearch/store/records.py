"""What the store hands back: plain, frozen snapshots of a campaign and of a trial.

Records are read-only copies, not live rows: a driver that wants a change asks the store, which
writes it in one transaction and hands back a fresh record. JSON columns are decoded here, once,
so no caller ever parses store text.

Every value is also checked here against what the store itself writes (:func:`_checked`):
a row changed by hand, by another program or by a flipped byte SQLite still reads (text where
a number belongs, JSON of the wrong shape or none at all, an unknown state, a layout that is
no layout) is a :class:`~parsearch.errors.StoreError` naming the campaign or trial, the
column and the value, never a traceback in ``status`` or a wrong decision in ``resume``.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from parsearch.config import ParallelLayout
from parsearch.errors import ParsearchError, StoreError
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
        try:
            return ParallelLayout.from_dict(self.config)
        except (ParsearchError, TypeError, ValueError, OverflowError) as error:
            raise _damaged(
                f"trial #{self.number}", "config", f"{_shown(self.config)}: {error}"
            ) from None

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


class DamagedRowError(StoreError):
    """A row holds a value the store never writes (see the module docstring)."""


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# What each column may hold, as the store writes it: (kinds, may be NULL).
_INT, _NUMBER, _TEXT = "integer", "number", "text"
_CAMPAIGN_KINDS: dict[str, tuple[str, bool]] = {
    "id": (_INT, False),
    "name": (_TEXT, False),
    "space_path": (_TEXT, True),
    "seed": (_INT, False),
    "budget": (_INT, True),
    "backend": (_TEXT, False),
    "objective_metric": (_TEXT, False),
    "created_at": (_NUMBER, False),
    "finished_at": (_NUMBER, True),
    "stop_reason": (_TEXT, True),
    "stopped_at": (_NUMBER, True),
}
_TRIAL_KINDS: dict[str, tuple[str, bool]] = {
    "id": (_INT, False),
    "campaign_id": (_INT, False),
    "number": (_INT, False),
    "key": (_TEXT, False),
    "attempt": (_INT, False),
    "origin": (_TEXT, False),
    "created_at": (_NUMBER, False),
    "started_at": (_NUMBER, True),
    "finished_at": (_NUMBER, True),
    "duration_s": (_NUMBER, True),
    "objective": (_NUMBER, True),
    "tokens_per_s": (_NUMBER, True),
    "peak_mem_bytes": (_NUMBER, True),
    "error": (_TEXT, True),
    "log_tail": (_TEXT, False),
    "proxy_dp": (_INT, True),
}


def _checked(kind: str, nullable: bool, value: Any) -> str | None:
    """Why ``value`` cannot be in a column of ``kind``, or ``None``."""
    if value is None:
        return None if nullable else "NULL where a value is required"
    if kind == _TEXT:
        return None if isinstance(value, str) else f"{_shown(value)} where text belongs"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return f"{_shown(value)} where a number belongs"
    if kind == _INT and not isinstance(value, int):
        return f"{_shown(value)} where an integer belongs"
    if kind == _NUMBER and not math.isfinite(value):
        return f"{value} where a finite number belongs"
    return None


def _damaged(where: str, column: str, why: str) -> DamagedRowError:
    return DamagedRowError(
        f"{where} is damaged: its {column} holds {why} (changed by hand or by another "
        "program?); restore the store from a copy, or delete that row"
    )


def _decoded(text: Any, where: str, column: str, shape: type, nullable: bool = False) -> Any:
    """One JSON column's value, checked to be of ``shape`` (dict or list)."""
    if text is None:
        if nullable:
            return None
        raise _damaged(where, column, "NULL where JSON belongs")
    try:
        value = json.loads(text)
    except (TypeError, ValueError, RecursionError):
        raise _damaged(where, column, f"{_shown(text)}, which is not JSON") from None
    if not isinstance(value, shape):
        raise _damaged(where, column, f"{_shown(value)} where a JSON {shape.__name__} belongs")
    return value


# The session settings a campaign stores (parsearch.campaign.session.CampaignSettings), by the
# types it writes, so a resume never meets a slot count that is text.
_OPTIONAL_TEXT = (str, type(None))
_SECONDS = (int, float, type(None))
_SETTINGS_KINDS: dict[str, tuple[type, ...]] = {
    "backend": (str,),
    "backend_options": (dict,),
    "slots": (int, type(None)),
    "strategy": (str,),
    "keep_predicted_oom": (bool,),
    "warm_start": _OPTIONAL_TEXT,
    "warm_start_name": _OPTIONAL_TEXT,
    "timeout_s": _SECONDS,
    "grace_s": (int, float),
    "lease_timeout_s": (int, float),
    "machine": _OPTIONAL_TEXT,
    "proxy": (bool,),
    "settle": (bool,),
}


def campaign_from_row(row: Sequence[Any]) -> Campaign:
    """A record from a row selected as :data:`CAMPAIGN_COLUMNS`."""
    values = dict(zip(_CAMPAIGN_FIELDS, row, strict=True))
    name = values.get("name")
    where = f"campaign {name!r}" if isinstance(name, str) else f"campaign row {values.get('id')}"
    for column, (kind, nullable) in _CAMPAIGN_KINDS.items():
        why = _checked(kind, nullable, values[column])
        if why is not None:
            raise _damaged(where, column, why)
    for column in ("space", "settings", "versions"):
        values[column] = _decoded(values[column], where, column, dict)
    # The backend column is the one the campaign runs on; settings that lost theirs (a hand
    # edit left `{}`) must not send a resume to another backend (the local default).
    values["settings"].setdefault("backend", values["backend"])
    for key, value in values["settings"].items():
        kinds = _SETTINGS_KINDS.get(key)
        if kinds is not None and (type(value) not in kinds or value != value):  # NaN too
            raise _damaged(where, "settings", f"{key} = {_shown(value)}")
    try:
        values["status"] = CampaignStatus(values["status"])
    except ValueError:
        valid = ", ".join(status.value for status in CampaignStatus)
        raise _damaged(where, "status", f"{_shown(values['status'])}, not one of {valid}") from None
    return Campaign(**values)


def decode_json_column(texts: Iterable[str | None]) -> list[Any]:
    """Decode many JSON column values (NULL as ``None``) with one parser call.

    One ``json.loads`` per value spends more time entering the decoder than decoding; at
    100 000 trials one call over a JSON array is about twice as fast. A value that is not
    one JSON value (a hand edit: ``{}, {}`` or ``garbage``) would break or shift the array:
    then each is decoded alone, and one that is not JSON is ``None``.
    """
    texts = list(texts)
    try:
        values = json.loads(
            "[" + ",".join("null" if text is None else text for text in texts) + "]"
        )
        if isinstance(values, list) and len(values) == len(texts):
            return values
    except (TypeError, ValueError, RecursionError):
        pass
    return [_lenient(text) for text in texts]


def _lenient(text: Any) -> Any:
    try:
        return None if text is None else json.loads(text)
    except (TypeError, ValueError, RecursionError):
        return None


def trials_from_rows(rows: Sequence[Sequence[Any]]) -> list[TrialRecord]:
    """Records from rows selected as :data:`TRIAL_COLUMNS`."""
    decoded = [decode_json_column(row[i] for row in rows) for i in _TRIAL_JSON]
    records = []
    for row, *json_values in zip(rows, *decoded, strict=True):
        values = list(row)
        for i, value in zip(_TRIAL_JSON, json_values, strict=True):
            values[i] = value
        _check_trial(row, values)
        values[_TRIAL_STATE] = _STATES[values[_TRIAL_STATE]]
        records.append(TrialRecord(*values))
    return records


_JSON_SHAPES = {"config": (dict, False), "hosts": (list, False), "metrics": (dict, False),
                "predicted": (dict, True)}  # fmt: skip
# The fast test of a value's type per column (full message from _checked when it fails).
_FAST = {_INT: (int,), _NUMBER: (int, float), _TEXT: (str,)}
_TRIAL_FAST = [
    (_TRIAL_FIELDS.index(column), _FAST[kind] + ((type(None),) if nullable else ()), kind)
    for column, (kind, nullable) in _TRIAL_KINDS.items()
]
_TRIAL_FAST += [
    (_TRIAL_FIELDS.index(column), (shape, type(None)) if nullable else (shape,), "json")
    for column, (shape, nullable) in _JSON_SHAPES.items()
]
_HOSTS = _TRIAL_FIELDS.index("hosts")
_FIGURES = (_TRIAL_FIELDS.index("metrics"), _TRIAL_FIELDS.index("predicted"))
# Figures every reader formats as numbers, in metrics and predicted (None: not measured).
NUMERIC_FIGURES = ("tokens_per_s", "step_time_s", "tflops_per_device", "mfu", "peak_mem_bytes")
_FIGURE_TYPES = (int, float, type(None))


def _figures_problem(figures: dict[str, Any] | None) -> str | None:
    for name in NUMERIC_FIGURES:
        if figures and type(figures.get(name)) not in _FIGURE_TYPES:
            return f"{name} = {_shown(figures[name])} where a number belongs"
    return None


def _check_trial(row: Sequence[Any], values: list[Any]) -> None:
    """Raise :class:`DamagedRowError` for a trial row the store never writes (a type test per
    column on the way: 100 000 rows cost a fraction of their decoding)."""
    for index, types, kind in _TRIAL_FAST:
        value = values[index]
        if type(value) not in types or (
            kind == _NUMBER and type(value) is float and not math.isfinite(value)
        ):
            break
    else:
        if (
            values[_TRIAL_STATE] in _STATES
            and all(type(h) is str for h in values[_HOSTS])
            and not any(_figures_problem(values[i]) for i in _FIGURES)
        ):
            return
    fields = dict(zip(_TRIAL_FIELDS, values, strict=True))
    number = fields["number"]
    where = f"trial #{number}" if type(number) is int else f"trial row {fields['id']}"
    for column, (kind, nullable) in _TRIAL_KINDS.items():
        why = _checked(kind, nullable, fields[column])
        if why is not None:
            raise _damaged(where, column, why)
    for column, (shape, nullable) in _JSON_SHAPES.items():
        value = fields[column]
        if (value is None and not nullable) or (value is not None and not isinstance(value, shape)):
            text = row[_TRIAL_FIELDS.index(column)]
            _decoded(text, where, column, shape, nullable)  # raises, saying why
            raise _damaged(where, column, f"{_shown(value)} where JSON belongs")
    if fields["state"] not in _STATES:
        valid = ", ".join(_STATES)
        raise _damaged(where, "state", f"{_shown(fields['state'])}, not one of {valid}")
    for column in ("metrics", "predicted"):
        why = _figures_problem(fields[column])
        if why is not None:
            raise _damaged(where, column, why)
    raise _damaged(where, "hosts", f"{_shown(fields['hosts'])}, not a list of host names")


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
