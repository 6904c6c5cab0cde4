"""Time the store's queries on one campaign of 100 000 finished trials.

A 1T-parameter campaign on a real allocation records hundreds of trials, a simulated one
(``--backend simulate``) tens of thousands; ``parsearch status`` and ``best`` must answer in
well under a second either way. Target: best / top / pareto / counts under 100 ms each;
dataframe decodes every row, so it is reported, not held to that.

The store is filled with one ``executemany`` in one transaction, straight through SQL: going
through ``add_trial`` / ``finish_trial`` would cost two fsynced commits a trial, which is the
right price for a driver and the wrong one for a benchmark.

    .venv/bin/python benchmarks/store_queries.py [--trials 100000] [--repeat 7] [--store PATH]
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from parsearch.config import ParallelLayout
from parsearch.result import TrialState
from parsearch.store import SQLiteStore

# Enough distinct layouts (7*8*8*6*8*4*3*2*2 = 516 096) for 100 000 unique keys.
CHOICES: dict[str, tuple[Any, ...]] = {
    "tp": (1, 2, 4, 8, 16, 32, 64),
    "pp": (1, 2, 4, 8, 16, 32, 64, 128),
    "dp": (1, 2, 4, 8, 16, 32, 64, 128),
    "mbs": (1, 2, 3, 4, 6, 8),
    "gas": (1, 2, 4, 8, 16, 32, 64, 128),
    "zero_stage": (0, 1, 2, 3),
    "recompute": ("none", "selective", "full"),
    "vpp": (1, 2),
    "sequence_parallel": (False, True),
}
# A plausible campaign: most layouts run, some run out of memory or time, a few break.
STATES = (
    (TrialState.OK, 0.70),
    (TrialState.OOM, 0.15),
    (TrialState.TIMEOUT, 0.05),
    (TrialState.ERROR, 0.05),
    (TrialState.INFEASIBLE, 0.05),
)


def _layouts(n: int, rng: random.Random) -> list[ParallelLayout]:
    product = list(itertools.product(*CHOICES.values()))
    return [
        ParallelLayout(**dict(zip(CHOICES, values, strict=True)))
        for values in rng.sample(product, n)
    ]


def fill(path: Path, trials: int, seed: int = 0) -> int:
    """Create a campaign of ``trials`` finished trials in the store at ``path``; its id."""
    rng = random.Random(seed)
    with SQLiteStore(path) as store:
        campaign_id = store.create_campaign("bench", {"model": "1t"}, seed=seed).id
    states = rng.choices([s for s, _ in STATES], weights=[w for _, w in STATES], k=trials)
    now = time.time()
    rows = []
    for number, (layout, state) in enumerate(zip(_layouts(trials, rng), states, strict=True)):
        peak_mem = rng.uniform(8e9, 96e9)
        # Layouts that keep more in memory (less recompute, less sharding) tend to run
        # faster; the correlation makes the Pareto front span the whole memory range.
        tokens = peak_mem / 96e9 * rng.uniform(2e4, 5e4) if state is TrialState.OK else None
        metrics = {"peak_mem_bytes": peak_mem}
        if tokens is not None:
            metrics |= {"tokens_per_s": tokens, "mfu": tokens / 1e5, "step_time_s": 1e6 / tokens}
        predicted = {"step_time_s": rng.uniform(1, 100), "peak_mem_bytes": peak_mem * 0.9}
        rows.append(
            (
                campaign_id,
                number,
                layout.key(),
                json.dumps(layout.to_dict(), sort_keys=True),
                state.value,
                1,
                "optimizer",
                now + number,
                now + number,
                now + number + 60,
                60.0,
                json.dumps(["node0", "node1"]),
                json.dumps(metrics, sort_keys=True),
                tokens,
                tokens,
                peak_mem,
                json.dumps(predicted, sort_keys=True),
                None if state is TrialState.OK else f"{state.value} on node0",
                "",
            )
        )
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT INTO trials (campaign_id, number, key, config, state, attempt, origin, "
            "created_at, started_at, finished_at, duration_s, hosts, metrics, objective, "
            "tokens_per_s, peak_mem_bytes, predicted, error, log_tail) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        conn.execute("COMMIT")
    finally:
        conn.close()
    return campaign_id


def queries(store: SQLiteStore, campaign_id: int) -> dict[str, Callable[[], object]]:
    """The queries a status page or report asks, by name."""
    return {
        "best": lambda: store.best(campaign_id),
        "best (mem cap)": lambda: store.best(campaign_id, max_mem_bytes=16e9),
        "top 10": lambda: store.top(campaign_id, 10),
        "recent finishes (ETA)": lambda: store.recent_finish_times(campaign_id, 20),
        "pareto": lambda: store.pareto(campaign_id),
        "counts": lambda: store.counts(campaign_id),
        "dataframe": lambda: store.dataframe(campaign_id),
    }


def time_queries(
    store: SQLiteStore, campaign_id: int, repeat: int, skip: tuple[str, ...] = ()
) -> dict[str, list[float]]:
    """Seconds per call of each query but ``skip``, ``repeat`` calls each (the first warms)."""
    timings: dict[str, list[float]] = {}
    for name, query in queries(store, campaign_id).items():
        if name in skip:
            continue
        timings[name] = []
        for _ in range(repeat):
            start = time.perf_counter()
            query()
            timings[name].append(time.perf_counter() - start)
    return timings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--store", type=Path, help="store file to create (default: a temp file)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        path = args.store or Path(scratch) / "bench.db"
        if path.exists():
            parser.error(f"{path} exists; the benchmark fills a new store")
        start = time.perf_counter()
        campaign_id = fill(path, args.trials)
        print(f"filled {args.trials} trials in {time.perf_counter() - start:.1f} s ({path})")
        with SQLiteStore(path, readonly=True) as store:
            timings = time_queries(store, campaign_id, args.repeat)
        print(f"{'query':<24}{'min ms':>10}{'median ms':>12}")
        for name, seconds in timings.items():
            print(f"{name:<24}{min(seconds) * 1e3:>10.1f}{statistics.median(seconds) * 1e3:>12.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
