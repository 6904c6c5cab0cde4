"""The dashboard's figures as data: the report's own tables (:mod:`parsearch.report.data`),
so a cell of the live heat map and a cell of ``parsearch report``'s PNG are the same number.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from parsearch.errors import ParsearchError
from parsearch.report.data import (
    METRIC_LABELS,
    Accuracy,
    ReportData,
    accuracy,
    convergence,
    tp_pp_grid,
)
from parsearch.serve import views
from parsearch.serve.views import SpaceUnloadable, plain, space_unloadable
from parsearch.space import SearchSpace, space_from_dict
from parsearch.store import Campaign, SQLiteStore

LOG = logging.getLogger("parsearch.serve")
# The dashboard's table holds the newest trials (a 1T rehearsal may have thousands);
# /trials serves them all.
TABLE_ROWS = 2000
# The estimate's figures the dashboard compares with measurements.
FIDELITY_METRICS = ("peak_mem_bytes",)


@functools.lru_cache(maxsize=32)
def _space(campaign_id: int, created_at: float, space_json: str, source: str) -> SearchSpace:
    """A campaign's space never changes once stored: load (and plan) it once per server."""
    space = space_from_dict(json.loads(space_json), source=source)
    space.plan()  # cached on the space; the heat map needs it on every poll
    return space


def campaign_space(campaign: Campaign) -> SearchSpace:
    """The campaign's space, planned (seconds for a 175B space; once per server);
    :class:`SpaceUnloadable`, naming what is missing, when it no longer loads."""
    try:
        return _space(
            campaign.id,
            campaign.created_at,
            json.dumps(campaign.space, sort_keys=True),
            campaign.space_path or campaign.name,
        )
    except SpaceUnloadable:
        raise
    except ParsearchError as error:  # not cached: a profile put back loads on the next poll
        raise space_unloadable(campaign, error) from None


def report_data(store: SQLiteStore, campaign: Campaign) -> ReportData:
    """The campaign as ``parsearch report`` reads it, from one short read of its trials."""
    space = campaign_space(campaign)
    return ReportData(campaign=campaign, space=space, trials=store.dataframe(campaign.id))


def convergence_rows(data: ReportData) -> list[dict[str, Any]]:
    """Best objective after each finished trial, in finish order (``convergence.png``)."""
    return plain(convergence(data).to_dict(orient="records"))


def heatmap(data: ReportData) -> dict[str, Any]:
    """TP x PP cells with their best objective or why they have none (``tp_pp_heatmap.png``)."""
    grid = tp_pp_grid(data)
    best = data.best_layout()
    return {
        "tp": plain(list(data.space.dimensions["tp"])),
        "pp": plain(list(data.space.dimensions["pp"])),
        "best": None if best is None else {"tp": best.tp, "pp": best.pp},
        "cells": plain(grid.to_dict(orient="records")),
    }


def _accuracy_document(found: Accuracy) -> dict[str, Any]:
    return plain(
        {
            "metric": found.metric,
            "n": found.n,
            "median_ratio": found.median_ratio,
            "q25_ratio": found.q25_ratio,
            "q75_ratio": found.q75_ratio,
            "mean_abs_pct_error": found.mean_abs_pct_error,
            "spearman": found.spearman,
            "caption": found.caption(),
            "pairs": found.pairs.to_dict(orient="records"),
        }
    )


def fidelity(data: ReportData) -> dict[str, Any]:
    """Predicted vs measured for the objective and peak memory (``predicted_vs_measured.png``):
    median measured/predicted ratio, its IQR, mean error and rank correlation."""
    metrics = dict.fromkeys((data.objective, *FIDELITY_METRICS))
    return {metric: _accuracy_document(accuracy(data, metric)) for metric in metrics}


def figure_bundle(store: SQLiteStore, campaign: Campaign) -> dict[str, Any]:
    """Everything the dashboard draws besides the status: best layout in every format,
    convergence, heat map, Pareto front, fidelity and the trials table.

    A campaign whose stored space no longer loads still gets what needs only the store
    (best, Pareto front, trials: a user opening it wants to see what it measured), with the
    figures that need the space ``None`` and ``space_error`` saying why."""
    record = store.best(campaign.id)
    records = store.trials(campaign.id)
    try:
        data = report_data(store, campaign)
    except SpaceUnloadable as error:
        return {
            "space_error": str(error),
            "objective_label": METRIC_LABELS.get(
                campaign.objective_metric, campaign.objective_metric
            ),
            "memory_limit_bytes": None,
            "dimensions": {},
            "best": None if record is None else plain(views.trial_row(record, campaign)),
            "exports": None if record is None else views.best_exports(record, campaign),
            "convergence": None,
            "heatmap": None,
            "pareto": views.pareto(store, campaign),
            "fidelity": None,
            "trials": plain([views.trial_row(r, campaign) for r in records[-TABLE_ROWS:]]),
            "trials_total": len(records),
        }
    return {
        "space_error": None,
        "objective_label": data.objective_label,
        "memory_limit_bytes": data.memory_limit_bytes,
        # The searched dimensions and their values: parallel coordinates' axes, the
        # table's filters.
        "dimensions": {name: plain(list(values)) for name, values in data.space.searched.items()},
        "best": None if record is None else plain(views.trial_row(record, campaign)),
        "exports": None if record is None else views.best_exports(record, campaign),
        "convergence": convergence_rows(data),
        "heatmap": heatmap(data),
        "pareto": views.pareto(store, campaign),
        "fidelity": fidelity(data),
        "trials": plain([views.trial_row(r, campaign) for r in records[-TABLE_ROWS:]]),
        "trials_total": len(records),
    }


@dataclass
class _Entry:
    fingerprint: tuple
    bundle: dict[str, Any]
    computed_at: float
    refreshing: bool = False
    _json: str | None = None

    @property
    def whole(self) -> bool:
        """Whether every figure is in it (the campaign's stored space loaded)."""
        return not self.bundle.get("space_error")

    def json_members(self) -> str:
        """The bundle as JSON object members (no braces), serialised once per bundle:
        every poller of an unchanged campaign is sent the same text."""
        if self._json is None:
            self._json = json.dumps(self.bundle, allow_nan=False)[1:-1]
        return self._json


class FigureCache:
    """Figure bundles by campaign, keyed on the campaign's trials: recomputed only when they
    changed, once for all the requests that want the new one.

    The heat map alone takes a quarter of a second of pandas on a 175B space (seconds at
    1T), and a simulated campaign finishes trials many times a second: fifty browsers
    polling must neither each pay for it nor queue behind it. A change is seen from two
    indexed queries (the trials' counts by state, which every add, start, finish and
    interruption moves, and the newest finish time).

    The dashboard's poll (:meth:`entry`) gets the last bundle at once and has it refreshed
    in the background, at most every ``min_age_s``: the page polls every 2 s, so a bundle
    that far behind is as live as the page can show. A bundle older than ``max_lag_s``
    (after a quiet spell in which nobody polled) is not served stale: the poll waits for
    the new one. The figure endpoints (``current=True``) always get the bundle of the
    store as it is now.
    """

    def __init__(
        self,
        open_store: Callable[[], SQLiteStore],
        min_age_s: float = 2.0,
        max_lag_s: float = 10.0,
    ) -> None:
        self.open_store = open_store
        self.min_age_s = min_age_s
        self.max_lag_s = max_lag_s
        self.computed = 0  # bundles computed, for the tests and the curious
        self._lock = threading.Lock()
        self._entries: dict[int, _Entry] = {}
        self._computing: dict[int, threading.Lock] = {}  # one computation per campaign

    def entry(self, store: SQLiteStore, campaign: Campaign, *, current: bool = False) -> _Entry:
        """The campaign's bundle: the last one unless it is out of date (see the class)."""
        asked_at = time.monotonic()
        fingerprint = _fingerprint(store, campaign)
        with self._lock:
            entry = self._entries.get(campaign.id)
            # A bundle made without the space is redone (every min_age_s) even while the
            # trials stand still: a machine profile put back is drawn on the next polls.
            if entry is not None and entry.fingerprint == fingerprint and entry.whole:
                return entry
            if entry is not None and not current:
                age = asked_at - entry.computed_at
                if age < self.max_lag_s:
                    if not entry.refreshing and age >= self.min_age_s:
                        entry.refreshing = True
                        threading.Thread(
                            target=self._refresh, args=(entry, campaign), daemon=True
                        ).start()
                    return entry
        return self._compute_now(store, campaign, fingerprint, asked_at)

    def _compute_now(
        self, store: SQLiteStore, campaign: Campaign, fingerprint: tuple, asked_at: float
    ) -> _Entry:
        with self._lock:
            computing = self._computing.setdefault(campaign.id, threading.Lock())
        with computing:
            with self._lock:
                entry = self._entries.get(campaign.id)
            # Another request (or the background refresh) computed it while this one waited.
            if entry is not None and (
                (entry.fingerprint == fingerprint and entry.whole) or entry.computed_at >= asked_at
            ):
                return entry
            return self._compute(store, campaign, fingerprint)

    def _refresh(self, stale: _Entry, campaign: Campaign) -> None:
        started = time.monotonic()
        try:
            with self.open_store() as store:
                self._compute_now(store, campaign, _fingerprint(store, campaign), started)
        except Exception:  # the next poll tries again; the page keeps the last bundle
            LOG.debug("refreshing the figures of campaign %s failed", campaign.name, exc_info=True)
        finally:
            stale.refreshing = False

    def _compute(self, store: SQLiteStore, campaign: Campaign, fingerprint: tuple) -> _Entry:
        entry = _Entry(fingerprint, figure_bundle(store, campaign), time.monotonic())
        entry.json_members()
        with self._lock:
            self._entries[campaign.id] = entry
            self.computed += 1
        return entry


class ImportanceCache:
    """Each campaign's dimension importance, computed when its trials changed (about a
    second of scikit-learn), once for all the requests that want it, and at most every
    ``min_age_s``: a ranking over hundreds of trials does not move with each new one, and
    a simulated campaign finishes several a second. The answer's ``n`` says how many ok
    trials it was fitted to."""

    def __init__(self, min_age_s: float = 30.0) -> None:
        self.min_age_s = min_age_s
        self._lock = threading.Lock()
        self._found: dict[int, tuple[tuple, float, dict[str, Any]]] = {}
        self._computing: dict[int, threading.Lock] = {}

    def get(self, store: SQLiteStore, campaign: Campaign) -> dict[str, Any]:
        from parsearch.serve.importance import importance

        fingerprint = _fingerprint(store, campaign)
        with self._lock:
            computing = self._computing.setdefault(campaign.id, threading.Lock())
        with computing:
            with self._lock:
                found = self._found.get(campaign.id)
            if found is not None:
                same, young = found[0] == fingerprint, time.monotonic() - found[1] < self.min_age_s
                if same or young:
                    return found[2]
            answer = plain(importance(report_data(store, campaign)))
            with self._lock:
                self._found[campaign.id] = (fingerprint, time.monotonic(), answer)
            return answer


def _fingerprint(store: SQLiteStore, campaign: Campaign) -> tuple:
    """What changes whenever the campaign's trials do."""
    counts = store.counts(campaign.id)
    return (
        campaign.status,
        campaign.budget,
        tuple(sorted((state.value, n) for state, n in counts.items())),
        tuple(store.recent_finish_times(campaign.id, 1)),
    )
