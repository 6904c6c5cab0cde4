"""Queries stay cheap at 100 000 trials. Cost is counted in SQLite virtual-machine
instructions, which load cannot change; the benchmark reports the real times."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from parsearch.result import TrialState
from parsearch.store import SQLiteStore

TRIALS = 100_000
BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "store_queries.py"


def load_benchmark() -> ModuleType:
    """The benchmark's own fill and queries, so the test and the figures measure one thing."""
    spec = importlib.util.spec_from_file_location("store_queries", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def instructions(store: SQLiteStore, query: Callable[[], object]) -> int:
    """SQLite virtual-machine instructions ``query`` runs (to the nearest 100)."""
    conn = store._db._conn
    ticks = [0]

    def tick() -> int:
        ticks[0] += 1
        return 0

    conn.set_progress_handler(tick, 100)
    try:
        query()
    finally:
        conn.set_progress_handler(None, 0)
    return 100 * ticks[0]


@pytest.mark.slow
def test_queries_at_100_000_trials(tmp_path: Path) -> None:
    bench = load_benchmark()
    path = tmp_path / "big.db"
    campaign_id = bench.fill(path, TRIALS)
    with SQLiteStore(path, readonly=True) as store:
        cost = {
            name: instructions(store, query)
            for name, query in bench.queries(store, campaign_id).items()
            if name != "dataframe"
        }
        # The best, top 10 and the ETA's recent finishes read a few index entries, whatever
        # the campaign's size...
        assert cost["best"] < 1_000 and cost["top 10"] < 10_000, cost
        assert cost["recent finishes (ETA)"] < 10_000, cost
        # ...the others read each trial's index entry at most once (none is quadratic).
        assert all(count < 20 * TRIALS for count in cost.values()), cost

        counts = store.counts(campaign_id)
        assert sum(counts.values()) == TRIALS
        frame = store.dataframe(campaign_id)
        ok = frame[frame["state"] == TrialState.OK.value]
        assert len(frame) == TRIALS and len(ok) == counts[TrialState.OK]
        assert store.best(campaign_id).objective == ok["objective"].max()
        capped = ok[ok["peak_mem_bytes"] <= 16e9]
        assert store.best(campaign_id, max_mem_bytes=16e9).objective == capped["objective"].max()
        front = store.pareto(campaign_id)
        assert front[0].peak_mem_bytes == ok["peak_mem_bytes"].min()
        assert front[-1].objective == ok["objective"].max()
