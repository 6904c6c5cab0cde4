"""Chaos: a driver killed with SIGKILL inside its store writes (a write transaction is open),
again and again, on either store. After each kill the next driver takes the lease over at
once (the holder's pid is gone), the store is recovered, and every trial the killed one had
committed is there, unchanged.

What "inside a write" and "recovered" mean is each store's own: SQLite's rollback journal
exists while a write transaction is open, and is rolled back by the next writer (the file
then passes SQLite's integrity check); on PostgreSQL a write transaction holds the store's
advisory lock, and the server rolls it back when the killed client's connection drops (its
session is then gone, and nothing holds the lock)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from parsearch.result import TrialState
from parsearch.store import is_postgres_url, open_store
from parsearch.store.liveness import process_identity

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.slow,
    pytest.mark.skipif(process_identity() is None, reason="needs /proc for instant takeover"),
]

ROUNDS = 8
# How long a killed writer's PostgreSQL session may take to vanish (it goes when the server
# reads the dropped connection: milliseconds).
SESSION_GONE_S = 10.0
WRITER_APP = "chaos-writer"  # the writers' application_name, as pg_stat_activity shows it
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
STORES = [
    pytest.param("sqlite", id="sqlite-file"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
]


@pytest.fixture(params=STORES)
def store_at(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the chaos store lives: an SQLite file, or a fresh schema of the tier's server."""
    if request.param == "sqlite":
        return str(tmp_path / "chaos.db")
    return request.getfixturevalue("postgres_url")


def _writer_address(store_at: str, round_: int) -> str:
    """The store as round ``round_``'s writer opens it: on PostgreSQL with an
    application_name of its own, so that its session and locks can be found."""
    if is_postgres_url(store_at):
        return f"{store_at}&application_name={WRITER_APP}-{round_}"
    return store_at


def _writer_locks(url: str, application: str | None = None) -> tuple[int, int]:
    """(sessions, advisory locks held) of the chaos writers (or of one of them)."""
    import psycopg

    pattern = application or f"{WRITER_APP}-%"
    with psycopg.connect(url, autocommit=True) as conn:
        sessions = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s", (pattern,)
        ).fetchone()[0]
        locks = conn.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
            "WHERE l.locktype = 'advisory' AND l.granted AND a.application_name LIKE %s",
            (pattern,),
        ).fetchone()[0]
    return sessions, locks


def _kill_sqlite_writer(store_at: str, writer: subprocess.Popen[str], round_: int) -> bool:
    """SIGKILL the writer while its rollback journal exists (a transaction lasts
    milliseconds: spin for it); whether the kill left the journal hot."""
    journal = Path(f"{store_at}-journal")
    deadline = time.monotonic() + 30
    while not journal.exists() and time.monotonic() < deadline:
        pass
    writer.send_signal(signal.SIGKILL)
    return journal.exists()


def _kill_postgres_writer(store_at: str, writer: subprocess.Popen[str], round_: int) -> bool:
    """SIGKILL the writer while its write transaction holds the store's advisory lock:
    stopped (SIGSTOP) until one look at the server finds the lock held, else let go and
    tried again; whether the kill landed inside a write."""
    application = f"{WRITER_APP}-{round_}"
    inside = False
    deadline = time.monotonic() + 30
    while not inside and time.monotonic() < deadline:
        os.kill(writer.pid, signal.SIGSTOP)
        inside = _writer_locks(store_at, application)[1] > 0
        if not inside:
            os.kill(writer.pid, signal.SIGCONT)
            time.sleep(0.002)
    writer.send_signal(signal.SIGKILL)  # a stopped process dies of it too
    return inside


def _check_recovered(store_at: str) -> None:
    """The store's own proof that the killed transaction left nothing behind."""
    if not is_postgres_url(store_at):
        check = sqlite3.connect(store_at).execute("PRAGMA integrity_check").fetchone()
        assert check == ("ok",), check
        return
    deadline = time.monotonic() + SESSION_GONE_S
    while (seen := _writer_locks(store_at)) != (0, 0):
        assert time.monotonic() < deadline, f"killed writers' sessions and locks left: {seen}"
        time.sleep(0.05)


def _kill_inside_a_write(
    store_at: str, first_gas: int, round_: int
) -> tuple[dict[int, int], bool, float]:
    """Run a writer until a write transaction is open, SIGKILL it; return what it said it
    committed (number -> gas), whether the kill landed inside a write, and how long the
    writer waited for the lease."""
    kill: Callable[[str, subprocess.Popen[str], int], bool] = (
        _kill_postgres_writer if is_postgres_url(store_at) else _kill_sqlite_writer
    )
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, _writer_address(store_at, round_), str(first_gas),
         str(round_)],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert writer.stdout is not None
    ready, lease_wait = writer.stdout.readline().split()
    assert ready == "ready", ready
    time.sleep(0.05 * (first_gas % 5))  # vary how much it commits first
    inside = kill(store_at, writer, round_)
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
    return committed, inside, float(lease_wait)


def test_kill_9_inside_store_writes_loses_nothing_committed(store_at):
    with open_store(store_at) as store:
        store.create_campaign("chaos", {})
    confirmed: dict[int, int] = {}
    inside_kills = 0
    next_gas = 1
    for kills in range(ROUNDS):
        committed, inside, lease_wait = _kill_inside_a_write(store_at, next_gas, kills)
        inside_kills += inside
        # Not the 60 s lease timeout: the dead holder was seen dead.
        assert lease_wait < 10, lease_wait
        confirmed.update(committed)
        with open_store(store_at) as store:  # read-write: SQLite rolls the killed one back
            trials = {t.number: t for t in store.trials(store.get_campaign().id)}
        for number, gas in confirmed.items():
            trial = trials[number]
            seen = (trial.state, trial.objective, trial.metrics["gas"])
            assert seen == (TrialState.OK, float(gas), gas), (number, seen)
        # Beyond what was confirmed, at most the one trial in flight at each kill.
        assert len(trials) - len(confirmed) <= kills + 1, (len(trials), len(confirmed))
        _check_recovered(store_at)
        next_gas = max(t.layout.gas for t in trials.values()) + 1 if trials else 1
    # Most kills did land inside a write transaction; on PostgreSQL every one, since the
    # writer is stopped and looked at before each kill.
    wanted = ROUNDS if is_postgres_url(store_at) else ROUNDS // 2
    assert inside_kills >= wanted, (inside_kills, wanted)
    print(f"chaos: {ROUNDS} kills, {inside_kills} inside a write, {len(confirmed)} trials kept")
    if not is_postgres_url(store_at):
        assert os.path.exists(store_at)  # SQLite only: the store is that file
