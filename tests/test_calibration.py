"""Online calibration of the estimate: memory fit, out-of-memory bounds, step-time weights."""

from pathlib import Path

import numpy as np
import pytest

from parsearch.search.calibration import (
    STEP_PARTS,
    CalibratedEstimate,
    MemoryCalibration,
    StepTimeCalibration,
    step_parts,
)
from parsearch.search.candidates import Candidate
from parsearch.space import load_space

GIB = 2**30
LIMIT = 64 * GIB
SPACES = Path(__file__).parent.parent / "search_spaces"


def test_uncalibrated_memory_is_the_estimate_without_margin():
    calibration = MemoryCalibration(LIMIT)
    assert calibration.peak(50 * GIB) == 50 * GIB
    assert calibration.fits(np.array([63.9, 64.1]) * GIB).tolist() == [True, False]


def test_one_measurement_gives_a_ratio():
    calibration = MemoryCalibration(LIMIT)
    calibration.add_peak(50 * GIB, 57.5 * GIB)
    fit = calibration.fit
    assert fit.slope == pytest.approx(1.15)
    assert fit.offset_bytes == 0
    assert calibration.peak(40 * GIB) == pytest.approx(46 * GIB)
    assert fit.margin == pytest.approx(calibration.first_margin)


def test_measurements_close_together_still_give_a_ratio():
    calibration = MemoryCalibration(LIMIT)
    for predicted in (50, 52, 54):
        calibration.add_peak(predicted * GIB, (0.9 * predicted - 2) * GIB)
    assert calibration.fit.offset_bytes == 0
    assert calibration.peak(52 * GIB) == pytest.approx((0.9 * 52 - 2) * GIB, rel=0.01)


def test_measurements_over_a_wide_range_give_an_affine_fit():
    calibration = MemoryCalibration(LIMIT)
    for predicted in (20, 35, 50, 60):
        calibration.add_peak(predicted * GIB, (0.87 * predicted - 1) * GIB)
    fit = calibration.fit
    assert fit.slope == pytest.approx(0.87, rel=1e-6)
    assert fit.offset_bytes == pytest.approx(-GIB, rel=1e-6)
    assert fit.margin == pytest.approx(calibration.first_margin / 4)


def test_one_outlier_barely_moves_the_affine_fit():
    calibration = MemoryCalibration(LIMIT)
    for predicted in (20, 28, 36, 44, 52, 60):
        calibration.add_peak(predicted * GIB, (1.1 * predicted + 2) * GIB)
    calibration.add_peak(40 * GIB, 1.4 * (1.1 * 40 + 2) * GIB)  # another rank's peak, say
    fit = calibration.fit
    assert fit.slope == pytest.approx(1.1, rel=0.01)
    assert fit.offset_bytes == pytest.approx(2 * GIB, rel=0.1)


def test_an_implausible_slope_falls_back_to_the_ratio():
    calibration = MemoryCalibration(LIMIT)
    calibration.add_peak(20 * GIB, 40 * GIB)
    calibration.add_peak(40 * GIB, 41 * GIB)  # slope 0.05: not a memory model
    assert calibration.fit.offset_bytes == 0


def test_an_out_of_memory_trial_prunes_what_needs_as_much_without_placing_the_wall():
    calibration = MemoryCalibration(LIMIT)
    calibration.add_oom(60 * GIB)
    # Where the wall is (the runtime's share of the device) is unknown: nothing is lifted,
    # but nothing expected to need as much as the failed trial is run either.
    assert calibration.peak(55 * GIB) == 55 * GIB
    assert not calibration.fits(np.array([60 * GIB]))[0]
    assert calibration.fits(np.array([55 * GIB]))[0]


def test_an_out_of_memory_trial_needs_more_than_the_largest_peak_that_fitted():
    calibration = MemoryCalibration(LIMIT)
    calibration.add_peak(50 * GIB, 50 * GIB)
    calibration.add_oom(45 * GIB)  # the estimate is wrong here: at least 50 GiB
    assert calibration.peak(45 * GIB) > 50 * GIB
    assert calibration.peak(45 * GIB) < LIMIT  # not lifted to the declared device size


def test_the_margin_never_swallows_a_large_share_of_the_device():
    calibration = MemoryCalibration(LIMIT)
    for predicted, factor in ((20, 2.0), (30, 1.0), (40, 1.7), (50, 0.9), (60, 1.4)):
        calibration.add_peak(predicted * GIB, factor * predicted * GIB)
    assert calibration.fit.margin <= 0.08


def test_an_out_of_memory_trial_overrides_an_optimistic_fit():
    calibration = MemoryCalibration(LIMIT)
    calibration.add_peak(40 * GIB, 40 * GIB)
    assert calibration.fits(np.array([61 * GIB]))[0]
    calibration.add_oom(62 * GIB)
    assert not calibration.fits(np.array([61.5 * GIB]))[0]  # within the margin of it


def test_a_consistent_out_of_memory_trial_changes_nothing():
    calibration = MemoryCalibration(LIMIT)
    calibration.add_peak(50 * GIB, 57.5 * GIB)
    before = calibration.fit
    calibration.add_oom(60 * GIB)  # 69 GiB calibrated: expected to fail
    assert calibration.fit == before


def test_a_pessimistic_estimate_lets_predicted_oom_layouts_in():
    calibration = MemoryCalibration(LIMIT)
    for predicted in (30, 45, 60):
        calibration.add_peak(predicted * GIB, 0.85 * predicted * GIB)
    assert calibration.fits(np.array([70 * GIB]))[0]  # 59.5 GiB on the machine
    assert not calibration.fits(np.array([76 * GIB]))[0]  # 64.6 GiB


def test_noisy_measurements_widen_the_margin():
    rng = np.random.default_rng(0)
    quiet, noisy = MemoryCalibration(LIMIT), MemoryCalibration(LIMIT)
    for predicted in np.linspace(20, 60, 12):
        quiet.add_peak(predicted * GIB, predicted * GIB)
        noisy.add_peak(predicted * GIB, predicted * GIB * rng.lognormal(0, 0.04))
    assert noisy.fit.margin > 2 * quiet.fit.margin
    assert 0.03 < noisy.fit.margin < 0.2


def test_down_weighted_measurements_yield_to_new_ones():
    calibration = MemoryCalibration(LIMIT)
    for predicted in (30, 40, 50, 60):
        calibration.add_peak(predicted * GIB, 1.3 * predicted * GIB, weight=0.1)
    calibration.add_peak(50 * GIB, 55 * GIB)
    assert calibration.peak(50 * GIB) == pytest.approx(55 * GIB, rel=0.02)


def test_step_weights_start_at_one_and_recover_a_mismatch():
    calibration = StepTimeCalibration()
    assert calibration.weights.tolist() == [1.0] * len(STEP_PARTS)
    rng = np.random.default_rng(1)
    true = np.array([1.15, 4.0, 1.0, 2.0, 2.5])
    for _ in range(40):
        parts = rng.uniform(0.0, 1.0, len(STEP_PARTS)) * np.array([10, 3, 2, 1, 2])
        calibration.add(parts, float(parts @ true))
    assert calibration.weights == pytest.approx(true, rel=0.05)


def test_one_step_measurement_moves_the_prediction_towards_it():
    calibration = StepTimeCalibration()
    parts = np.array([6.0, 1.0, 1.0, 0.5, 0.5])
    calibration.add(parts, 1.3 * parts.sum())
    calibrated = calibration.step_time(parts[None, :])[0]
    assert parts.sum() * 1.2 < calibrated <= parts.sum() * 1.3
    assert (calibration.weights > 1).all()


@pytest.fixture(scope="module")
def space_22b():
    return load_space(SPACES / "gpt-22b-frontier.yaml")


def _estimate(space):
    plan = space.plan()
    items = [Candidate(layout, p) for layout, p in plan.feasible + plan.predicted_oom]
    return CalibratedEstimate(space, items), plan


def test_step_parts_sum_to_the_predicted_step(space_22b):
    for layout, prediction in space_22b.plan().feasible[:50]:
        parts = step_parts(space_22b, layout, prediction)
        assert (parts >= 0).all()
        assert parts.sum() == pytest.approx(prediction.step_time_s, rel=1e-9)


def test_calibrated_estimate_reprunes_and_reranks(space_22b):
    estimate, plan = _estimate(space_22b)
    assert estimate.fits().sum() == len(plan.feasible)  # before any trial: the estimate
    best = 0
    estimate.measured_objective(estimate.items[best].layout, 0.8 * estimate.predicted_objective[0])
    assert estimate.objective()[best] == pytest.approx(0.8 * estimate.predicted_objective[0], 0.1)
    # Memory 15% below the estimate: layouts predicted OOM come in.
    for item in estimate.items[:5]:
        estimate.measured_peak(item.layout, 0.85 * item.prediction.memory.total)
    assert estimate.fits().sum() > len(plan.feasible)


def test_a_timed_out_trial_is_a_lower_bound_on_its_step_time(space_22b):
    estimate, _ = _estimate(space_22b)
    runs = estimate.step.step_time(estimate.parts) * estimate.timed_steps
    assert not estimate.in_time().all(), "the 22B space's slowest layouts exceed its timeout"
    slow = int(np.argmax(np.where(estimate.in_time(), runs, 0)))
    estimate.timed_out(estimate.items[slow].layout)
    after = estimate.step.step_time(estimate.parts) * estimate.timed_steps
    assert after[slow] > runs[slow]
    assert after[slow] == pytest.approx(estimate.timeout_s, rel=0.01)
    assert not estimate.in_time()[runs >= 1.05 * runs[slow]].any()


def test_a_lower_bound_already_met_changes_nothing():
    calibration = StepTimeCalibration()
    parts = np.array([6.0, 1.0, 1.0, 0.5, 0.5])
    calibration.add(parts, 9.0)
    before = calibration.weights.copy()
    calibration.add(parts * 0.5, 3.0, at_least=True)  # predicted ~4.5 s: no news
    assert calibration.weights == pytest.approx(before)
