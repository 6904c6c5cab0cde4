"""What ``parsearch serve`` answers, as plain JSON-ready data, computed from a read-only store.

No web framework here: each function opens the store read-only for one short read (so the
driver is never blocked for longer than a query, and a store on a shared filesystem works
from a login node), and returns the same figures the CLI prints: ``status`` is
``parsearch status --format json``, ``best`` and ``top`` are ``parsearch best/top --format
json``, the figures' tables are :mod:`parsearch.report.data`'s.
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from parsearch.best_known import Comparable, across_document, best_known, model_shape
from parsearch.config import DIMENSIONS_BY_NAME, LAYOUT_DIMENSIONS
from parsearch.errors import ParsearchError
from parsearch.estimate.flops import param_count
from parsearch.formats import format_layout, trial_document
from parsearch.inputs import MAX_BUDGET
from parsearch.query import CampaignProgress, campaign_status
from parsearch.result import TrialState
from parsearch.space import MAX_INT, space_from_dict
from parsearch.store import (
    Campaign,
    CampaignStatus,
    SQLiteStore,
    Store,
    TrialRecord,
    open_store,
)
from parsearch.trainer_flags import EXPORTERS
from parsearch.units import parse_bytes

# The most a count (top's k, a page's limit or offset) may be: as many trials as a budget.
MAX_COUNT = MAX_BUDGET
# Layout fields a trials query may filter on, and the values each may take, from the declared
# dimensions: an integer's range (a space file's integers end at MAX_INT), or the choices of
# an enumerated field. A value outside them could never match: it is a 400, not a [].
INT_FILTERS = {
    d.name: (d.minimum, MAX_INT if d.maximum is None else d.maximum)
    for d in LAYOUT_DIMENSIONS
    if d.kind == "int"
}
CHOICE_FILTERS = {d.name: d.choices for d in LAYOUT_DIMENSIONS if d.kind == "choice"}
BOOL_FILTERS = tuple(d.name for d in LAYOUT_DIMENSIONS if d.kind == "bool")
TRIAL_FILTERS = ("state", *INT_FILTERS, *CHOICE_FILTERS, *BOOL_FILTERS)
PAGE_PARAMS = {"limit": (1, MAX_COUNT), "offset": (0, MAX_COUNT)}
# Why a stored space no longer loads is cut to this in the campaigns' list.
MAX_SPACE_ERROR_CHARS = 300


def shown(value: Any, limit: int = 60) -> str:
    """``value`` as an error message quotes it: its repr, cut to ``limit`` characters (a
    70 KB query parameter is not echoed back)."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return repr(text) if isinstance(value, str) else text
    return f"{text[:limit]!r}… ({len(text)} characters)"


class NotFound(ParsearchError):
    """An unknown campaign or trial (HTTP 404)."""


class BadRequest(ParsearchError):
    """A malformed query parameter (HTTP 400)."""

    exit_code = 2


class SpaceUnloadable(ParsearchError):
    """A campaign whose stored space no longer loads (HTTP 409): a file it names (a machine
    profile beside its space file) was deleted or changed, or it is a space from an older
    release. What needs the space (the figures) cannot be answered; the campaign's status,
    best and trials, which need only the store, still are."""


def space_unloadable(campaign: Campaign, error: ParsearchError) -> SpaceUnloadable:
    """The error that names the campaign, where its space came from and what no longer
    loads (``error`` names the file or field), and says what still reads."""
    source = f" (from {campaign.space_path})" if campaign.space_path else ""
    return SpaceUnloadable(
        f"campaign '{campaign.name}': its stored space{source} no longer loads: {error}. "
        "Its figures need the space and are not drawn; its status, best and trials still "
        f"read (/api/campaigns/{campaign.name}/trials)"
    )


def plain(value: Any) -> Any:
    """``value`` as strict JSON: NaN and infinities become null, numpy scalars Python ones."""
    if isinstance(value, dict):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    if hasattr(value, "item") and not isinstance(value, str | bytes):  # numpy scalar
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is not None and type(value).__name__ in ("NAType", "NaTType"):
        return None
    return value


class StoreReader:
    """Opens the store read-only for each question, and closes it at once.

    A connection held open between requests would keep a file descriptor (and, on some
    network filesystems, a cached lock state) on the driver's file for the server's whole
    life; one per request costs well under a millisecond.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = path

    def open(self) -> SQLiteStore:
        return open_store(self.path, readonly=True)

    def campaigns(self) -> list[dict[str, Any]]:
        """Every campaign, newest first, as the front page lists it (:func:`listing`)."""
        now = time.time()
        with self.open() as store:
            found = sorted(store.list_campaigns(), key=lambda c: -c.created_at)
            return [listing(store, campaign, now) for campaign in found]


def listing(store: Store, campaign: Campaign, now: float) -> dict[str, Any]:
    """A campaign's line in a store of many: what it trains on what (:func:`described`),
    how far it got, its best trial, and ``live``: whether a driver runs it now (one marked
    running whose driver was killed is not live)."""
    running = campaign.status is CampaignStatus.RUNNING
    progress = CampaignProgress(
        campaign=campaign,
        counts=store.counts(campaign.id),
        best=store.best(campaign.id),
        rate_per_s=None,
        driver=store.lease_holder(campaign.id) if running else None,
        read_at=now,
    )
    best = progress.best
    source = campaign.space_path or campaign.name
    return {
        **campaign_summary(campaign),
        **described(json.dumps(campaign.space, sort_keys=True), source),
        "live": progress.live,
        "finished": progress.finished,
        "best": None
        if best is None
        else {
            "trial": best.number,
            "layout_short": best.layout.short(),
            "tokens_per_s": best.tokens_per_s,
            "fidelity": best.fidelity,
        },
    }


def parameters(count: int) -> str:
    """A parameter count as models are named: 175B, 1.01T, 124M."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= size:
            return f"{count / size:.3g}{unit}"
    return str(count)


@functools.lru_cache(maxsize=1024)
def described(space_json: str, source: str) -> dict[str, Any]:
    """The model and allocation of a stored space, in the list's words. A stored space never
    changes and loading one takes ~10 ms, so each is read once per server; one that no longer
    loads (a space from an older release) is listed with why, not left to fail the list."""
    raw = json.loads(space_json)
    try:
        space = space_from_dict(raw, source=source)
    except ParsearchError as error:
        model = raw.get("model") if isinstance(raw.get("model"), dict) else {}
        return {
            "model": {"name": str(model.get("name", "?"))[:80], "summary": None},
            "allocation": None,
            "space_error": str(error)[:MAX_SPACE_ERROR_CHARS],
        }
    m, a = space.model, space.allocation
    return {
        "model": {
            "name": m.name,
            "parameters": param_count(m),
            "summary": f"{parameters(param_count(m))} params: {model_shape(m)}",
        },
        "allocation": {
            "name": a.name,
            "nodes": a.nodes,
            "devices_per_node": a.devices_per_node,
            "device": a.device,
            "device_memory_bytes": a.device_memory_bytes,
            "peak_flops_per_device": a.peak_flops_per_device,
        },
        "space_error": None,
    }


def campaign_summary(campaign: Campaign) -> dict[str, Any]:
    return {
        "name": campaign.name,
        "status": campaign.status.value,
        "budget": campaign.budget,
        "backend": campaign.backend,
        "objective_metric": campaign.objective_metric,
        "created_at": campaign.created_at,
        "finished_at": campaign.finished_at,
    }


def find_campaign(store: SQLiteStore, name: str) -> Campaign:
    """The campaign called ``name``, or :class:`NotFound`: which neither names the store's
    path nor lists its campaigns (``/api/campaigns`` does, to whom may ask)."""
    for campaign in store.list_campaigns():
        if campaign.name == name:
            return campaign
    raise NotFound(f"no campaign {shown(name)} in this store; GET /api/campaigns lists them")


def status(store: SQLiteStore, campaign: Campaign) -> dict[str, Any]:
    """``parsearch status --format json``."""
    return plain(campaign_status(store, campaign))


def memory_cap(text: str | None) -> int | None:
    """``max_mem=60GiB`` (or bytes) as bytes."""
    if text is None:
        return None
    if len(text) > 40:
        raise BadRequest(
            f"query parameter 'max_mem': expected a size such as 60GiB or bytes, got "
            f"{shown(text, 20)}"
        )
    try:
        return parse_bytes(text)
    except ValueError as error:
        raise BadRequest(f"query parameter 'max_mem': {error}") from None


def best(store: SQLiteStore, campaign: Campaign, max_mem: str | None = None) -> dict[str, Any]:
    """``parsearch best --format json``; :class:`NotFound` before the first success."""
    cap = memory_cap(max_mem)
    record = store.best(campaign.id, max_mem_bytes=cap)
    if record is None:
        within = f" within max_mem={max_mem}" if cap is not None else ""
        raise NotFound(f"campaign '{campaign.name}' has no successful trial{within} yet")
    return plain(trial_document(record, campaign))


def best_exports(record: TrialRecord, campaign: Campaign) -> dict[str, dict[str, str | None]]:
    """The best layout in every trainer's format (``parsearch best --format F``); a layout
    a trainer cannot express carries the reason instead of text."""
    exports: dict[str, dict[str, str | None]] = {}
    for name in ("yaml", *EXPORTERS):
        try:
            exports[name] = {"text": format_layout(record, campaign, name), "error": None}
        except ParsearchError as error:
            exports[name] = {"text": None, "error": str(error)}
    return exports


def best_across(store: Store, campaign: Campaign, trainer: str | None) -> dict[str, Any]:
    """The best layout any campaign of the store found for this campaign's model on its
    allocation: ``parsearch best --like SPACE --format json`` with this campaign's space;
    :class:`NotFound`, saying what the store holds, when nothing compares."""
    try:
        space = space_from_dict(campaign.space, source=campaign.space_path or campaign.name)
    except ParsearchError as error:
        raise NotFound(
            f"campaign '{campaign.name}': its stored space no longer loads, so nothing can be "
            f"compared with it: {error}"
        ) from None
    known = best_known(store, Comparable.of(space), trainer=trainer)
    if not known.layouts:
        raise NotFound(known.nothing_comparable())
    return plain(across_document(known))


def top(
    store: SQLiteStore, campaign: Campaign, k: int, max_mem: str | None = None
) -> list[dict[str, Any]]:
    """``parsearch top -k K --format json``."""
    if not 1 <= k <= MAX_COUNT:
        raise BadRequest(f"query parameter 'k' must be >= 1 and <= {MAX_COUNT}, got {shown(k)}")
    records = store.top(campaign.id, k, max_mem_bytes=memory_cap(max_mem))
    return plain([trial_document(r, campaign) for r in records])


def pareto(store: SQLiteStore, campaign: Campaign) -> list[dict[str, Any]]:
    """The store's Pareto front (objective up, peak memory down), ordered by memory."""
    return plain([trial_document(r, campaign) for r in store.pareto(campaign.id)])


@dataclass(frozen=True)
class TrialFilter:
    """Which trials a ``/trials`` query wants: states and layout values, each a set."""

    states: frozenset[TrialState] | None
    layout: Mapping[str, frozenset[Any]]
    limit: int | None = None
    offset: int = 0

    def matches(self, record: TrialRecord) -> bool:
        # A trial stored before a dimension existed has that dimension at its default.
        return all(
            record.config.get(name, DIMENSIONS_BY_NAME[name].default) in values
            for name, values in self.layout.items()
        )


def trial_filter_parameters() -> list[dict[str, Any]]:
    """The ``/trials`` query parameters as OpenAPI describes them, one per declared layout
    dimension (read from :data:`LAYOUT_DIMENSIONS`, so a new dimension is filterable at
    once), then ``state``, ``limit`` and ``offset``."""

    def parameter(name: str, description: str) -> dict[str, Any]:
        schema = {"type": "string"}
        return {"name": name, "in": "query", "required": False, "schema": schema,
                "description": description}  # fmt: skip

    states = ",".join(s.value for s in TrialState)
    wanted = [parameter("state", f"comma list of {states}")]
    for d in LAYOUT_DIMENSIONS:
        values = {"int": "integers", "bool": "true or false"}.get(d.kind, ", ".join(d.choices))
        wanted.append(parameter(d.name, f"{d.help}: comma list of {values}"))
    wanted.append(parameter("limit", "at most this many trials"))
    wanted.append(parameter("offset", "skip this many first"))
    return wanted


def trial_filter(params: Mapping[str, str]) -> TrialFilter:
    """Parse ``state=ok,oom&tp=2,4&recompute=full&limit=50``; :class:`BadRequest` names the
    parameter and what is valid."""
    unknown = sorted(set(params) - {*TRIAL_FILTERS, *PAGE_PARAMS, "token"})
    if unknown:
        names = ", ".join(shown(name, 30).strip("'") for name in unknown[:5])
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise BadRequest(
            f"unknown query parameter(s) {names}{more}; valid: "
            f"{', '.join((*TRIAL_FILTERS, *PAGE_PARAMS))}"
        )
    states = None
    if "state" in params:
        valid = [s.value for s in TrialState]
        wanted = _values(params, "state")
        bad = [s for s in wanted if s not in valid]
        if bad:
            raise BadRequest(f"query parameter 'state': {shown(bad[0])} is not one of {valid}")
        states = frozenset(TrialState(s) for s in wanted)
    layout: dict[str, frozenset[Any]] = {}
    for name, (low, high) in INT_FILTERS.items():
        if name in params:
            layout[name] = frozenset(_integer(name, v, low, high) for v in _values(params, name))
    for name, choices in CHOICE_FILTERS.items():
        if name in params:
            layout[name] = frozenset(_choice(name, v, choices) for v in _values(params, name))
    for name in BOOL_FILTERS:
        if name in params:
            layout[name] = frozenset(_boolean(name, v) for v in _values(params, name))
    page = {
        name: _integer(name, params[name], *PAGE_PARAMS[name])
        for name in PAGE_PARAMS
        if name in params
    }
    return TrialFilter(
        states=states, layout=layout, limit=page.get("limit"), offset=page.get("offset", 0)
    )


def _values(params: Mapping[str, str], name: str) -> list[str]:
    values = [v.strip() for v in params[name].split(",") if v.strip()]
    if not values:
        raise BadRequest(f"query parameter {name!r} is empty; give one value or a comma list")
    return values


def _integer(name: str, text: str, low: int, high: int) -> int:
    """``text`` as an integer in ``[low, high]``: one that is no integer and one out of the
    range are told apart, and both messages give the range."""
    digits = text[1:] if text.startswith(("+", "-")) else text
    if not (digits.isascii() and digits.isdigit()):
        raise BadRequest(
            f"query parameter {name!r}: expected an integer from {low} to {high}, got {shown(text)}"
        )
    # Longer than the bound's digits is out of range, read or not: int() of a 4 KB string
    # is slow (and past 4300 digits refused).
    value = int(text) if len(digits) <= len(str(high)) else None
    if value is None or not low <= value <= high:
        raise BadRequest(
            f"query parameter {name!r} must be >= {low} and <= {high}, got {shown(text)} "
            "(out of range)"
        )
    return value


def _choice(name: str, text: str, choices: tuple[str, ...]) -> str:
    if text not in choices:
        raise BadRequest(f"query parameter {name!r}: {shown(text)} is not one of {list(choices)}")
    return text


def _boolean(name: str, text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise BadRequest(f"query parameter {name!r}: expected true or false, got {shown(text)}")


def trial_row(record: TrialRecord, campaign: Campaign) -> dict[str, Any]:
    """A trial for the table: its document, short layout, times and why it failed."""
    return {
        **trial_document(record, campaign),
        "layout_short": record.layout.short(),
        "origin": record.origin,
        "started_at": record.started_at,
        "finished_at": record.finished_at,
        "error": record.error,
    }


def trials(store: SQLiteStore, campaign: Campaign, wanted: TrialFilter) -> list[dict[str, Any]]:
    """The campaign's trials in order of number, filtered."""
    records = store.trials(campaign.id, states=wanted.states)
    chosen = [r for r in records if wanted.matches(r)]
    end = None if wanted.limit is None else wanted.offset + wanted.limit
    return plain([trial_row(r, campaign) for r in chosen[wanted.offset : end]])


def trial(store: SQLiteStore, campaign: Campaign, number: int) -> dict[str, Any]:
    """One trial whole: its row, key, hosts and the tail of its log."""
    for record in store.trials(campaign.id):
        if record.number == number:
            return plain(
                {**trial_row(record, campaign), "key": record.key, "log_tail": record.log_tail}
            )
    raise NotFound(f"campaign '{campaign.name}' has no trial #{number}")
