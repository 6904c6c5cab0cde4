"""``parsearch.run_campaign``: a campaign driven with a backend object, into a real store."""

import subprocess
import sys
from pathlib import Path

import pytest

import parsearch
from parsearch.backends.simulate import SimulateBackend, SimulateSettings
from parsearch.errors import StoreError
from parsearch.result import TrialState
from parsearch.search.strategy import RandomStrategy
from parsearch.store import CampaignStatus, open_store

SPACE = Path(__file__).parent.parent / "search_spaces" / "gpt-22b-frontier.yaml"


class CountingBackend(SimulateBackend):
    """The simulate backend, remembering what it ran and whether it was closed."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.submitted: list[str] = []
        self.closed = False

    def submit(self, spec):
        self.submitted.append(spec.layout.key())
        return super().submit(spec)

    def close(self):
        self.closed = True
        super().close()


def test_runs_on_the_given_backend_object_into_a_store_file(tmp_path):
    space = parsearch.load_space(SPACE)
    backend = CountingBackend(space, SimulateSettings(seed=3, mem_factor=0.9), slots=2)
    store_path = tmp_path / "api.db"
    summary = parsearch.run_campaign(
        space, store_path, backend=backend, strategy="random", budget=6, seed=3
    )
    assert summary.outcome.complete and summary.finished == 6
    assert backend.closed
    with open_store(store_path, readonly=True) as store:
        campaign = store.get_campaign(space.name)
        trials = store.trials(campaign.id)
        assert campaign.status is CampaignStatus.FINISHED
        assert campaign.backend == "simulate" and campaign.settings["strategy"] == "random"
        # Every trial that could run ran on this backend, and none twice (a raw-space layout
        # that does not divide is recorded without running).
        ran = [t.layout.key() for t in trials if t.state is not TrialState.INFEASIBLE]
        assert ran and sorted(ran) == sorted(backend.submitted)
        assert len(trials) == 6 and len(set(backend.submitted)) == len(backend.submitted)
        ok = [t for t in trials if t.state is TrialState.OK]
        assert ok and summary.best is not None
        assert summary.best.objective == max(t.objective for t in ok)


def test_takes_a_strategy_object_and_refuses_a_second_campaign_of_that_name(tmp_path):
    space = parsearch.load_space(SPACE)
    store_path = tmp_path / "api.db"
    strategy = RandomStrategy(space, seed=1)
    backend = SimulateBackend(space, SimulateSettings(seed=1), slots=1)
    summary = parsearch.run_campaign(
        SPACE, store_path, backend=backend, strategy=strategy, budget=4, name="r"
    )
    assert summary.finished == 4 and summary.campaign.settings["strategy"] == "random"
    with pytest.raises(StoreError, match="campaign 'r' already exists"):
        parsearch.run_campaign(
            space, store_path, backend=SimulateBackend(space, SimulateSettings(), 1), name="r"
        )
    with open_store(store_path, readonly=True) as store:
        assert [c.name for c in store.list_campaigns()] == ["r"]
        assert len(store.trials(store.get_campaign("r").id)) == 4


def test_a_bad_budget_is_refused_before_anything_is_written(tmp_path):
    space = parsearch.load_space(SPACE)
    backend = SimulateBackend(space, SimulateSettings(), 1)
    with pytest.raises(parsearch.ParsearchError, match=r"budget must lie in \[1, "):
        parsearch.run_campaign(space, tmp_path / "x.db", backend=backend, budget=0)
    assert not (tmp_path / "x.db").exists()


def test_the_package_root_stays_light():
    code = (
        "import sys, parsearch; "
        "heavy = {'numpy', 'pandas', 'torch', 'deephyper'} & set(sys.modules); "
        "assert callable(parsearch.run_campaign) and callable(parsearch.load_space); "
        "print(sorted(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
