"""The driver and its sessions in-process, on a real SQLite file and the simulate backend."""

import dataclasses
import os
import signal
import time
from pathlib import Path

import pytest
from trials_seen import trials_seen

from parsearch.campaign.driver import Outcome
from parsearch.campaign.lease import Lease
from parsearch.campaign.observers import Observers
from parsearch.campaign.session import CampaignSettings, resume_campaign, start_campaign
from parsearch.errors import BackendError, CampaignLockedError, StoreError
from parsearch.result import TrialState
from parsearch.search.strategy import GuidedStrategy
from parsearch.space import load_space
from parsearch.store import CampaignStatus, open_store

SPACES = Path(__file__).parent.parent / "search_spaces"
GPT175 = SPACES / "gpt-175b-frontier.yaml"
TINY = SPACES / "tiny-cpu.yaml"


def _simulate(slots=1, **options):
    return CampaignSettings(
        backend="simulate",
        slots=slots,
        backend_options={key: str(value) for key, value in options.items()},
        grace_s=0.0,
        lease_timeout_s=2.0,
    )


def _trials(path, name=None):
    with open_store(path, readonly=True) as store:
        campaign = store.get_campaign(name)
        return campaign, store.trials(campaign.id)


@pytest.mark.parametrize("slots", [1, 64])
def test_finishes_exactly_the_budget_and_records_everything(tmp_path, slots):
    db = tmp_path / "c.db"
    summary = start_campaign(
        GPT175, db, budget=50, seed=1, settings=_simulate(slots, mem_factor=1.3)
    )
    assert summary.outcome is Outcome.BUDGET
    campaign, trials = _trials(db)
    assert len(trials) == summary.finished == 50
    assert all(t.state.finished for t in trials), trials_seen(trials)
    assert len({t.key for t in trials}) == 50
    assert {t.origin for t in trials} >= {"initial"}
    assert all(t.predicted and t.predicted["fits"] for t in trials)
    assert all(t.attempt == 1 and t.hosts for t in trials)
    assert any(t.state is TrialState.OOM for t in trials), "the best predicted do not fit"
    assert campaign.status is CampaignStatus.FINISHED and campaign.finished_at
    assert campaign.settings["strategy"] == "default" and campaign.backend == "simulate"
    assert campaign.space["name"] == "gpt-175b-frontier"
    assert {"parsearch", "deephyper", "python"} <= set(campaign.versions)
    best = max((t for t in trials if t.objective is not None), key=lambda t: t.objective)
    assert summary.best.number == best.number


def test_a_space_smaller_than_the_budget_ends_when_exhausted(tmp_path):
    summary = start_campaign(TINY, tmp_path / "c.db", budget=200, settings=_simulate(8))
    feasible = len(load_space(TINY).plan().feasible)
    assert summary.outcome is Outcome.EXHAUSTED
    assert summary.finished == feasible
    assert summary.campaign.status is CampaignStatus.FINISHED


def test_cbo_raw_records_what_does_not_divide_as_infeasible(tmp_path):
    settings = CampaignSettings(backend="simulate", strategy="cbo-raw", slots=4)
    summary = start_campaign(TINY, tmp_path / "c.db", budget=30, settings=settings)
    _, trials = _trials(tmp_path / "c.db")
    assert summary.finished == len(trials) == 30
    infeasible = [t for t in trials if t.state is TrialState.INFEASIBLE]
    assert infeasible and all(t.error for t in infeasible)
    assert any("does not divide the world size 4" in t.error for t in infeasible)
    assert all(t.predicted is None and not t.hosts for t in infeasible)


def test_run_refuses_an_existing_campaign_name(tmp_path):
    db = tmp_path / "c.db"
    start_campaign(TINY, db, budget=2, settings=_simulate())
    with pytest.raises(StoreError, match=r"already exists.*parsearch resume"):
        start_campaign(TINY, db, budget=2, settings=_simulate())
    start_campaign(TINY, db, name="again", budget=2, settings=_simulate())


def test_settings_are_checked_before_the_campaign_exists(tmp_path):
    db = tmp_path / "c.db"
    bad = CampaignSettings(backend="simulate", backend_options={"dealy": "1"})
    with pytest.raises(BackendError, match="no option dealy"):
        start_campaign(TINY, db, budget=2, settings=bad)
    with open_store(db, readonly=True) as store:
        assert store.list_campaigns() == []
    summary = start_campaign(TINY, db, budget=2, settings=_simulate())
    assert summary.campaign.settings["backend_settings"]["slots"] == 1


class _SignalAfterFirstTrial:
    """An observer that sends ``sig`` to this process once the first trial is stored: the
    signal lands mid-campaign, with the driver's handlers in place, however long the
    session took to start (a timer could fire while DeepHyper was still loading)."""

    name = "signal-after-first-trial"

    def __init__(self, sig: signal.Signals):
        self.sig = sig
        self.sent = False

    def trial_finished(self, campaign, record) -> None:
        if not self.sent:
            self.sent = True
            os.kill(os.getpid(), self.sig)

    def close(self) -> None:
        pass


def test_a_signal_drains_then_resume_continues_to_the_budget(tmp_path):
    db = tmp_path / "c.db"
    signaller = _SignalAfterFirstTrial(signal.SIGUSR1)
    settings = _simulate(4, delay=0.3, jitter=0.5)
    first = start_campaign(
        GPT175, db, budget=40, settings=settings, observers=Observers([signaller])
    )
    assert signaller.sent
    assert first.outcome is Outcome.STOPPED
    campaign, before = _trials(db)
    assert campaign.status is CampaignStatus.STOPPED
    done_before = {t.number: t for t in before if t.state.finished}
    interrupted = {t.number for t in before if t.state is TrialState.INTERRUPTED}
    assert 0 < len(done_before) < 40
    # Grace 0: the trials running at the signal were interrupted, not waited for.
    assert first.interrupted == len(interrupted) >= 1

    second = resume_campaign(db, overrides={"backend_options": {"delay": "0.01"}})
    assert second.outcome is Outcome.BUDGET
    _, after = _trials(db)
    assert len(after) == 40 and all(t.state.finished for t in after), trials_seen(after)
    by_number = {t.number: t for t in after}
    for number, trial in done_before.items():
        assert by_number[number] == trial, "a finished trial never changes"
    assert all(by_number[n].attempt == 2 for n in interrupted)
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL, "handlers are restored"


def test_a_drain_in_which_the_last_trials_finish_completes_the_campaign(tmp_path):
    """The warning lands while the budget's last trial runs, and it finishes within the
    grace: the campaign is finished, not stopped (a job chain would spend a job on it)."""
    db = tmp_path / "c.db"
    signaller = _SignalAfterFirstTrial(signal.SIGUSR1)
    settings = dataclasses.replace(_simulate(2, delay=1.0), grace_s=30.0)
    outcome = start_campaign(
        GPT175, db, budget=2, settings=settings, observers=Observers([signaller])
    )
    assert signaller.sent
    assert outcome.outcome is Outcome.BUDGET and outcome.interrupted == 0
    campaign, trials = _trials(db)
    assert campaign.status is CampaignStatus.FINISHED
    assert len(trials) == 2 and all(t.state is TrialState.OK for t in trials), trials_seen(trials)


def test_a_drain_spends_its_grace_recording_results_not_learning_from_them(tmp_path, monkeypatch):
    """What a drain's last trials teach is learnt again from the store on resume: the
    strategy is not told them while the grace runs (a fresh clone at load average 10
    overran a 10 s grace by 3 s, the driver refitting its models meanwhile)."""
    told: list[list[int]] = []
    finished = GuidedStrategy.finished

    def spy(self, results):
        told.append([record.number for record, _ in results])
        finished(self, results)

    monkeypatch.setattr(GuidedStrategy, "finished", spy)
    db = tmp_path / "c.db"
    signaller = _SignalAfterFirstTrial(signal.SIGUSR1)
    # The two trials end 2.1 s and 4.4 s in (their seeded jitter): apart enough that the
    # driver records them one at a time, the second in the drain, however loaded the node.
    settings = dataclasses.replace(_simulate(2, delay=3.0, jitter=0.5), grace_s=30.0)
    outcome = start_campaign(
        GPT175, db, budget=2, settings=settings, observers=Observers([signaller])
    )
    _, trials = _trials(db)
    assert outcome.outcome is Outcome.BUDGET, trials_seen(trials)
    assert all(t.state is TrialState.OK for t in trials), trials_seen(trials)
    first = min(trials, key=lambda t: t.finished_at)
    assert [numbers for numbers in told if numbers] == [[first.number]], (told, trials_seen(trials))


def test_timeout_stops_the_session_and_a_larger_budget_continues(tmp_path):
    db = tmp_path / "c.db"
    settings = _simulate(2, delay=0.1)
    settings = CampaignSettings(**{**settings.to_dict(), "timeout_s": 0.5, "grace_s": 5.0})
    first = start_campaign(GPT175, db, budget=100, settings=settings)
    assert first.outcome is Outcome.TIMED_OUT
    assert first.interrupted == 0, "the grace period let running trials finish"
    assert 4 <= first.finished < 20
    done = resume_campaign(db, budget=first.finished + 5, overrides={"timeout_s": 60.0})
    assert done.outcome is Outcome.BUDGET and done.finished == first.finished + 5
    again = resume_campaign(db)
    assert again.outcome is Outcome.BUDGET and again.finished == first.finished + 5


def test_a_live_lease_refuses_a_second_driver_and_a_stale_one_is_taken_over(tmp_path):
    db = tmp_path / "c.db"
    start_campaign(TINY, db, budget=2, settings=_simulate())
    with open_store(db) as store:
        campaign = store.get_campaign()
        store.acquire_lease(campaign.id, "driver-that-died", stale_after_s=1.0)
    with pytest.raises(CampaignLockedError, match="being run by another parsearch driver"):
        resume_campaign(db, budget=4)
    time.sleep(2.1)  # the campaign's lease timeout is 2 s
    assert resume_campaign(db, budget=4).finished == 4


def test_a_driver_that_lost_its_lease_notices_and_releases_nothing(tmp_path, monkeypatch):
    with open_store(tmp_path / "c.db") as store, open_store(tmp_path / "c.db") as other:
        campaign = store.create_campaign("c", {})
        with Lease(store, campaign.id, stale_after_s=1.0) as lease:
            lease.check()
            with monkeypatch.context() as paused:  # the driver stops beating (SIGSTOP)
                paused.setattr(store, "heartbeat", lambda *args: None)
                time.sleep(1.1)
                other.acquire_lease(campaign.id, "usurper", stale_after_s=60.0)
            time.sleep(0.6)
            with pytest.raises(CampaignLockedError, match="usurper"):
                lease.check()
        with pytest.raises(CampaignLockedError, match="usurper"):
            store.acquire_lease(campaign.id, "third", stale_after_s=60.0)


def test_an_idle_backend_still_releasing_a_slot_is_waited_for(tmp_path):
    """Ray keeps a finished trial's placement group until its actors close: for a moment
    no trial runs and no slot is free. The driver waits for it instead of failing."""
    settings = _simulate(1, delay=0.01, release=0.3)
    began = time.monotonic()
    summary = start_campaign(TINY, tmp_path / "c.db", budget=4, settings=settings)
    assert summary.outcome is Outcome.BUDGET and summary.finished == 4
    assert time.monotonic() - began >= 3 * 0.3  # each next trial waited for the release


def test_a_backend_whose_slot_never_frees_is_an_error_after_the_room_wait(tmp_path, monkeypatch):
    monkeypatch.setattr("parsearch.campaign.driver.ROOM_WAIT_S", 0.5)
    settings = _simulate(1, release=3600)
    with pytest.raises(BackendError, match=r"has had no free slot for 0\.5 s although no trial"):
        start_campaign(TINY, tmp_path / "c.db", budget=4, settings=settings)
    _, trials = _trials(tmp_path / "c.db")
    assert [t.state for t in trials] == [TrialState.OK]  # what finished is kept
