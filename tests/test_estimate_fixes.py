"""The estimate's structural fixes of issue 31, each against a case computed by hand: the
hierarchical data-parallel all-reduce where ranks share a node's links, ZeRO-3's extra
gather under full recompute, the once-per-step optimizer work, the pipeline's fill and
drain at the pace of the stages it passes, and the GEMM curve fitted through benchmarked
shapes."""

import math

import pytest

from parsearch.config import AllocationSpec, ModelSpec, ParallelLayout
from parsearch.estimate import EstimateSettings, predict
from parsearch.estimate.flops import embedding_params, head_params, layer_params
from parsearch.estimate.machine import GemmShapePoint, fit_gemm_curve
from parsearch.estimate.timing import (
    bubble_in_slots,
    dp_collective_s,
    dp_ranks_per_node,
    stage_compute_s,
    step_fixed_s,
    zero3_passes,
)

SMALL = ModelSpec(num_layers=4, hidden_size=1024, num_heads=16, vocab_size=32000, seq_length=1024)
DGX = AllocationSpec(
    nodes=4,
    devices_per_node=8,
    device_memory_bytes=80 * 2**30,
    peak_flops_per_device=312e12,
    intra_node_bandwidth_bytes_per_s=300e9,
    inter_node_bandwidth_bytes_per_s=25e9,
    memory_bandwidth_bytes_per_s=2e12,
)
NO_LATENCY = EstimateSettings(collective_latency_s=0.0)


def test_dp_ranks_per_node_follow_megatrons_order():
    assert dp_ranks_per_node(ParallelLayout(tp=1, pp=1, dp=32, mbs=1, gas=1), DGX) == 8
    assert dp_ranks_per_node(ParallelLayout(tp=2, pp=1, dp=16, mbs=1, gas=1), DGX) == 4
    assert dp_ranks_per_node(ParallelLayout(tp=8, pp=1, dp=4, mbs=1, gas=1), DGX) == 1
    assert dp_ranks_per_node(ParallelLayout(tp=1, pp=8, dp=4, mbs=1, gas=1), DGX) == 4


def test_dp_all_reduce_is_hierarchical_where_ranks_share_a_nodes_links():
    size = 8e9
    layout = ParallelLayout(tp=1, pp=1, dp=32, mbs=1, gas=1)
    inside = 2 * (7 / 8) * size / 300e9  # reduce-scatter + all-gather over 8 ranks
    across = 2 * (3 / 4) * (size / 8) / 25e9  # 8 all-reduces of size/8 over 4 nodes
    got = dp_collective_s("all-reduce", size, layout, DGX, NO_LATENCY)
    assert got == pytest.approx(inside + across)
    flat = 2 * (31 / 32) * size / 25e9
    assert dp_collective_s(
        "all-reduce", size, layout, DGX, NO_LATENCY, hierarchical=False
    ) == pytest.approx(flat)
    assert got < flat / 5
    # One rank of the group per node (TP fills it): the flat ring, unchanged.
    wide = ParallelLayout(tp=8, pp=1, dp=4, mbs=1, gas=1)
    assert dp_collective_s("all-reduce", size, wide, DGX, NO_LATENCY) == pytest.approx(
        2 * (3 / 4) * size / 25e9
    )
    # All inside one node: a ring over the node's links.
    inner = ParallelLayout(tp=1, pp=1, dp=8, mbs=1, gas=1)
    one_node = AllocationSpec(**{**DGX.__dict__, "nodes": 1})
    assert dp_collective_s("all-reduce", size, inner, one_node, NO_LATENCY) == pytest.approx(
        2 * (7 / 8) * size / 300e9
    )


def test_zero3_gathers_once_more_under_full_recompute():
    full = ParallelLayout(tp=1, pp=1, dp=32, mbs=1, gas=2, zero_stage=3, recompute="full")
    none = ParallelLayout(tp=1, pp=1, dp=32, mbs=1, gas=2, zero_stage=3)
    assert zero3_passes(full) == 3 and zero3_passes(none) == 2
    stage = (4 * layer_params(SMALL) + max(embedding_params(SMALL), head_params(SMALL))) * 2
    unit = (31 / 32) * stage / 25e9  # one flat ring gather (or reduce-scatter), bf16 weights
    exposed = EstimateSettings(collective_latency_s=0.0, dp_overlap=1e-12)
    for layout, units in ((full, 4), (none, 3)):  # gathers per pass + one reduce-scatter
        prediction = predict(SMALL, layout, DGX, exposed)
        traffic = prediction.dp_comm_s - prediction.optimizer_s
        assert traffic == pytest.approx(2 * units * unit, rel=1e-6)


def test_the_optimizer_step_streams_the_ranks_shard_once_per_step():
    layout = ParallelLayout(tp=2, pp=2, dp=8, mbs=1, gas=4, zero_stage=1)
    stage = 2 * layer_params(SMALL) / 2 + max(embedding_params(SMALL), head_params(SMALL)) / 4
    streamed = stage / 8 * 34 + stage * 8  # Adam and the 16-bit copy on the shard; norm, zero
    hops = 2 * math.ceil(math.log2(32))  # two tree all-reduces of a scalar over 32 ranks
    settings = EstimateSettings(collective_latency_s=10e-6)
    expected = streamed / 2e12 + 2 * hops * 10e-6
    assert step_fixed_s(SMALL, layout, DGX, settings) == pytest.approx(expected)
    prediction = predict(SMALL, layout, DGX, settings)
    assert prediction.optimizer_s == pytest.approx(expected)
    # Without ZeRO every rank streams the whole stage's optimizer state.
    plain = ParallelLayout(tp=2, pp=2, dp=8, mbs=1, gas=4)
    assert step_fixed_s(SMALL, plain, DGX, settings) == pytest.approx(
        stage * 42 / 2e12 + 2 * hops * 10e-6
    )


def test_the_bubble_passes_each_other_stage_once():
    assert bubble_in_slots([1.0, 1.0, 1.0, 1.0]) == pytest.approx(3.0)
    # A last stage twice as slow (the logits) paces the micro-batches, not the fill/drain.
    assert bubble_in_slots([1.0, 1.0, 1.0, 2.0]) == pytest.approx(3.0 / 2.0)
    assert bubble_in_slots([1.0, 1.0, 1.0, 2.0], vpp=2) == pytest.approx(3.0 / 4.0)


def test_a_predicted_pipeline_step_is_m_minus_one_slowest_plus_every_stage():
    model = ModelSpec(
        num_layers=4, hidden_size=1024, num_heads=16, vocab_size=256000, seq_length=1024
    )
    layout = ParallelLayout(tp=1, pp=4, dp=1, mbs=1, gas=8)
    settings = EstimateSettings(collective_latency_s=0.0)
    one_node = AllocationSpec(**{**DGX.__dict__, "nodes": 1})
    stages = stage_compute_s(model, layout, one_node, settings)
    assert stages[-1] > 1.5 * stages[0]  # the big vocabulary's logits
    prediction = predict(model, layout, one_node, settings)
    pipeline = prediction.step_time_s - prediction.p2p_s - prediction.dp_comm_s
    assert pipeline == pytest.approx(7 * max(stages) + sum(stages), rel=1e-9)


def test_a_gemm_curve_fits_benchmarked_shapes():
    peak = 100e12
    half = 2.0**19
    # One shape of E = half elements at 40% of peak: cap 0.8, the default half kept.
    one = (GemmShapePoint(m=512, n=1024, k=4096, tflops=40.0),)
    assert fit_gemm_curve(one, peak, half) == pytest.approx((0.8, half))

    # Two shapes on a curve of cap 0.9 and half 2^20 give both back.
    def on_curve(m, n):
        e = m * n
        return GemmShapePoint(m=m, n=n, k=4096, tflops=100 * 0.9 * e / (e + 2**20))

    cap, fitted = fit_gemm_curve((on_curve(1024, 1024), on_curve(8192, 8192)), peak, half)
    assert cap == pytest.approx(0.9) and fitted == pytest.approx(2.0**20)


def test_a_device_profile_times_the_element_wise_work_at_its_memory_bandwidth():
    from parsearch.estimate.machine import MachineProfile
    from parsearch.estimate.timing import elementwise_bytes

    layout = ParallelLayout(tp=2, pp=1, dp=1, mbs=2, gas=1)
    settings = EstimateSettings(dropout=True)
    tokens, h, f = 2 * 1024, 1024, 4096
    # Norms and adds: (10·2 + 2·1) bytes of each hidden element, forward and backward,
    # replicated over TP; GELU: 2·2 bytes of each FFN element forward, 3·2 backward, split.
    expected = tokens * (2 * 22 * h + (4 + 6) * f / 2)
    assert elementwise_bytes(SMALL, layout, settings) == pytest.approx(expected)
    # Full recompute runs the forward again; sequence parallel splits the replicated part.
    again = ParallelLayout(tp=2, pp=1, dp=1, mbs=2, gas=1, recompute="full")
    assert elementwise_bytes(SMALL, again, settings) == pytest.approx(
        tokens * (3 * 22 * h + (8 + 6) * f / 2)
    )
    split = ParallelLayout(tp=2, pp=1, dp=1, mbs=2, gas=1, sequence_parallel=True)
    assert elementwise_bytes(SMALL, split, settings) == pytest.approx(
        tokens * (2 * 22 * h / 2 + 10 * f / 2)
    )
    one_node = AllocationSpec(**{**DGX.__dict__, "nodes": 1})
    profile = MachineProfile("m", None, 8, "bf16", 312e12, memory_bandwidth_bytes_per_s=1e12)
    plain = stage_compute_s(SMALL, layout, one_node, settings)[0]
    profiled = stage_compute_s(
        SMALL, layout, one_node, EstimateSettings(dropout=True, machine=profile)
    )[0]
    assert profiled - plain == pytest.approx(4 * expected / 1e12)  # 4 layers, 1 TB/s


def test_a_device_profiles_attention_kernel_times_the_attention_flops():
    from parsearch.estimate.flops import flops_breakdown
    from parsearch.estimate.machine import MachineProfile

    layout = ParallelLayout(tp=2, pp=1, dp=1, mbs=2, gas=1)
    one_node = AllocationSpec(**{**DGX.__dict__, "nodes": 1})
    profile = MachineProfile("m", None, 8, "bf16", 312e12, attention_flops=100e12)
    plain = EstimateSettings(machine=MachineProfile("m", None, 8, "bf16", 312e12))
    fused = EstimateSettings(machine=profile)
    attention = flops_breakdown(SMALL, 2)["attention"] / 2  # per TP rank, 4 layers
    plain_s = stage_compute_s(SMALL, layout, one_node, plain)[0]
    fused_s = stage_compute_s(SMALL, layout, one_node, fused)[0]
    # Only the attention term changes: its FLOPs at 100 TFLOP/s instead of the curve's.
    from parsearch.estimate.timing import _curve

    curve = _curve(2 * 16 / 2 * 1024**2, plain)
    assert fused_s - plain_s == pytest.approx(attention / 100e12 - attention / (312e12 * curve))
    # Unfused attention (flash off) is not what the kernel measured: the curve stays.
    off = EstimateSettings(machine=profile, flash_attention=False)
    assert stage_compute_s(SMALL, layout, one_node, off)[0] == pytest.approx(
        stage_compute_s(SMALL, layout, one_node, replace_machine(off, plain))[0]
    )


def replace_machine(settings, other):
    import dataclasses

    return dataclasses.replace(settings, machine=other.machine)
