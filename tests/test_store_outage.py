"""A store outage does not end a campaign: the driver keeps its running trials and finished
results, reconnects, and goes on; past ``--store-outage-limit`` it drains and keeps what it
could not write for ``resume``.

Real ``parsearch`` processes against the tier's real PostgreSQL server, stopped and started
under them (as ``pg_ctl restart -m fast`` does), and a real SQLite file whose write lock
another process holds past the busy timeout.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from trials_seen import trials_seen

from parsearch.campaign.driver import Driver, DriverSettings, Outcome
from parsearch.campaign.kept import KeptResult, keep, record_kept
from parsearch.campaign.lease import Lease
from parsearch.campaign.session import CampaignSettings, _Parts
from parsearch.config import ParallelLayout
from parsearch.errors import StoreError
from parsearch.result import TrialResult, TrialState
from parsearch.space import load_space
from parsearch.store import SQLiteStore, TrialRecord, open_store

ROOT = Path(__file__).parent.parent
GPT175 = str(ROOT / "search_spaces" / "gpt-175b-frontier.yaml")
BUDGET = 14
SIMULATE = ["--backend", "simulate", "--slots", "2", "--backend-opt", "delay=0.4"]


def _start(cwd: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "parsearch", *args, "--quiet"],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _trials(url: str) -> list[TrialRecord]:
    """The campaign's trials: none while the driver has not created its store yet."""
    try:
        store = open_store(url, readonly=True)
    except StoreError:
        return []
    with store:
        campaigns = store.list_campaigns()
        return store.trials(campaigns[0].id) if campaigns else []


def _wait_finished(url: str, driver: subprocess.Popen[str], count: int) -> None:
    """Until the driver has recorded ``count`` finished trials (it must still run then)."""
    deadline = time.monotonic() + 120
    while sum(t.state.finished for t in _trials(url)) < count:
        assert driver.poll() is None, driver.communicate()
        assert time.monotonic() < deadline, "the driver recorded too few trials"
        time.sleep(0.05)


def _check_once_each(trials: list[TrialRecord], budget: int) -> None:
    """``budget`` finished trials, each layout once, each run once (attempt 1: nothing
    finished was interrupted and run again)."""
    assert len(trials) == budget, trials_seen(trials)
    assert all(t.state.finished for t in trials), trials_seen(trials)
    assert len({t.key for t in trials}) == budget, trials_seen(trials)
    assert all(t.attempt == 1 for t in trials), trials_seen(trials)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.parametrize("down_s", [0.0, 10.0], ids=["restart", "stopped-10s"])
def test_a_server_restart_mid_campaign_loses_and_repeats_nothing(
    postgres_server, postgres_url, tmp_path, down_s
):
    driver = _start(tmp_path, "run", GPT175, "--store", postgres_url, "--budget", str(BUDGET),
                    *SIMULATE)  # fmt: skip
    _wait_finished(postgres_url, driver, 3)
    postgres_server.restart(down_s)
    out, err = driver.communicate(timeout=120)
    assert driver.returncode == 0, (out, err)
    assert "budget reached" in out, out
    _check_once_each(_trials(postgres_url), BUDGET)
    assert not list(tmp_path.glob("parsearch-unwritten-*")), "nothing needed keeping"


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.postgres
def test_past_the_outage_limit_the_driver_drains_and_resume_records_what_it_kept(
    postgres_server, postgres_url, tmp_path
):
    driver = _start(tmp_path, "run", GPT175, "--store", postgres_url, "--budget", str(BUDGET),
                    "--store-outage-limit", "1.5", "--grace", "5", *SIMULATE)  # fmt: skip
    _wait_finished(postgres_url, driver, 3)
    postgres_server.shut_down()
    try:
        out, err = driver.communicate(timeout=60)
    finally:
        postgres_server.start()
    assert driver.returncode == Outcome.STORE_DOWN.exit_code == 0, (out, err)
    assert Outcome.STORE_DOWN.value in out, out
    kept_file = tmp_path / "parsearch-unwritten-gpt-175b-frontier.jsonl"
    kept = [json.loads(line) for line in kept_file.read_text().splitlines()]
    assert kept, out
    assert f"{len(kept)} finished result(s) could not be written and are kept in {kept_file}" in (
        out
    )
    before = {t.id: t for t in _trials(postgres_url)}
    assert all(not before[item["trial_id"]].state.finished for item in kept), kept

    resume = _start(ROOT, "resume", "--store", postgres_url, "--name", "gpt-175b-frontier")
    out, err = resume.communicate(timeout=120)
    assert resume.returncode == 0, (out, err)
    assert "budget reached" in out, out
    after = {t.id: t for t in _trials(postgres_url)}
    for item in kept:  # recorded as kept, not run again
        trial = after[item["trial_id"]]
        seen = (trial.state.value, trial.attempt, trial.metrics)
        assert seen == (item["result"]["status"], 1, item["result"]["metrics"]), (item, seen)
    finished = [t for t in after.values() if t.state.finished]
    assert len(finished) == BUDGET and len({t.key for t in after.values()}) == len(after)
    assert not kept_file.exists(), "every kept line was recorded"
    assert f"recorded {len(kept)} finished result(s)" in err, err


@pytest.mark.slow
@pytest.mark.parametrize("after", [0, 3], ids=["before-any-trial", "mid-campaign"])
def test_an_sqlite_store_locked_past_its_busy_timeout_is_retried(tmp_path, after):
    """Another process holds the file's write lock for 2 s, ten times the store's busy
    timeout, from the start (the first writes are of new trials, none runs) or once
    ``after`` trials finished: the driver's writes fail meanwhile, and it goes on when the
    lock is free."""
    db = tmp_path / "c.db"
    space = load_space(GPT175)
    settings = CampaignSettings(backend="simulate", slots=2, backend_options={"delay": "0.2"})
    parts = _Parts.build(space, settings, seed=0)
    store = SQLiteStore(db, timeout_s=0.2)
    campaign = store.create_campaign("locked", space.raw, budget=BUDGET, backend="simulate")
    locker = threading.Thread(target=_hold_write_lock, args=(db, after, started := []))
    try:
        with store, Lease(store, campaign.id, stale_after_s=30.0) as lease:
            parts.strategy.start([], budget=BUDGET)
            locker.start()  # the session's own start (its lease) is not what is tested
            while after == 0 and not started:
                time.sleep(0.01)
            driver = Driver(
                store=store,
                campaign=campaign,
                space=space,
                backend=parts.backend,
                strategy=parts.strategy,
                lease=lease,
                settings=DriverSettings(budget=BUDGET),
            )
            outcome = driver.run()
            trials = store.trials(campaign.id)
    finally:
        parts.close()
        if locker.is_alive():
            locker.join()
    assert outcome is Outcome.BUDGET, driver.detail
    assert driver.outage_s >= 1.0, "the lock was held while the driver wrote"
    _check_once_each(trials, BUDGET)


def _hold_write_lock(db: Path, after: int, started: list[bool]) -> None:
    """Once ``after`` trials are finished, hold the write lock for 2 s from another
    process; ``started`` gets an item once it holds it."""
    deadline = time.monotonic() + 60
    while after and time.monotonic() < deadline:
        with open_store(db, readonly=True) as reader:  # its own connection, 30 s timeout
            if sum(t.state.finished for t in reader.trials(reader.get_campaign().id)) >= after:
                break
        time.sleep(0.02)
    holder = subprocess.Popen(
        [sys.executable, "-c", _LOCKER, str(db)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "locked"
    started.append(True)
    holder.wait(timeout=30)


_LOCKER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(2.0)
conn.execute("ROLLBACK")
"""


def test_resume_records_only_what_the_store_still_holds_unfinished(tmp_path):
    """A kept line for a trial finished meanwhile (its commit landed, its answer was lost)
    is dropped, not recorded twice; a line of another store stays in the file."""
    db = tmp_path / "c.db"
    with open_store(db) as store:
        campaign = store.create_campaign("kept", {}, settings={"launch_dir": str(tmp_path)})
        owner = "test-driver"
        store.acquire_lease(campaign.id, owner, stale_after_s=30.0)
        trials = []
        for gas in (1, 2):
            trial = store.add_trial(campaign.id, ParallelLayout(tp=1, pp=1, dp=1, mbs=1, gas=gas))
            trials.append(store.mark_running(trial.id, ["n0"], attempt=1))
        results = [TrialResult(TrialState.OK, {"tokens_per_s": 10.0 * n}) for n in (1, 2)]
        pairs = zip(trials, results, strict=True)
        kept = [KeptResult(t, r, r.metrics["tokens_per_s"]) for t, r in pairs]
        path = keep(store, campaign, kept)
        store.finish_trial(trials[1].id, results[1], 20.0)  # the lost answer's commit
        foreign = json.dumps({"store": "/elsewhere.db", "campaign": "kept", "trial_id": 1})
        with open(path, "a") as file:
            file.write(foreign + "\n")
        assert record_kept(store, campaign) == (1, path)
        seen = [(t.state, t.objective, t.attempt) for t in store.trials(campaign.id)]
    assert seen == [(TrialState.OK, 10.0, 1), (TrialState.OK, 20.0, 1)], seen
    assert path.read_text() == foreign + "\n"
