"""The simulate backend: the estimate's answer with seeded noise, OOM, delay and slots."""

import time
from pathlib import Path

import pytest

from parsearch.backends import Backend, create_backend
from parsearch.backends.simulate import SimulateSettings, simulate_trial
from parsearch.errors import BackendError
from parsearch.result import TrialState
from parsearch.space import load_space
from parsearch.trial import TrialSpec

SPACES = Path(__file__).parent.parent / "search_spaces"


@pytest.fixture(scope="module")
def space():
    return load_space(SPACES / "gpt-175b-frontier.yaml")


def _spec(space, layout, trial_id="t", seed=0):
    return TrialSpec(
        trial_id, space.model, layout, space.allocation, space.trainer, timeout_s=1e6, seed=seed
    )


def test_ok_trials_report_the_prediction_times_seeded_noise(space):
    layout, prediction = space.plan().feasible[0]
    exact = simulate_trial(space, _spec(space, layout), SimulateSettings(noise=0))
    assert exact.status is TrialState.OK
    assert exact.metrics["step_time_s"] == pytest.approx(prediction.step_time_s)
    assert exact.metrics["tokens_per_s"] == pytest.approx(prediction.tokens_per_s)
    assert exact.metrics["peak_mem_bytes"] == pytest.approx(prediction.memory.total)
    assert set(exact.metrics) >= {"tokens_per_s", "tflops_per_device", "mfu", "step_time_s"}

    noisy = [
        simulate_trial(space, _spec(space, layout, seed=s), SimulateSettings(noise=0.1))
        for s in range(20)
    ]
    again = simulate_trial(space, _spec(space, layout, seed=3), SimulateSettings(noise=0.1))
    assert again.metrics == noisy[3].metrics, "same seed and layout, same answer"
    ratios = [r.metrics["step_time_s"] / prediction.step_time_s for r in noisy]
    assert 0.7 < min(ratios) < 1 < max(ratios) < 1.4


def test_true_memory_may_differ_from_the_estimate(space):
    layout, prediction = space.plan().feasible[0]
    limit = space.memory_limit_bytes
    fits = simulate_trial(space, _spec(space, layout), SimulateSettings())
    assert fits.ok
    factor = 1.01 * limit / prediction.memory.total
    oom = simulate_trial(space, _spec(space, layout), SimulateSettings(mem_factor=factor))
    assert oom.status is TrialState.OOM and "out of memory" in oom.error
    assert oom.objective("tokens_per_s") == "F_oom"
    offset = limit - prediction.memory.total + 1
    assert (
        simulate_trial(
            space, _spec(space, layout), SimulateSettings(mem_offset_bytes=offset)
        ).status
        is TrialState.OOM
    )


def test_options_parse_and_refuse_unknown_keys(space):
    settings = SimulateSettings.from_options(
        {"delay": "0.5", "noise": "0", "mem_factor": "1.2", "mem_offset": "-2GiB", "seed": "7"}
    )
    assert settings == SimulateSettings(
        delay_s=0.5, noise=0.0, mem_factor=1.2, mem_offset_bytes=-2 * 2**30, seed=7
    )
    with pytest.raises(BackendError, match="valid: delay, fail_rate"):
        create_backend("simulate", space, options={"dealy": "1"})
    with pytest.raises(BackendError, match="noise must be a number"):
        create_backend("simulate", space, options={"noise": "lots"})
    with pytest.raises(BackendError, match="fail_rate must lie in"):
        create_backend("simulate", space, options={"fail_rate": "2"})


def test_slots_delay_and_cancel(space):
    backend = create_backend("simulate", space, slots=3, options={"delay": "0.2"})
    assert isinstance(backend, Backend)
    layouts = [layout for layout, _ in space.plan().feasible[:4]]
    start = time.monotonic()
    for i, layout in enumerate(layouts[:3]):
        assert backend.submit(_spec(space, layout, f"t{i}")) == [f"sim{2 - i}"]
    assert backend.free_slots() == 0
    with pytest.raises(BackendError, match="busy"):
        backend.submit(_spec(space, layouts[3], "t3"))
    backend.cancel("t1")
    assert backend.free_slots() == 1
    assert backend.poll(0.01) == []
    done = []
    while len(done) < 2:
        done += backend.poll(1.0)
    assert time.monotonic() - start >= 0.2
    assert sorted(f.trial_id for f in done) == ["t0", "t2"]
    assert backend.free_slots() == 3
    backend.close()


def test_fail_rate_and_timeout(space):
    layout, prediction = space.plan().feasible[0]
    crashed = simulate_trial(space, _spec(space, layout), SimulateSettings(fail_rate=1.0))
    assert crashed.status is TrialState.ERROR
    spec = _spec(space, layout)
    spec.timeout_s = prediction.step_time_s  # far less than the steps the trainer runs
    assert simulate_trial(space, spec, SimulateSettings()).status is TrialState.TIMEOUT


def test_unknown_and_unavailable_backends(space):
    with pytest.raises(BackendError, match="valid: local, simulate, mpi, ray"):
        create_backend("slurm", space)
    with pytest.raises(BackendError, match="slots must be >= 1"):
        create_backend("simulate", space, slots=0)
