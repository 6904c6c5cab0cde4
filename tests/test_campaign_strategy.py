"""The strategies: what they propose, never twice, never impossible, seeded by the estimate."""

from pathlib import Path

import pytest

from parsearch.result import TrialResult, TrialState
from parsearch.search.candidates import raw_layout
from parsearch.search.factory import make_strategy
from parsearch.search.strategy import (
    SETTLE_SPREADS,
    GuidedStrategy,
    RandomStrategy,
    RawCBOStrategy,
    StrategyError,
)
from parsearch.space import load_space

SPACES = Path(__file__).parent.parent / "search_spaces"


@pytest.fixture(scope="module")
def space_175b():
    return load_space(SPACES / "gpt-175b-frontier.yaml")


@pytest.fixture(scope="module")
def tiny():
    return load_space(SPACES / "tiny-cpu.yaml")


def _objective(space, layout):
    """A landscape like the real one: the prediction, failing where it does not fit."""
    if space.violations(layout):
        return "F_infeasible"
    prediction = space.predict(layout)
    return prediction.tokens_per_s if space.fits(prediction) else "F_oom"


def _drive(strategy, space, total, batch):
    """Ask in batches and tell every answer, as the driver does; return all proposals."""
    proposals = []
    while len(proposals) < total:
        asked = strategy.ask(min(batch, total - len(proposals)))
        if not asked:
            break
        proposals += asked
        strategy.tell([(p.layout, _objective(space, p.layout)) for p in asked])
    return proposals


@pytest.mark.parametrize("batch", [1, 16])
def test_default_never_proposes_an_impossible_or_repeated_layout(space_175b, batch):
    strategy = GuidedStrategy(space_175b, seed=3)
    try:
        proposals = _drive(strategy, space_175b, 80, batch)
    finally:
        strategy.close()
    assert len(proposals) == 80
    keys = [p.layout.key() for p in proposals]
    assert len(set(keys)) == len(keys)
    for proposal in proposals:
        assert space_175b.violations(proposal.layout) == []
        assert space_175b.fits(space_175b.predict(proposal.layout))
        assert strategy.allows(proposal.layout)
    assert {p.origin for p in proposals} >= {"initial", "optimizer"}


def test_deephyper_makes_most_proposals_in_a_space_with_string_dimensions(tiny):
    strategy = GuidedStrategy(tiny, seed=0, n_seeds=2)
    try:
        proposals = _drive(strategy, tiny, 30, 6)
    finally:
        strategy.close()
    origins = [p.origin for p in proposals]
    assert origins.count("optimizer") > 2 * origins.count("fallback")
    assert {p.layout.recompute for p in proposals} == {"none", "full"}


def test_default_starts_from_diverse_best_predicted_layouts(space_175b):
    strategy = GuidedStrategy(space_175b, seed=0)
    try:
        first = strategy.ask(len(strategy.seeds))
    finally:
        strategy.close()
    ranked = strategy.candidates.ranked
    assert [p.origin for p in first] == ["initial"] * len(first)
    assert first[0].layout == ranked[0].layout
    pairs = [(p.layout.tp, p.layout.pp) for p in first]
    assert len(set(pairs)) == len(pairs), "one seed per (tp, pp)"
    assert len(first) >= len(space_175b.searched) + 1


def test_repeated_asks_without_tells_still_give_new_layouts(tiny):
    strategy = GuidedStrategy(tiny, seed=1, n_seeds=1)
    try:
        strategy.tell([(p.layout, 1.0) for p in strategy.ask(8)])
        keys = [p.layout.key() for _ in range(10) for p in strategy.ask(1)]
    finally:
        strategy.close()
    assert len(set(keys)) == 10


def test_exhausts_the_feasible_space_then_proposes_nothing(tiny):
    feasible = len(tiny.plan().feasible)
    strategy = GuidedStrategy(tiny, seed=2)
    try:
        proposals = _drive(strategy, tiny, 10 * feasible, 16)
        assert strategy.ask(4) == []
    finally:
        strategy.close()
    assert len(proposals) == feasible
    assert len({p.layout.key() for p in proposals}) == feasible


def test_excluded_layouts_are_never_proposed(tiny):
    ranked = [layout for layout, _ in tiny.plan().feasible]
    strategy = GuidedStrategy(tiny, seed=0)
    strategy.exclude(ranked[:10])
    try:
        proposals = _drive(strategy, tiny, 100, 8)
    finally:
        strategy.close()
    assert {p.layout.key() for p in proposals}.isdisjoint(x.key() for x in ranked[:10])
    assert len(proposals) == len(ranked) - 10


def test_keep_predicted_oom_widens_the_candidates(space_175b):
    plan = space_175b.plan()
    pruned = GuidedStrategy(space_175b, seed=0)
    kept = GuidedStrategy(space_175b, seed=0, keep_predicted_oom=True)
    try:
        assert len(pruned.candidates) == len(plan.feasible)
        assert len(kept.candidates) == len(plan.feasible) + len(plan.predicted_oom)
        oom = plan.predicted_oom[0][0]
        assert kept.allows(oom) and not pruned.allows(oom)
    finally:
        pruned.close()
        kept.close()


def test_cbo_raw_and_random_search_the_raw_space_without_repeats(tiny):
    total = sum(1 for _ in tiny.points())
    for strategy in (RawCBOStrategy(tiny, seed=0), RandomStrategy(tiny, seed=0)):
        try:
            proposals = _drive(strategy, tiny, 2 * total, 8)
        finally:
            strategy.close()
        assert len({p.layout.key() for p in proposals}) == len(proposals) == total
        broken = [p for p in proposals if tiny.violations(p.layout)]
        assert broken, "the raw space includes layouts that do not divide"
        assert all(p.prediction is None for p in broken)


def test_raw_layout_keeps_distinct_points_distinct(tiny):
    keys = {raw_layout(tiny, point).key() for point in tiny.points()}
    assert len(keys) == sum(1 for _ in tiny.points())


def test_random_is_reproducible_by_seed(tiny):
    def order(seed):
        return [p.layout.key() for p in RandomStrategy(tiny, seed=seed).ask(10)]

    assert order(5) == order(5)
    assert order(5) != order(6)


def test_unknown_strategy_names_the_valid_ones(tiny):
    with pytest.raises(StrategyError, match="cbo-raw"):
        make_strategy("bayes", tiny, seed=0)


def _seeded(space, **options):
    """A default strategy whose seeds were measured at exactly what the estimate predicts."""
    strategy = GuidedStrategy(space, seed=0, **options)
    seeds = strategy.ask(strategy.n_seeds)
    strategy.tell([(p.layout, _objective(space, p.layout)) for p in seeds])
    return strategy


def test_settle_ends_once_no_untried_layout_could_beat_the_best(space_175b):
    """Measured as predicted, the best seed is the estimate's best: with no optimism
    (settle 0) nothing untried can beat it, and the strategy says it settled."""
    strategy = _seeded(space_175b, settle=0.0)
    assert strategy.ask(1) == []
    assert strategy.settled


def test_settle_keeps_looking_where_the_estimate_was_never_checked(space_175b):
    """Two posterior spreads (the default ``--settle``) leave the layouts far from the
    seeds hopeful, and without ``settle`` nothing ends before the space does."""
    for options in ({"settle": SETTLE_SPREADS}, {}):
        strategy = _seeded(space_175b, **options)
        assert len(strategy.ask(1)) == 1
        assert not strategy.settled


def test_settle_needs_the_default_strategy(tiny):
    with pytest.raises(StrategyError, match="--settle needs the default strategy"):
        make_strategy("random", tiny, seed=0, settle=True)


@pytest.fixture(scope="module")
def space_22b():
    return load_space(SPACES / "gpt-22b-frontier.yaml")


def test_a_layout_pruned_by_inference_alone_is_tried_for_its_expected_gain(space_22b):
    """A measured peak 10% above the estimate prunes the layouts near the wall; they may
    still fit (the calibration extrapolates from one layout). Once every layout still
    allowed is predicted below the best measured objective (the others are tried), the
    pruned layouts predicted above it are the only ones expected to gain anything: the
    next trial is one of them, not a layout predicted below the best."""
    strategy = GuidedStrategy(space_22b, seed=0, n_seeds=1)
    try:
        measured = strategy.candidates.ranked[80]
        strategy.exclude([measured.layout])
        peak = 1.1 * measured.prediction.memory.total
        ok = TrialResult(status=TrialState.OK, metrics={"peak_mem_bytes": peak})
        strategy.observe([(measured.layout, ok)])
        best = measured.prediction.tokens_per_s
        strategy.tell([(measured.layout, best)])
        scores, fits = strategy.scores(), strategy.estimate.fits()
        index = strategy.estimate.index
        strategy.exclude(
            c.layout
            for c in strategy.candidates.ranked
            if fits[index[c.key]] and scores[index[c.key]] > best
        )
        first = next(c for c in strategy.candidates.ranked if c.key not in strategy.seen)
        i = index[first.key]
        assert not fits[i], "pruned by the calibrated memory"
        assert space_22b.fits(first.prediction), "the estimate says it fits"
        assert scores[i] > best
        assert strategy.allows(first.layout)
        assert strategy.ask(1)[0].layout == first.layout
        # Its own out-of-memory trial is a measurement: it is out for good.
        strategy.tell([(first.layout, "F_oom")])
        assert strategy.estimate.fit_probability()[i] == 0.0
        assert not strategy.allows(first.layout)
    finally:
        strategy.close()


def _first_wave_ooms(space, heavier):
    """Out-of-memory trials of the first wave, one trial at a time, on a machine whose
    memory is ``heavier`` times the estimate's."""
    strategy = GuidedStrategy(space, seed=0)
    limit, ooms = space.memory_limit_bytes, 0
    try:
        for _ in range(strategy.n_seeds):
            (proposal,) = strategy.ask(1)
            assert proposal.origin == "initial"
            prediction = proposal.prediction
            peak = heavier * prediction.memory.total
            if peak > limit:
                ooms += 1
                strategy.tell([(proposal.layout, "F_oom")])
            else:
                metrics = {"peak_mem_bytes": peak}
                strategy.observe([(proposal.layout, TrialResult(TrialState.OK, metrics))])
                strategy.tell([(proposal.layout, prediction.tokens_per_s)])
    finally:
        strategy.close()
    return ooms


def test_the_first_wave_learns_from_its_out_of_memory_trials(space_22b):
    """After the first seed runs out of memory, before any peak is measured, the next
    seeds are the layouts worth most times their chance of fitting, not each (tp, pp)
    pair's best at a wall just shown to be lower."""
    assert _first_wave_ooms(space_22b, 1.25) <= 1
