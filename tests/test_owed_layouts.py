"""The uncalibrated estimate's best fitting layouts are tried within the budget (issue 39).

A layout the estimate ranks in its top ten and expects to fit is tried unless a measured
twin (one step away in one searched dimension) rules it out: by running out of memory where
it is predicted to need no more, or by running too slowly for the estimate's step between
them to bring it near the best (:mod:`parsearch.search.owed`). The rule's pure parts are
tested on the GPT-22B Frontier space; the property on real campaigns over the project's
truths (``benchmarks/truths.py``), memory as declared, heavier and lighter.
"""

import tempfile
from pathlib import Path

import pytest
import yaml
from truths import MEMORY, TRUTHS, TruthBackend

from parsearch.campaign.api import run_campaign
from parsearch.config import ParallelLayout
from parsearch.result import TrialState
from parsearch.search.owed import (
    OWED_TOP,
    SLOWER_SHARE,
    Measured,
    owed,
    owed_count,
    step_apart,
)
from parsearch.search.strategy import GuidedStrategy
from parsearch.search.warm_start import WarmStart
from parsearch.space import load_space
from parsearch.store import open_store

SPACE = Path(__file__).parent.parent / "search_spaces" / "gpt-22b-frontier.yaml"
BUDGET = 60


@pytest.fixture(scope="module")
def space():
    return load_space(SPACE)


def layout(tp=2, pp=2, mbs=1, gas=64):
    return ParallelLayout(tp=tp, pp=pp, dp=128 // (tp * pp), mbs=mbs, gas=gas, zero_stage=1)


def predictions(space):
    plan = space.plan()
    return {lay.key(): p for lay, p in plan.feasible + plan.predicted_oom}


def test_a_twin_is_one_step_in_one_searched_dimension(space):
    base = layout()
    assert step_apart(space, base, layout(mbs=2))
    assert step_apart(space, base, layout(gas=32))
    assert step_apart(space, base, layout(pp=3))  # pp's candidates are 1, 2, 3, 4, 6...
    assert step_apart(space, base, layout(tp=4))  # dp follows tp
    assert not step_apart(space, base, base)
    assert not step_apart(space, base, layout(mbs=4))  # two steps
    assert not step_apart(space, base, layout(pp=4))  # two steps of pp's candidates
    assert not step_apart(space, base, layout(mbs=2, gas=32))  # two dimensions


def test_an_untried_top_layout_is_owed_until_a_twin_rules_it_out(space):
    top = space.plan().feasible[:OWED_TOP]
    target = top[0][0]
    known = predictions(space)
    assert [r for r, _ in owed(space, top, [], known, set())] == list(range(1, OWED_TOP + 1))
    tried = {lay.key() for lay, _ in top[1:]}
    assert owed(space, top, [], known, tried) == [(1, target)]
    # Measurements of layouts that are not twins rule nothing out.
    others = [
        Measured(lay, TrialState.OOM)
        for lay, _ in space.plan().feasible[OWED_TOP:]
        if not step_apart(space, lay, target)
    ][:20]
    assert owed(space, top, others, known, tried) == [(1, target)]


def twin_of(space, target, *, heavier):
    """A twin of ``target`` predicted to need more memory than it (``heavier``) or at most
    as much."""
    plan = space.plan()
    mine = predictions(space)[target.key()].peak_mem_bytes
    for other, prediction in plan.feasible + plan.predicted_oom:
        if step_apart(space, target, other) and (prediction.peak_mem_bytes > mine) == heavier:
            return other
    raise AssertionError("no such twin")


def test_a_twin_out_of_memory_rules_out_only_a_layout_needing_as_much(space):
    top = space.plan().feasible[:OWED_TOP]
    target = top[0][0]
    tried = {lay.key() for lay, _ in top[1:]}
    known = predictions(space)
    lighter = twin_of(space, target, heavier=False)  # needs no more than the target
    assert owed(space, top, [Measured(lighter, TrialState.OOM)], known, tried) == []
    heavier = twin_of(space, target, heavier=True)
    assert owed(space, top, [Measured(heavier, TrialState.OOM)], known, tried) == [(1, target)]


def test_a_twin_that_ran_rules_out_only_when_it_cannot_come_near_the_best(space):
    top = space.plan().feasible[:OWED_TOP]
    target = top[0][0]
    tried = {lay.key() for lay, _ in top[1:]}
    known = predictions(space)
    twin = twin_of(space, target, heavier=True)
    ratio = known[target.key()].tokens_per_s / known[twin.key()].tokens_per_s
    best = Measured(top[-1][0], TrialState.OK, 1000.0)
    slow = Measured(twin, TrialState.OK, 0.8 * SLOWER_SHARE * 1000.0 / ratio)
    fast = Measured(twin, TrialState.OK, 1.1 * SLOWER_SHARE * 1000.0 / ratio)
    assert owed(space, top, [best, slow], known, tried) == []
    assert owed(space, top, [best, fast], known, tried) == [(1, target)]


def test_the_strategy_proposes_what_it_owes_before_the_budget_runs_out(space):
    """With the smallest budget that owes the whole top ten, the ranking's own picks (one
    seed per (tp, pp) pair first) would leave some of it untried: the strategy proposes
    them once the budget left has no trial to spare, and tries all ten."""
    budget = 2 * OWED_TOP
    assert owed_count(budget) == OWED_TOP
    strategy = GuidedStrategy(space, seed=0)
    strategy.start([], budget=budget)
    proposals = []
    while len(proposals) < budget:
        asked = strategy.ask(1)
        assert asked
        proposals += asked
        # Every trial runs at 90% of its prediction: no twin rules out a top-ten layout.
        strategy.tell([(p.layout, 0.9 * p.prediction.tokens_per_s) for p in asked])
    proposed = {p.layout.key() for p in proposals}
    assert {lay.key() for lay, _ in space.plan().feasible[:OWED_TOP]} <= proposed
    assert "owed" in {p.origin for p in proposals}
    assert strategy.owed() == []


def timed_out_space(tmp_path, timeout_s):
    data = yaml.safe_load(SPACE.read_text())
    data["trainer"] = {
        "kind": "command", "parser": "json", "command": ["true"], "timeout": timeout_s,
    }  # fmt: skip
    path = tmp_path / "timed.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_space(path)


def test_a_layout_expected_to_time_out_is_not_owed(tmp_path):
    """The CI failure of the first version: a four-trial campaign under a 60 s timeout, whose
    ten best layouts all exceed it, spent every trial on them and measured nothing."""
    space = timed_out_space(tmp_path, 60)
    strategy = GuidedStrategy(space, seed=0)
    keys = [c.key for c in strategy.estimate.items]
    in_time = dict(zip(keys, strategy.estimate.in_time(), strict=True))
    uncalibrated = [lay for lay, _ in space.plan().feasible[:OWED_TOP]]
    assert not any(in_time[lay.key()] for lay in uncalibrated)  # else this tests nothing
    believed = [lay for lay, _ in strategy.believed_top]
    assert len(believed) == OWED_TOP and all(in_time[lay.key()] for lay in believed)


def test_what_a_warm_start_saw_run_out_of_memory_is_not_owed(space):
    """A warm start from this very space whose every ok peak ran 30% above the estimate:
    layouts predicted within 30% of the limit are believed not to fit, and are not owed."""
    plan = space.plan()
    limit = space.allocation.device_memory_bytes
    peaks = [(p.peak_mem_bytes, 1.3 * p.peak_mem_bytes) for _, p in plan.feasible[-8:]]
    warm = WarmStart("a test", space, peaks=peaks, ooms=[], steps=[])
    strategy = GuidedStrategy(space, seed=0, warm_start=warm)
    cold = [lay for lay, p in plan.feasible[:OWED_TOP]]
    heavy = [lay for lay, p in plan.feasible[:OWED_TOP] if 1.3 * p.peak_mem_bytes > limit]
    assert heavy, f"no top-ten layout within 30% of the limit: {[lay.short() for lay in cold]}"
    believed = {lay.key() for lay, _ in strategy.believed_top}
    assert not believed & {lay.key() for lay in heavy}, [lay.short() for lay in heavy]
    assert owed_count(6) == 3 and owed_count(1) == 0


def campaign_trials(truth_name, memory, seed):
    space = load_space(SPACE)
    truth = TRUTHS[truth_name](space, seed, MEMORY[memory])
    strategy = GuidedStrategy(space, seed=seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.db"
        run_campaign(
            space, path, backend=TruthBackend(truth, 1), strategy=strategy,
            budget=BUDGET, seed=seed,
        )  # fmt: skip
        with open_store(path, readonly=True) as store:
            return space, strategy, store.trials(store.get_campaign().id)


@pytest.mark.slow
@pytest.mark.parametrize("memory", ["as is", "heavier", "lighter"])
@pytest.mark.parametrize(
    ("truth_name", "seed"), [("rescaled", 0), ("independent", 4), ("field", 0)]
)
def test_no_top_ten_layout_that_fits_is_left_untried(truth_name, memory, seed):
    space, strategy, trials = campaign_trials(truth_name, memory, seed)
    assert len(trials) == BUDGET
    top = strategy.believed_top
    measured = [Measured(t.layout, t.state, t.objective) for t in trials if t.state.finished]
    tried = {t.layout.key() for t in trials}
    left = owed(space, top, measured, predictions(space), tried)
    seen = "; ".join(
        f"{t.layout.short()} {t.state.value} {t.objective or ''}".strip() for t in trials
    )
    assert not left, (
        f"{truth_name}, memory {memory}, seed {seed}: untried top-ten layouts no twin rules "
        f"out: {[(rank, lay.short()) for rank, lay in left]}; measured: {seen}"
    )
