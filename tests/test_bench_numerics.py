"""Every layout trains like one process, and the estimate meets what the trainer measures.

Each launch starts one layout's ranks once and trains several variants in turn (schedules,
ZeRO stage, sequence parallel, recompute, llama) in the same process group: starting ranks
costs far more than training the tiny model on this CPU. Each variant builds its model,
mesh, optimizer and schedule from scratch, so they are independent trials. The launches:
each parallelism alone (its own code paths: TP's sharded layers, PP's schedules, DP's ZeRO
stages) and TP with PP (the pipeline's stages sharded). Worlds stay at 4 ranks or fewer, as
on the 2-core machines the suite runs on: all three at once (8 ranks) is left to a machine
with the cores for it.
"""

from __future__ import annotations

import pytest
from bench_helpers import GLOBAL_BATCH, one_thread, run_many, tiny_spec

from parsearch.estimate import EstimateSettings, memory_by_stage
from parsearch.trainers.builtin.plain import plain_training

LLAMA = {"arch": "llama", "num_kv_heads": 2}
GPIPE = {"schedule": "gpipe"}
LAUNCHES = {
    (1, 1, 1): [
        tiny_spec(),
        tiny_spec(recompute="full"),
        tiny_spec(recompute="selective"),
        tiny_spec(model=LLAMA),
    ],
    (2, 1, 1): [
        tiny_spec(2),
        tiny_spec(2, sequence_parallel=True),
        tiny_spec(2, model=LLAMA),
    ],
    (1, 2, 1): [
        tiny_spec(1, 2),
        tiny_spec(1, 2, trainer=GPIPE),
        tiny_spec(1, 2, vpp=2),
        tiny_spec(1, 2, gas=1),  # fewer micro-batches than stages: 1F1B runs as GPipe
    ],
    (1, 1, 2): [
        tiny_spec(1, 1, 2),
        tiny_spec(1, 1, 2, zero_stage=3),
        tiny_spec(1, 1, 2, zero_stage=1),
        tiny_spec(1, 1, 2, zero_stage=2, model=LLAMA),
    ],
    (2, 2, 1): [
        tiny_spec(2, 2),
        tiny_spec(2, 2, trainer=GPIPE),
        tiny_spec(2, 2, vpp=2),
        tiny_spec(2, 2, sequence_parallel=True, recompute="full"),
        tiny_spec(2, 2, vpp=2, recompute="full", model=LLAMA),
    ],
}


def _layout(key: tuple[int, int, int]) -> pytest.ParameterSet:
    """One launch's tests, which share its results: one xdist worker runs them (their own
    group, finer than the module's, so the launches spread over the workers)."""
    name = "tp{}pp{}dp{}".format(*key)
    return pytest.param(key, id=name, marks=pytest.mark.xdist_group(f"bench-numerics-{name}"))


LAYOUTS = [_layout(key) for key in LAUNCHES]

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """Results of a launch, run the first time a test asks for it."""
    cache = {}

    def get(key):
        if key not in cache:
            directory = tmp_path_factory.mktemp("tp{}pp{}dp{}".format(*key))
            cache[key] = list(zip(LAUNCHES[key], run_many(LAUNCHES[key], directory), strict=True))
        return cache[key]

    return get


@pytest.fixture(scope="module")
def reference():
    """Per-step losses of the plain single-process loop, per model."""
    cache = {}

    def get(spec):
        if spec.model not in cache:
            steps = spec.trainer["warmup_steps"] + spec.trainer["steps"]
            with one_thread():
                cache[spec.model] = plain_training(spec, steps)[0]
        return cache[spec.model]

    return get


@pytest.mark.parametrize("key", LAYOUTS)
def test_losses_match_one_process(key, launched, reference):
    for spec, result in launched(key):
        assert result.ok, (spec.layout.short(), result.error)
        expected = reference(spec)
        assert len(result.metrics["losses"]) == len(expected) == 5
        assert result.metrics["losses"] == pytest.approx(expected, abs=1e-4), (
            spec.layout.short(),
            spec.trainer,
        )


@pytest.mark.parametrize("key", LAYOUTS)
def test_metrics_are_consistent(key, launched):
    for spec, result in launched(key):
        m = result.metrics
        tokens = GLOBAL_BATCH * spec.model.seq_length
        assert m["tokens_per_step"] == tokens
        assert m["tokens_per_s"] * m["step_time_s"] == pytest.approx(tokens)
        assert m["mfu"] == pytest.approx(m["tflops_per_device"] * 1e12 / 1e11)
        assert m["world_size"] == spec.layout.world_size == len(m["peak_mem_bytes_per_rank"])
        assert m["peak_mem_bytes"] == max(m["peak_mem_bytes_per_rank"])
        assert m["peak_rss_bytes"] > m["peak_mem_bytes"]
        measured = m["step_times_s"][spec.trainer["warmup_steps"] :]
        assert len(measured) == m["steps"] == 3
        assert m["step_time_spread_s"] == pytest.approx(max(measured) - min(measured))
        assert min(measured) <= m["step_time_s"] <= max(measured)


@pytest.mark.parametrize("key", LAYOUTS)
def test_memory_estimate_meets_measurement(key, launched):
    """``memory_per_rank`` of the built-in trainer (``framework="torch"``, fp32 as on CPU,
    no dropout, fused attention) within 15% of each rank's tensor-level peak."""
    settings = EstimateSettings(precision="fp32", framework="torch")
    for spec, result in launched(key):
        layout = spec.layout
        schedule = "gpipe" if result.metrics["schedule"] == "gpipe" else "1f1b"
        stages = memory_by_stage(spec.model, layout, settings, schedule)
        for rank, measured in enumerate(result.metrics["peak_mem_bytes_per_rank"]):
            stage = rank // (layout.world_size // layout.pp)  # tp-cp-dp-pp, pp outermost
            assert stages[stage].total == pytest.approx(measured, rel=0.15), (
                layout.short(),
                schedule,
                rank,
            )
