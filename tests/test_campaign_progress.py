"""The progress display: one rewritten line on a terminal, sparse lines in a log."""

import io
import os
import socket
import time

import pytest

from parsearch.campaign.progress import Progress, Snapshot, format_duration
from parsearch.commands.status import render_text as status_text
from parsearch.config import ParallelLayout
from parsearch.query import campaign_progress
from parsearch.result import TrialResult, TrialState
from parsearch.store import CampaignStatus, SQLiteStore

LAYOUT = ParallelLayout(tp=2, pp=4, dp=16, mbs=1, gas=8)


class Terminal(io.StringIO):
    """A stream that says it is a terminal, as a real one would."""

    def isatty(self) -> bool:
        return True


def _snapshot(finished, best=None, running=2):
    return Snapshot(
        finished=finished,
        budget=10,
        running=running,
        failed=1,
        best_value=best,
        best_layout=LAYOUT if best else None,
        metric="tokens_per_s",
        eta_s=75.0,
    )


def test_a_log_gets_a_line_per_new_best_only():
    log = io.StringIO()
    progress = Progress(log)
    progress.message("campaign 'c' started")
    for snapshot in (_snapshot(1), _snapshot(2, 5.0), _snapshot(3, 5.0), _snapshot(4, 7.0)):
        progress.update(snapshot, force=True)
    progress.close()
    lines = log.getvalue().splitlines()
    assert lines == [
        "campaign 'c' started",
        "[2/10] new best tokens_per_s 5 (tp2 pp4 dp16 mbs1 gas8)",
        "[4/10] new best tokens_per_s 7 (tp2 pp4 dp16 mbs1 gas8)",
    ]


def test_a_terminal_gets_one_line_rewritten_in_place():
    tty = Terminal()
    progress = Progress(tty)
    progress.update(_snapshot(3, 5.0), force=True)
    progress.update(_snapshot(4, 5.0))  # within 0.2 s of the last draw: skipped
    progress.update(_snapshot(5, 6.0), force=True)
    progress.message("stopping")
    progress.close()
    text = tty.getvalue()
    assert "\n" not in text.split("stopping")[0]
    assert "\r3/10 done, 2 running, 1 failed | best tokens_per_s 5 (tp2 pp4 dp16 mbs1 gas8)" in text
    assert "ETA 1m15s" in text and "4/10" not in text and "5/10" in text
    assert text.endswith("stopping\n")


def test_disabled_progress_writes_nothing():
    tty = Terminal()
    progress = Progress(tty, enabled=False)
    progress.message("x")
    progress.update(_snapshot(1, 1.0), force=True)
    assert tty.getvalue() == ""


def test_durations():
    assert [format_duration(s) for s in (None, 0, 59.6, 95, 3600 * 2 + 61)] == [
        "?",
        "0s",
        "1m00s",
        "1m35s",
        "2h01m",
    ]


def test_a_running_campaign_has_an_eta_from_its_recent_finishing_rate(tmp_path):
    with SQLiteStore(tmp_path / "c.db") as store:
        campaign = store.create_campaign("c", {}, budget=10)
        for mbs in (1, 2, 3):
            trial = store.add_trial(campaign.id, ParallelLayout(tp=1, pp=1, dp=1, mbs=mbs, gas=1))
            store.mark_running(trial.id, ["node0"], 1)
            store.finish_trial(trial.id, TrialResult(TrialState.OK, {"tokens_per_s": 1.0}), 1.0)
            time.sleep(0.2)
        assert campaign_progress(store, campaign).eta_s is None  # not running: no ETA
        campaign = store.update_campaign(campaign.id, status=CampaignStatus.RUNNING)
        assert campaign_progress(store, campaign).eta_s is None  # no driver runs it: none
        store.acquire_lease(campaign.id, "driver-1", stale_after_s=60)
        first, *_, last = store.recent_finish_times(campaign.id, 20)
        progress = campaign_progress(store, campaign)
        now = time.time()
    # 3 finishes, 2 gaps; the time since the last finish counts too, so a stall shows.
    assert progress.remaining == 7
    assert 7 * (last - first) / 2 <= progress.eta_s <= 7 * (now - first) / 2


def test_status_names_the_live_driver_and_says_when_it_seems_dead(tmp_path):
    with SQLiteStore(tmp_path / "c.db") as store:
        campaign = store.create_campaign("c", {}, budget=10, settings={"lease_timeout_s": 0.3})
        assert campaign_progress(store, campaign).driver is None
        store.acquire_lease(campaign.id, "driver-1", stale_after_s=0.3)  # the holder's own
        campaign = store.update_campaign(campaign.id, status=CampaignStatus.RUNNING)
        live = campaign_progress(store, campaign)
        time.sleep(0.5)
        silent = campaign_progress(store, campaign)
    assert live.driver.pid == os.getpid() and live.driver.host == socket.gethostname()
    assert not live.driver_stale and live.driver_silent_s < 0.3
    assert silent.driver_stale and silent.driver_silent_s >= 0.5
    text = status_text(silent, [])
    assert f"driver   pid {os.getpid()} on {socket.gethostname()}, last heartbeat" in text
    assert "it seems dead: `parsearch resume` takes the campaign over" in text
    assert "seems dead" not in status_text(live, [])


def test_the_drivers_eta_counts_down_while_a_trial_runs(monkeypatch):
    """After one finished trial in 10 s, 9 to go: 90 s then, 80 s ten seconds later (a rate
    taken now would have made it rise to 180 s)."""
    from parsearch.campaign import driver as driver_module

    driver = driver_module.Driver.__new__(driver_module.Driver)
    driver.settings = driver_module.DriverSettings(budget=10)
    driver.finished, driver._finished_here = 1, 1
    driver._started, driver._last_finish = 100.0, 110.0
    monkeypatch.setattr(driver_module.time, "monotonic", lambda: 110.0)
    assert driver._eta_s() == pytest.approx(90.0)
    monkeypatch.setattr(driver_module.time, "monotonic", lambda: 120.0)
    assert driver._eta_s() == pytest.approx(80.0)
    monkeypatch.setattr(driver_module.time, "monotonic", lambda: 300.0)
    assert driver._eta_s() == 0.0
