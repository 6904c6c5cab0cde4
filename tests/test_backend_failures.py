"""A backend that raises: while concluding one trial, the trial is an error naming the
exception and the campaign goes on; out of ``poll`` itself (no trial to blame, the backend is
broken), the driver stops with an error naming the backend and the exception, the campaign is
marked stopped with that reason, and ``resume`` on a working backend finishes the budget
exactly without changing a finished trial.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from trials_seen import trials_seen

from parsearch.backends import Finished
from parsearch.backends.simulate import SimulateBackend, SimulateSettings
from parsearch.campaign.session import CampaignSettings, resume_campaign, start_campaign
from parsearch.errors import BackendError, BackendOptionError
from parsearch.result import TrialResult, TrialState
from parsearch.space import load_space
from parsearch.store import CampaignStatus, open_store
from parsearch.trial import TrialSpec

TINY = str(Path(__file__).resolve().parents[1] / "search_spaces" / "tiny-cpu.yaml")
BUDGET = 8
SIMULATE = CampaignSettings(backend="simulate")


class ConclusionFails(SimulateBackend):
    """Raises while concluding every trial with tensor parallelism 2."""

    def outcome(self, spec: TrialSpec) -> TrialResult:
        if spec.layout.tp == 2:
            raise RuntimeError(f"cannot read the result of {spec.trial_id}")
        return super().outcome(spec)


class PollBreaks(SimulateBackend):
    """Reports three trials, then every poll raises (a lost connection, a bug)."""

    reported = 0

    def poll(self, timeout_s: float) -> list[Finished]:
        if self.reported >= 3:
            raise ConnectionError("the backend's service went away")
        done = super().poll(timeout_s)[: 3 - self.reported]
        self.reported += len(done)
        return done


def _backend(kind: type[SimulateBackend], slots: int = 1) -> SimulateBackend:
    return kind(load_space(TINY), SimulateSettings(), slots)


def test_a_trial_whose_conclusion_raises_is_an_error_and_the_campaign_goes_on(tmp_path):
    db = tmp_path / "s.db"
    summary = start_campaign(
        TINY, db, budget=BUDGET, settings=SIMULATE, backend=_backend(ConclusionFails)
    )
    assert summary.outcome.complete and summary.finished == BUDGET
    with open_store(db, readonly=True) as store:
        trials = store.trials(summary.campaign.id)
    failed = [t for t in trials if t.state is TrialState.ERROR]
    assert failed and all(t.layout.tp == 2 for t in failed)
    for trial in failed:
        assert trial.error is not None
        assert "backend 'simulate' failed while concluding the trial: RuntimeError" in trial.error
    assert all(t.state is TrialState.OK for t in trials if t.layout.tp != 2), trials_seen(trials)


def test_a_backend_whose_poll_raises_stops_the_campaign_resumably(tmp_path):
    db = tmp_path / "s.db"
    with pytest.raises(BackendError) as raised:
        start_campaign(TINY, db, budget=BUDGET, settings=SIMULATE, backend=_backend(PollBreaks, 2))
    message = str(raised.value)
    assert "backend 'simulate' failed while collecting finished trials" in message
    assert "ConnectionError: the backend's service went away" in message
    assert any("marked stopped" in note for note in raised.value.__notes__)

    with open_store(db, readonly=True) as store:
        campaign = store.get_campaign()
        kept = [t for t in store.trials(campaign.id) if t.state.finished]
        counts = store.counts(campaign.id)
    assert campaign.status is CampaignStatus.STOPPED
    assert campaign.stop_reason == message and campaign.stopped_at is not None
    assert len(kept) == 3 and counts[TrialState.RUNNING] == counts[TrialState.QUEUED] == 0

    summary = resume_campaign(db)  # the stored settings: a working simulate backend
    assert summary.outcome.complete and summary.finished == BUDGET
    with open_store(db, readonly=True) as store:
        campaign = store.get_campaign()
        trials = {t.id: t for t in store.trials(campaign.id)}
    assert campaign.status is CampaignStatus.FINISHED and campaign.stop_reason is None
    assert all(trials[t.id] == t for t in kept)


def test_a_backend_that_refuses_the_settings_leaves_the_campaign_as_it_was(tmp_path):
    db = tmp_path / "s.db"
    start_campaign(TINY, db, budget=2, settings=SIMULATE)
    with pytest.raises(BackendOptionError, match="no option nope"):
        resume_campaign(db, budget=4, overrides={"backend_options": {"nope": "1"}})
    with open_store(db, readonly=True) as store:
        campaign = store.get_campaign()
    assert campaign.status is CampaignStatus.FINISHED and campaign.budget == 2
