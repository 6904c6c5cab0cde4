"""The default strategy finds the optimum when the memory estimate is 15-25% off either way.

Each campaign runs end to end (session, driver, store, ``simulate`` backend) on the GPT-22B
Frontier space, whose best layouts sit at the memory wall. The simulated machine's peak
memory is ``predicted x mem_factor + mem_offset``: 15% more than the estimate plus 1 GiB
(its best predicted layouts run out of memory), or 25% less (its best layouts are predicted
out of memory; at 15-20% less a layout within 97% of the optimum fits by the estimate).
The exhaustive optimum is the best the same simulated machine reports over every layout
that divides.
"""

from pathlib import Path

import pytest

from parsearch.backends.simulate import SimulateSettings, simulate_trial
from parsearch.campaign.session import CampaignSettings, resume_campaign, start_campaign
from parsearch.result import TrialState
from parsearch.search.strategy import GuidedStrategy
from parsearch.space import load_space
from parsearch.store import open_store
from parsearch.trial import TrialSpec

SPACE = Path(__file__).parent.parent / "search_spaces" / "gpt-22b-frontier.yaml"
BUDGET = 20
SEED = 0


def exhaustive(space, options, seed):
    """(best objective, its layout) over every dividing layout on the simulated machine."""
    settings = SimulateSettings.from_options(options)
    plan = space.plan()
    found = []
    for layout, _ in plan.feasible + plan.predicted_oom:
        spec = TrialSpec(
            "t", space.model, layout, space.allocation, dict(space.trainer), 900.0, seed=seed
        )
        result = simulate_trial(space, spec, settings)
        if result.ok:
            found.append((result.metrics[space.objective], layout))
    return max(found, key=lambda item: item[0])


def campaign(tmp_path, options):
    store_path = tmp_path / "c.db"
    start_campaign(
        SPACE,
        store_path,
        budget=BUDGET,
        seed=SEED,
        settings=CampaignSettings(backend="simulate", backend_options=options),
    )
    with open_store(store_path, readonly=True) as store:
        return store.trials(store.get_campaign().id)


@pytest.mark.parametrize(
    "options",
    [
        {"mem_factor": "1.15", "mem_offset": "1GiB"},
        {"mem_factor": "0.75"},
    ],
    ids=["estimate-15%-low", "estimate-25%-high"],
)
def test_default_finds_the_optimum_with_a_wrong_memory_estimate(tmp_path, options):
    space = load_space(SPACE)
    optimum, best_layout = exhaustive(space, options, SEED)
    trials = campaign(tmp_path, options)
    assert len(trials) == BUDGET
    best = max(t.objective or 0.0 for t in trials)
    assert best >= 0.97 * optimum
    ooms = sum(t.state is TrialState.OOM for t in trials)
    assert ooms <= 0.15 * BUDGET
    if options["mem_factor"] == "0.75":
        # The optimum is one the uncalibrated estimate would never have run, and so is the
        # first trial that reached 97% of it (a layout the estimate prunes; the best
        # measurement may later come from a layout within the noise of it that fits).
        assert not space.fits(space.predict(best_layout))
        found = next(t for t in trials if (t.objective or 0.0) >= 0.97 * optimum)
        assert not space.fits(space.predict(found.layout))


def test_resume_gives_the_strategy_every_measured_peak(tmp_path, monkeypatch):
    """A resumed campaign re-learns its calibration from the store, peaks included."""
    store_path = tmp_path / "c.db"
    settings = CampaignSettings(backend="simulate", backend_options={"mem_factor": "0.85"})
    start_campaign(SPACE, store_path, budget=6, seed=SEED, settings=settings)
    observed = []
    original = GuidedStrategy.observe

    def observe(self, results):
        observed.extend(results)
        original(self, results)

    monkeypatch.setattr(GuidedStrategy, "observe", observe)
    resume_campaign(store_path, budget=8)
    peaks = [r.metrics["peak_mem_bytes"] for _, r in observed[:6]]
    assert len(observed) == 8
    assert all(peak > 0 for peak in peaks)
