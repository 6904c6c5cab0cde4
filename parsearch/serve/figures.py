"""The dashboard's figures as data: the report's own tables (:mod:`parsearch.report.data`),
so a cell of the live heat map and a cell of ``parsearch report``'s PNG are the same number.
"""

from __future__ import annotations

import functools
import json
import threading
from typing import Any

from parsearch.report.data import (
    Accuracy,
    ReportData,
    accuracy,
    convergence,
    tp_pp_grid,
)
from parsearch.serve import views
from parsearch.serve.views import plain
from parsearch.space import SearchSpace, space_from_dict
from parsearch.store import Campaign, SQLiteStore

# The estimate's figures the dashboard compares with measurements.
FIDELITY_METRICS = ("peak_mem_bytes",)


@functools.lru_cache(maxsize=32)
def _space(campaign_id: int, created_at: float, space_json: str, source: str) -> SearchSpace:
    """A campaign's space never changes once stored: load (and plan) it once per server."""
    space = space_from_dict(json.loads(space_json), source=source)
    space.plan()  # cached on the space; the heat map needs it on every poll
    return space


def report_data(store: SQLiteStore, campaign: Campaign) -> ReportData:
    """The campaign as ``parsearch report`` reads it, from one short read of its trials."""
    space = _space(
        campaign.id,
        campaign.created_at,
        json.dumps(campaign.space, sort_keys=True),
        campaign.space_path or campaign.name,
    )
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
    convergence, heat map, Pareto front, fidelity and the trials table."""
    data = report_data(store, campaign)
    record = store.best(campaign.id)
    return {
        "objective_label": data.objective_label,
        "memory_limit_bytes": data.memory_limit_bytes,
        "best": None if record is None else plain(views.trial_row(record, campaign)),
        "exports": None if record is None else views.best_exports(record, campaign),
        "convergence": convergence_rows(data),
        "heatmap": heatmap(data),
        "pareto": views.pareto(store, campaign),
        "fidelity": fidelity(data),
        "trials": plain([views.trial_row(r, campaign) for r in store.trials(campaign.id)]),
    }


class FigureCache:
    """Figure bundles, recomputed only when a campaign's trials changed.

    The heat map alone takes most of a second of pandas on a 175B space; fifty browsers
    polling every few seconds must not each pay it. A change is seen from two indexed
    queries: the trials' counts by state (every add, start, finish, interruption moves
    one) and the newest finish time. One lock: concurrent pollers of a changed campaign
    wait for one computation instead of racing through fifty.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bundles: dict[int, tuple[tuple, dict[str, Any]]] = {}

    def get(self, store: SQLiteStore, campaign: Campaign) -> dict[str, Any]:
        counts = store.counts(campaign.id)
        fingerprint = (
            campaign.status,
            campaign.budget,
            tuple(sorted((state.value, n) for state, n in counts.items())),
            tuple(store.recent_finish_times(campaign.id, 1)),
        )
        with self._lock:
            cached = self._bundles.get(campaign.id)
            if cached is None or cached[0] != fingerprint:
                cached = (fingerprint, figure_bundle(store, campaign))
                self._bundles[campaign.id] = cached
            return cached[1]
