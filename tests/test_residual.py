"""The residual field over layouts and the plateau that widens the search."""

from pathlib import Path

import numpy as np
import pytest

from parsearch.search.residual import Plateau, ResidualField, log_expected_improvement
from parsearch.search.strategy import GuidedStrategy
from parsearch.space import load_space

SPACE = Path(__file__).parent.parent / "search_spaces" / "gpt-22b-frontier.yaml"


@pytest.fixture(scope="module")
def space():
    return load_space(SPACE)


def test_the_field_is_the_estimate_until_measured_then_learns_around_measurements(space):
    layouts = [layout for layout, _ in space.plan().feasible]
    field = ResidualField(layouts, amplitude=0.2)
    calibrated = np.ones(len(layouts))
    mean, spread = field.posterior(calibrated)
    assert np.all(mean == 0) and np.allclose(spread, 0.2)
    measured = 0
    field.add(measured, 1.25)  # 25% better than the calibrated estimate said
    mean, spread = field.posterior(calibrated)
    assert mean[measured] == pytest.approx(np.log(1.25), rel=0.1)
    assert spread[measured] < 0.06
    far = [
        i
        for i, lay in enumerate(layouts)
        if abs(np.log2(lay.tp / layouts[0].tp)) >= 2 and abs(np.log2(lay.pp / layouts[0].pp)) >= 2
    ]
    assert np.abs(mean[far]).max() < 0.01 and spread[far].min() > 0.19


def test_plateau_counts_trials_without_a_real_gain():
    plateau = Plateau(patience=3, tolerance=0.01)
    for value in (10.0, 10.05, None, 9.0):
        plateau.add(value)
    assert plateau.stuck  # 10.05 is within 1% of 10: no gain
    plateau.add(12.0)
    assert not plateau.stuck


def test_a_stuck_search_ranks_unexplored_layouts_higher(space):
    strategy = GuidedStrategy(space, seed=0, patience=2)
    try:
        # Three measured layouts all came out 10% worse than calibrated: no gain since the
        # first, so the search is stuck.
        objective = strategy.estimate.objective()
        for i in (0, 1, 2):
            strategy.residual.add(i, 0.9 * float(objective[i]))
            strategy.plateau.add(0.9 * float(objective[i]))
            if i == 0:
                calm = strategy.scores()
        assert strategy.plateau.stuck
        stuck = strategy.scores()
        # Exploring raises every untried layout, the least known most.
        mean, spread = strategy.residual.posterior(objective)
        lifted = stuck / (objective * np.exp(mean))
        assert np.allclose(lifted, np.exp(strategy.explore * spread))
        assert not np.allclose(calm, stuck)
    finally:
        strategy.close()


def test_expected_improvement_prefers_the_unknown_over_a_known_near_miss():
    log_best = 0.0
    # Just below the best and well known (a sibling of the incumbent), against 10% below
    # and never checked.
    known, unknown = log_expected_improvement(
        np.array([-0.02, -0.10]), np.array([0.03, 0.2]), log_best
    )
    assert unknown > known
    # Higher means rank higher at equal spread, and the far tail (asymptotic form) keeps
    # ranking them, continuously where the two forms meet.
    means = np.linspace(-3.0, 0.5, 200)
    values = log_expected_improvement(means, np.full_like(means, 0.2), log_best)
    assert np.all(np.diff(values) > 0)
    z = np.array([-6.0 - 1e-9, -6.0 + 1e-9])
    edge = log_expected_improvement(z * 0.2, np.full(2, 0.2), log_best)
    assert abs(edge[0] - edge[1]) < 0.05
