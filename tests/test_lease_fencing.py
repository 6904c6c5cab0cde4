"""The lease as a fence: a driver that lost it writes nothing, takeover respects the holder,
and a holder whose process exited on this host is taken over at once (on both stores)."""

from __future__ import annotations

import math
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from store_polling import campaign_trials
from trials_seen import trials_seen

from parsearch.campaign.lease import Lease, check_lease_timeout
from parsearch.cli import main
from parsearch.config import ParallelLayout
from parsearch.errors import CampaignLockedError, UsageError
from parsearch.result import TrialResult, TrialState
from parsearch.store import SQLiteStore, is_postgres_url, open_store
from parsearch.store.liveness import process_identity, provably_dead
from parsearch.store.records import LeaseHolder
from parsearch.store.schema import MIGRATIONS

ROOT = Path(__file__).resolve().parents[1]
GPT175 = str(ROOT / "search_spaces" / "gpt-175b-frontier.yaml")
OK = TrialResult(TrialState.OK, {"tokens_per_s": 10.0})


def layout(gas: int) -> ParallelLayout:
    return ParallelLayout(tp=2, pp=1, dp=4, mbs=1, gas=gas)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the fencing tests' store is: an SQLite file, or a PostgreSQL schema of its own."""
    if request.param == "postgresql":
        return request.getfixturevalue("postgres_url")
    return str(tmp_path / "c.db")


def _age_heartbeat(db: str, campaign_id: int, seconds: float) -> None:
    """Make the holder look silent for ``seconds`` (as if it was SIGSTOP'd that long)."""
    update = "UPDATE leases SET heartbeat_at = heartbeat_at - {0} WHERE campaign_id = {0}"
    if is_postgres_url(db):
        import psycopg

        with psycopg.connect(db) as server:  # commits as the block ends
            server.execute(update.format("%s"), (seconds, campaign_id))
        return
    conn = sqlite3.connect(db)
    conn.execute(update.format("?"), (seconds, campaign_id))
    conn.commit()
    conn.close()


def test_a_stale_driver_cannot_write_after_a_takeover(db: str) -> None:
    with open_store(db) as stale, open_store(db) as fresh:
        campaign = stale.create_campaign("c", {})
        assert stale.acquire_lease(campaign.id, "a", stale_after_s=5.0) == 1
        trial = stale.add_trial(campaign.id, layout(1))
        stale.mark_running(trial.id, ["n0"], attempt=1)
        _age_heartbeat(db, campaign.id, 6.0)
        assert fresh.acquire_lease(campaign.id, "b", stale_after_s=5.0) == 2
        fresh.mark_interrupted(campaign.id)
        fresh.requeue(trial.id)
        fresh.mark_running(trial.id, ["n1"], attempt=2)
        # Every write of the stale driver is refused inside its transaction, naming the new one.
        for write in (
            lambda: stale.finish_trial(trial.id, OK, 10.0),
            lambda: stale.add_trial(campaign.id, layout(2)),
            lambda: stale.mark_interrupted(campaign.id),
            lambda: stale.update_campaign(campaign.id, status="stopped"),
        ):
            with pytest.raises(
                CampaignLockedError, match=r"lost the lease.*driver b.*generation 2"
            ):
                write()
        stale.release_lease(campaign.id, "a")  # a no-op: b holds it
        # The legitimate driver carries on as if nothing happened.
        done = fresh.finish_trial(trial.id, OK, 10.0)
        assert (done.state, done.attempt, done.hosts) == (TrialState.OK, 2, ["n1"])
        assert [t.number for t in fresh.trials(campaign.id)] == [0]
        assert fresh.lease_holder(campaign.id).generation == 2


def test_takeover_waits_for_the_holders_threshold_not_the_newcomers(db: str) -> None:
    with open_store(db) as holder, open_store(db) as newcomer:
        campaign = holder.create_campaign("c", {})
        holder.acquire_lease(campaign.id, "a", stale_after_s=60.0)
        _age_heartbeat(db, campaign.id, 5.0)  # between two of its (15 s) heartbeats
        with pytest.raises(CampaignLockedError, match=r"heartbeat is 60 s old"):
            newcomer.acquire_lease(campaign.id, "b", stale_after_s=1.0)
        _age_heartbeat(db, campaign.id, 56.0)
        newcomer.acquire_lease(campaign.id, "b", stale_after_s=1.0)


@pytest.mark.parametrize("bad", [0.0, 0.5, -1.0, math.nan, math.inf, 1e9])
def test_a_lease_timeout_too_short_for_its_heartbeats_is_refused(bad: float) -> None:
    with pytest.raises(UsageError, match=r"lease timeout must lie in \[1, 86400\]"):
        check_lease_timeout(bad)
    with (
        pytest.raises(UsageError),
        SQLiteStore(":memory:") as store,
    ):
        Lease(store, store.create_campaign("c", {}).id, stale_after_s=bad)


@pytest.mark.parametrize("text", ["0", "0.5", "nan", "inf", "-3", "abc"])
def test_the_command_line_refuses_a_bad_lease_timeout(text, tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["resume", "--store", str(tmp_path / "s.db"), "--lease-timeout", text])
    assert exit_info.value.code == 2
    assert "--lease-timeout" in capsys.readouterr().err
    assert not (tmp_path / "s.db").exists()


def _hold_then_die(db: str, campaign_id: int) -> int:
    """A real driver process takes the lease (60 s timeout) and is killed with SIGKILL."""
    code = (
        "import sys, time\n"
        "from parsearch.store import open_store\n"
        "store = open_store(sys.argv[1])\n"
        "store.acquire_lease(int(sys.argv[2]), 'killed', stale_after_s=60.0)\n"
        "print('held', flush=True)\n"
        "time.sleep(600)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(db), str(campaign_id)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout.readline().strip() == "held"
    child.send_signal(signal.SIGKILL)
    child.wait(30)
    return child.pid


@pytest.mark.skipif(process_identity() is None, reason="needs /proc to prove a process dead")
def test_a_holder_that_exited_on_this_host_is_taken_over_at_once(db: str) -> None:
    with open_store(db) as store:
        campaign = store.create_campaign("c", {})
    pid = _hold_then_die(db, campaign.id)
    with open_store(db) as store:
        holder = store.lease_holder(campaign.id)
        assert (holder.pid, holder.stale_after_s) == (pid, 60.0)
        began = time.monotonic()
        store.acquire_lease(campaign.id, "resumer", stale_after_s=60.0)  # no 60 s wait
        assert time.monotonic() - began < 5
        assert store.lease_holder(campaign.id).owner == "resumer"


@pytest.mark.skipif(process_identity() is None, reason="needs /proc to prove a process dead")
def test_liveness_is_certain_or_says_alive() -> None:
    me = process_identity()
    assert not provably_dead(os.getpid(), me)  # alive
    namespace, _, started = me.rpartition("/")
    assert provably_dead(os.getpid(), f"{namespace}/{int(started) + 1}")  # pid reused
    assert not provably_dead(os.getpid(), f"another-boot/{started}")  # cannot tell
    assert not provably_dead(os.getpid(), None)  # a lease from before the identity column
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert provably_dead(child.pid, f"{namespace}/{started}")  # gone


def test_a_live_holder_in_this_process_is_not_taken_over(db: str) -> None:
    """Same host, same pid, same start time: alive, so only staleness can end the lease."""
    with open_store(db) as first, open_store(db) as second:
        campaign = first.create_campaign("c", {})
        first.acquire_lease(campaign.id, "a", stale_after_s=60.0)
        with pytest.raises(CampaignLockedError, match=socket.gethostname()):
            second.acquire_lease(campaign.id, "b", stale_after_s=60.0)


def test_a_version_2_store_with_a_held_lease_is_upgraded(tmp_path: Path) -> None:
    db = tmp_path / "v2.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN")
    for migration in MIGRATIONS[:2]:
        migration.apply(conn)
        conn.execute("INSERT INTO schema_version VALUES (?, 0)", (migration.version,))
    conn.execute(
        "INSERT INTO campaigns (id, name, space, seed, backend, settings, versions, created_at, "
        "status) VALUES (1, 'old', '{}', 0, 'local', '{}', '{}', 0, 'running')"
    )
    conn.execute(  # a v2 driver on another host, silent for 100 s
        "INSERT INTO leases VALUES (1, 'old-driver', 'elsewhere', 1, ?, ?)",
        (time.time() - 200, time.time() - 100),
    )
    conn.execute("COMMIT")
    conn.close()
    with open_store(db) as store:
        holder = store.lease_holder(1)
        assert (holder.owner, holder.generation, holder.stale_after_s) == ("old-driver", 0, None)
        # Without the holder's threshold on record, the newcomer's decides.
        with pytest.raises(CampaignLockedError):
            store.acquire_lease(1, "new", stale_after_s=120.0)
        assert store.acquire_lease(1, "new", stale_after_s=60.0) == 1
        trial = store.add_trial(1, layout(1))  # fenced by generation 1, and allowed
        assert trial.number == 0


def _lease_holder(db: Path) -> LeaseHolder | None:
    with open_store(db, readonly=True) as store:
        return store.lease_holder(store.get_campaign().id)


@pytest.mark.e2e
@pytest.mark.slow
def test_a_driver_paused_past_its_lease_wakes_and_writes_nothing(tmp_path: Path) -> None:
    """Issue's reproduction: SIGSTOP driver A inside a trial, `resume` takes over, SIGCONT A.

    A must stop (exit 75) without writing; B must finish the budget; every trial once."""
    db = tmp_path / "c.db"
    common = ["--quiet", "--lease-timeout", "1"]
    a = subprocess.Popen(
        [sys.executable, "-m", "parsearch", "run", GPT175, "--store", str(db), "--budget", "3",
         "--backend", "simulate", "--backend-opt", "delay=1.2", *common],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not any(t.state is TrialState.RUNNING for t in campaign_trials(db)):
            # A is not inside its first trial yet
            assert time.monotonic() < deadline and a.poll() is None, "A never started a trial"
            time.sleep(0.1)
        a.send_signal(signal.SIGSTOP)
        time.sleep(1.5)  # past A's 1 s lease
        b = subprocess.Popen(
            [sys.executable, "-m", "parsearch", "resume", "--store", str(db), *common],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        # B takes the lease over (its start-up alone can take seconds on a loaded machine;
        # A woken before then would find its lease stale but untaken, and rightly go on),
        # then re-runs A's trial (attempt 2), which A had nearly finished.
        deadline = time.monotonic() + 120
        while (holder := _lease_holder(db)) is None or holder.pid != b.pid:
            assert time.monotonic() < deadline and b.poll() is None, "B never took the lease"
            time.sleep(0.1)
        time.sleep(1)
        a.send_signal(signal.SIGCONT)
        _, a_err = a.communicate(timeout=120)
        b_out, b_err = b.communicate(timeout=300)
    finally:
        for process in (a,):
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
    assert a.returncode == 75, a_err
    assert "lost the lease" in a_err or "no longer holds the lease" in a_err
    assert b.returncode == 0, b_err
    assert "3/3 trials finished" in b_out
    with open_store(db, readonly=True) as store:
        campaign = store.get_campaign()
        trials = store.trials(campaign.id)
        assert campaign.status.value == "finished"
        assert sum(t.state.finished for t in trials) == 3, trials_seen(trials)
        assert len({t.key for t in trials}) == len(trials)
