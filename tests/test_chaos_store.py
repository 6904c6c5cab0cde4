"""Chaos: a driver killed with SIGKILL inside its store writes (the rollback journal exists:
a write transaction is open), again and again. After each kill the next driver takes the
lease over at once (the holder's pid is gone), recovers the store, and finds every trial the
killed one had committed, unchanged; the store passes SQLite's integrity check."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from parsearch.result import TrialState
from parsearch.store import open_store
from parsearch.store.liveness import process_identity

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.slow,
    pytest.mark.skipif(process_identity() is None, reason="needs /proc for instant takeover"),
]

ROUNDS = 8
WRITER = """
import itertools, sys, time
from parsearch.config import ParallelLayout
from parsearch.result import TrialResult, TrialState
from parsearch.store import open_store

store = open_store(sys.argv[1])
campaign = store.get_campaign()
began = time.monotonic()
store.acquire_lease(campaign.id, f"writer-{sys.argv[3]}", stale_after_s=60.0)
waited = time.monotonic() - began
store.mark_interrupted(campaign.id)  # as resume does with what the last one left running
print("ready", waited, flush=True)
for gas in itertools.count(int(sys.argv[2])):
    layout = ParallelLayout(tp=1, pp=1, dp=1, mbs=1, gas=gas)
    trial = store.add_trial(campaign.id, layout)
    store.mark_running(trial.id, ["n0"], attempt=1)
    result = TrialResult(TrialState.OK, {"tokens_per_s": float(gas), "gas": gas})
    store.finish_trial(trial.id, result, float(gas))
    print(trial.number, gas, flush=True)
"""


def _kill_inside_a_write(
    db: Path, first_gas: int, round_: int
) -> tuple[dict[int, int], bool, float]:
    """Run a writer until a write transaction is open, SIGKILL it; return what it said it
    committed (number -> gas), whether the kill left a hot journal, and how long the
    writer waited for the lease."""
    journal = Path(f"{db}-journal")
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(db), str(first_gas), str(round_)],
        stdout=subprocess.PIPE,
        text=True,
    )
    ready, lease_wait = writer.stdout.readline().split()
    assert ready == "ready"
    time.sleep(0.05 * (first_gas % 5))  # vary how much it commits first
    deadline = time.monotonic() + 30
    while not journal.exists() and time.monotonic() < deadline:
        pass  # spin: a transaction lasts milliseconds
    writer.send_signal(signal.SIGKILL)
    hot = journal.exists()
    # Read through the same buffered file as the readline above: it may already hold the
    # first committed lines (communicate() with a timeout reads the pipe itself and would
    # lose them).
    out = writer.stdout.read()
    writer.stdout.close()
    writer.wait(timeout=30)
    committed = {}
    for line in out.splitlines():
        number, gas = map(int, line.split())
        committed[number] = gas
    return committed, hot, float(lease_wait)


def test_kill_9_inside_store_writes_loses_nothing_committed(tmp_path):
    db = tmp_path / "chaos.db"
    with open_store(db) as store:
        store.create_campaign("chaos", {})
    confirmed: dict[int, int] = {}
    hot_kills = 0
    next_gas = 1
    for kills in range(ROUNDS):
        committed, hot, lease_wait = _kill_inside_a_write(db, next_gas, kills)
        hot_kills += hot
        assert lease_wait < 10  # not the 60 s lease timeout: the dead holder was seen dead
        confirmed.update(committed)
        with open_store(db) as store:  # read-write: rolls back the killed transaction
            trials = {t.number: t for t in store.trials(store.get_campaign().id)}
        for number, gas in confirmed.items():
            trial = trials[number]
            assert (trial.state, trial.objective, trial.metrics["gas"]) == (
                TrialState.OK,
                float(gas),
                gas,
            )
        # Beyond what was confirmed, at most the one trial in flight at each kill.
        assert len(trials) - len(confirmed) <= kills + 1
        check = sqlite3.connect(db).execute("PRAGMA integrity_check").fetchone()
        assert check == ("ok",)
        next_gas = max(t.layout.gas for t in trials.values()) + 1 if trials else 1
    assert hot_kills >= ROUNDS // 2  # most kills did land inside a write transaction
    print(f"chaos: {ROUNDS} kills, {hot_kills} inside a write, {len(confirmed)} trials kept")
    assert os.path.exists(db)
