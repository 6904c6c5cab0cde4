"""Memory feasibility from local evidence: twins, nearest measurements, out-of-memory bounds."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from parsearch.search.calibration import CalibratedEstimate
from parsearch.search.candidates import Candidate
from parsearch.search.local_memory import MAX_MARGIN, LocalMemory
from parsearch.space import load_space

GIB = 2**30
SPACE = Path(__file__).parent.parent / "search_spaces" / "gpt-22b-frontier.yaml"


@pytest.fixture(scope="module")
def space():
    return load_space(SPACE)


def estimate_of(space):
    plan = space.plan()
    items = [Candidate(layout, p) for layout, p in plan.feasible + plan.predicted_oom]
    return CalibratedEstimate(space, items)


def twins(estimate):
    """Two items differing only in gas, with the same predicted memory (gas >= pp)."""
    by_family: dict[tuple, list[int]] = {}
    for i, c in enumerate(estimate.items):
        layout = c.layout
        if layout.gas >= layout.pp > 1:
            key = (layout.tp, layout.pp, layout.dp, layout.mbs, round(estimate.predicted_mem[i]))
            by_family.setdefault(key, []).append(i)
    near_wall = [
        group
        for group in by_family.values()
        if len(group) > 1 and 0.9 < estimate.predicted_mem[group[0]] / (64 * GIB) < 0.99
    ]
    return near_wall[0][:2]


@pytest.mark.parametrize("reported", ["a peak", "no peak"])
def test_a_twin_that_ran_keeps_a_layout_a_wrong_shaped_global_fit_prunes(space, reported):
    """Whether or not the trainer reported its peak (a command trainer's log may print
    none; the published sweeps in benchmarks/replay/ have none), the twin ran: it fits."""
    estimate = estimate_of(space)
    first, twin = twins(estimate)
    # A machine whose memory is not affine in the estimate: small layouts far heavier than
    # predicted, large ones as predicted. The global fit says everything near the wall
    # overflows...
    rng = np.random.default_rng(0)
    small = np.flatnonzero(estimate.predicted_mem < 0.5 * 64 * GIB)
    for i in rng.choice(small, 6, replace=False):
        estimate.measured_peak(estimate.items[i].layout, 1.9 * estimate.predicted_mem[i])
    assert not estimate.fits()[twin]
    # ...but the twin that differs only in gas ran and fitted: the layout comes back.
    if reported == "a peak":
        estimate.measured_peak(estimate.items[first].layout, estimate.predicted_mem[first])
    else:
        estimate.measured_objective(estimate.items[first].layout, 1000.0)
    assert estimate.fits()[twin]


def test_an_out_of_memory_twin_rules_out_the_family_above_it(space):
    estimate = estimate_of(space)
    first, twin = twins(estimate)
    assert estimate.fits()[twin]
    estimate.out_of_memory(estimate.items[first].layout)
    assert not estimate.fits()[twin]


def test_nearest_measurements_correct_their_region_only(space):
    estimate = estimate_of(space)
    layouts = [c.layout for c in estimate.items]
    local = LocalMemory(layouts, estimate.predicted_mem)
    tp8 = [i for i, lay in enumerate(layouts) if lay.tp == 8]
    tp1 = [i for i, lay in enumerate(layouts) if lay.tp == 1]
    for i in tp8[:4]:
        local.add_peak(i, 1.3 * estimate.predicted_mem[i])
    peak, margin = local.calibrated(estimate.predicted_mem.copy())
    ratio = peak / estimate.predicted_mem
    assert ratio[tp8[:4]].min() > 1.15  # at the measurements: corrected (shrunk) upwards
    assert np.median(ratio[tp1]) == pytest.approx(1.0, abs=0.01)  # three log2 steps away
    assert margin is not None and margin <= MAX_MARGIN


def test_a_twin_in_another_dimension_with_the_same_predicted_memory_counts_too():
    space = load_space(SPACE.parent / "llama3-70b-h100.yaml")
    plan = space.plan()
    layouts = [layout for layout, _ in plan.feasible + plan.predicted_oom]
    predicted = np.array([p.memory.total for _, p in plan.feasible + plan.predicted_oom])
    keys = {lay.key(): i for i, lay in enumerate(layouts)}
    pairs = [
        (i, keys[other.key()])
        for i, lay in enumerate(layouts)
        if lay.recompute == "none"
        and (other := dataclasses.replace(lay, recompute="selective")).key() in keys
        and predicted[keys[other.key()]] == pytest.approx(predicted[i], rel=1e-4)
    ]
    assert pairs  # under flash attention, selective recompute keeps what none keeps
    measured, twin = pairs[0]
    local = LocalMemory(layouts, predicted)
    pessimistic = predicted * 1.3  # a global fit that prunes both
    limit = float(predicted[measured]) * 1.05
    assert not local.fits(pessimistic, limit, 0.0)[twin]
    local.add_peak(measured, float(predicted[measured]))
    assert local.fits(pessimistic, limit, 0.0)[twin]


def test_fit_probability_weighs_inference_and_trusts_measurements(space):
    """An out-of-memory trial makes every layout needing as much impossible and those a
    little below it unlikely, not impossible; a twin's measurement decides."""
    estimate = estimate_of(space)
    first, twin = twins(estimate)
    local = estimate.local
    predicted = estimate.predicted_mem
    limit = 64 * GIB
    heavier = np.flatnonzero(predicted > predicted[first])
    slightly = np.flatnonzero(
        (predicted < predicted[first]) & (predicted > 0.97 * predicted[first])
    )
    far = np.flatnonzero(predicted < 0.5 * predicted[first])
    before = local.fit_probability(predicted, limit, 0.05)
    estimate.out_of_memory(estimate.items[first].layout)
    after = local.fit_probability(predicted, limit, 0.05)
    assert after[twin] == 0.0 and after[heavier].max() == 0.0
    assert after[slightly].min() > 0.0 and after[slightly].max() < 0.7
    assert (after[slightly] < before[slightly]).all()
    assert after[far].min() > 0.99
