"""Queries stay fast at 100 000 trials (loosely: the benchmark reports the real figures)."""

from __future__ import annotations

import importlib.util
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


@pytest.mark.slow
def test_queries_at_100_000_trials(tmp_path: Path) -> None:
    bench = load_benchmark()
    path = tmp_path / "big.db"
    campaign_id = bench.fill(path, TRIALS)
    with SQLiteStore(path, readonly=True) as store:
        timings = bench.time_queries(store, campaign_id, repeat=3, skip=("dataframe",))
        for name, seconds in timings.items():
            assert min(seconds) < 1.0, f"{name} took {min(seconds):.3f} s"

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
