"""DeepHyper's share of the default strategy's trials is earned (issue 39 item 2).

Its turn goes back to the ranking for good once ``optimizer_patience`` (3) of its results in a
row raised nothing. These tests drive a real ``GuidedStrategy`` (DeepHyper included) one
trial at a time, telling the ranking's proposals a rising objective and DeepHyper's either a
poor one or one that raises the best.
"""

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from parsearch.config import ParallelLayout
from parsearch.result import TrialState
from parsearch.search.strategy import GuidedStrategy
from parsearch.space import load_space

SPACES = Path(__file__).parent.parent / "search_spaces"


@pytest.fixture(scope="module")
def space_175b():
    return load_space(SPACES / "gpt-175b-frontier.yaml")


@dataclass
class Stored:
    """A stored trial as a resumed strategy reads it."""

    layout: ParallelLayout
    origin: str
    objective: float
    state: TrialState = TrialState.OK
    proxy_dp: int | None = None
    metrics: dict = field(default_factory=dict)


def _drive(strategy, trials, *, deephyper_gains=False, start=1000.0):
    """``trials`` one at a time: the ranking's each told 5% above the last value; DeepHyper's
    told 1.0, or 5% above the last too with ``deephyper_gains``. Returns (origins, stored
    trials)."""
    origins, stored, value = [], [], start
    for _ in range(trials):
        (proposal,) = strategy.ask(1)
        if proposal.origin == "optimizer" and not deephyper_gains:
            told = 1.0
        else:
            value *= 1.05
            told = value
        strategy.tell([(proposal.layout, told)])
        origins.append(proposal.origin)
        stored.append(Stored(proposal.layout, proposal.origin, told))
    return origins, stored


def _origins(space, *, deephyper_gains=False, **settings):
    """Who proposed each of 30 trials of a fresh default strategy with ``settings``."""
    strategy = GuidedStrategy(space, seed=0, **settings)
    try:
        return _drive(strategy, 30, deephyper_gains=deephyper_gains)[0]
    finally:
        strategy.close()


def test_a_share_that_finds_nothing_goes_back_to_the_ranking(space_175b):
    origins = _origins(space_175b)
    # Its first three turns ran and raised nothing; every later turn went to the ranking.
    assert origins.count("optimizer") == 3, origins
    assert origins.count("estimate") == 30 - 3 - origins.count("initial"), origins


def test_deephyper_is_told_nothing_once_it_has_given_its_share_back(space_175b):
    strategy = GuidedStrategy(space_175b, seed=0)
    told = []
    tell = strategy.optimizer.tell
    strategy.optimizer.tell = lambda results: (told.extend(results), tell(results))
    try:
        origins, _ = _drive(strategy, 30)
    finally:
        strategy.close()
    third = [i for i, origin in enumerate(origins) if origin == "optimizer"][2]
    # Each result up to its third dry one, then none: each tell refits its surrogate.
    assert len(told) == third, (len(told), origins)


@pytest.mark.parametrize(
    "settings", [{"deephyper_gains": True}, {"optimizer_patience": None}], ids=["gains", "kept"]
)
def test_a_share_that_gains_or_has_no_patience_keeps_one_turn_in_three(space_175b, settings):
    origins = _origins(space_175b, **settings)
    assert origins.count("optimizer") >= 8, origins


def test_a_resumed_campaign_remembers_what_deephyper_found(space_175b):
    first = GuidedStrategy(space_175b, seed=0)
    try:
        before, stored = _drive(first, 16)
    finally:
        first.close()
    assert before.count("optimizer") == 3, before
    resumed = GuidedStrategy(space_175b, seed=0)
    try:
        resumed.start(stored, budget=40)
        after, _ = _drive(resumed, 12, start=stored[-1].objective)
    finally:
        resumed.close()
    assert "optimizer" not in after, after
