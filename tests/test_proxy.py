"""Proxy trials' full-scale correction against figures computed by hand from the formulas
(ring all-reduce volume, Megatron's bytes per parameter), not from the estimate's code."""

import math
from dataclasses import replace

import pytest

from parsearch.config import AllocationSpec, ModelSpec, ParallelLayout
from parsearch.estimate import EstimateSettings, memory_per_rank
from parsearch.estimate.machine import CollectiveFit, MachineProfile
from parsearch.estimate.proxy import (
    PRIOR_SPREAD,
    ProxyPlan,
    choose_proxy,
    fidelity_record,
    full_scale_figures,
    learned_correction,
    learned_spread,
    proxy_delta,
    proxy_dps,
    proxy_oom_is_full_scale,
)

H, L, V, S, F = 1024, 4, 1000, 512, 4096
MODEL = ModelSpec(
    num_layers=L, hidden_size=H, num_heads=16, vocab_size=V, seq_length=S, arch="llama"
)
# Llama, no GQA: q, k, v, o (4h²) + SwiGLU (3hf) + two RMSNorms; untied embedding and output.
STAGE_PARAMS = L * (4 * H * H + 3 * H * F + 2 * H) + V * H + (V * H + H)
# What the DP all-reduce carries per rank: the layers plus the larger of embedding and head.
REDUCED_PARAMS = L * (4 * H * H + 3 * H * F + 2 * H) + (V * H + H)
INTRA, INTER = 100e9, 25e9
ALLOCATION = AllocationSpec(
    nodes=2,
    devices_per_node=4,
    device_memory_bytes=10**12,
    peak_flops_per_device=1e12,
    intra_node_bandwidth_bytes_per_s=INTRA,
    inter_node_bandwidth_bytes_per_s=INTER,
)
# Nothing hidden, no latency: the exposed reduction is the ring's volume over the bandwidth.
PLAIN = EstimateSettings(dp_overlap=0.0, collective_latency_s=0.0)
FULL = ParallelLayout(tp=1, pp=1, dp=8, mbs=2, gas=4, zero_stage=1)


def ring_allreduce_s(size_bytes: float, group: int, bandwidth: float) -> float:
    return 2 * (group - 1) / group * size_bytes / bandwidth


def test_proxy_sizes_are_the_divisors_of_dp_below_it():
    assert proxy_dps(replace(FULL, zero_stage=0)) == [1, 2, 4]
    assert proxy_dps(FULL) == [2, 4]  # ZeRO needs dp >= 2
    assert proxy_dps(ParallelLayout(tp=1, pp=1, dp=1, mbs=1, gas=1)) == []


def hierarchical_allreduce_s(size_bytes: float) -> float:
    """dp=8 over two nodes of four: reduce-scatter and all-gather among a node's 4 ranks,
    4 concurrent all-reduces of size/4 across the 2 nodes."""
    inside = 2 * (3 / 4) * size_bytes / INTRA
    return inside + ring_allreduce_s(size_bytes / 4, 2, INTER)


def optimizer_s(dp: int) -> float:
    """The step's optimizer work under ZeRO-1 at the default 2 TB/s: Adam and the 16-bit
    copy on the shard (34 B a parameter), the gradient norm and zeroing on the stage (8 B)."""
    return (REDUCED_PARAMS / dp * 34 + REDUCED_PARAMS * 8) / 2e12


def test_throughput_swaps_the_dp_reduction_and_scales_the_batch():
    # dp'=2 fits in one node (intra-node ring); dp=8 spans two (hierarchical).
    plan = ProxyPlan(FULL, dp=2, nodes=1)
    grads = REDUCED_PARAMS * 4  # fp32 main gradients
    full_comm = hierarchical_allreduce_s(grads) + optimizer_s(8)
    proxy_comm = ring_allreduce_s(grads, 2, INTRA) + optimizer_s(2)
    assert proxy_delta(MODEL, plan, ALLOCATION, PLAIN).dp_comm_s == pytest.approx(
        full_comm - proxy_comm
    )
    measured = {
        "step_time_s": 2.0,
        "tokens_per_s": 2 * 2 * 4 * S / 2.0,
        "tflops_per_device": 100.0,
        "peak_mem_bytes": 40e9,
    }
    figures = full_scale_figures(MODEL, plan, measured, ALLOCATION, PLAIN)
    step = 2.0 + full_comm - proxy_comm
    assert figures["step_time_s"] == pytest.approx(step)
    assert figures["tokens_per_s"] == pytest.approx(8 * 2 * 4 * S / step)
    assert figures["tflops_per_device"] == pytest.approx(100.0 * 2.0 / step)
    assert figures["mfu"] == pytest.approx(100e12 * 2.0 / step / 1e12)
    # ZeRO-1: Adam's 12 bytes per parameter shard over dp, so full scale holds less.
    assert figures["peak_mem_bytes"] == pytest.approx(40e9 + STAGE_PARAMS * 12 * (1 / 8 - 1 / 2))


def test_throughput_without_a_step_time_and_with_a_learned_correction():
    plan = ProxyPlan(FULL, dp=2, nodes=1)
    delta = proxy_delta(MODEL, plan, ALLOCATION, PLAIN).dp_comm_s
    figures = full_scale_figures(
        MODEL, plan, {"tokens_per_s": 2 * 2 * 4 * S / 2.0}, ALLOCATION, PLAIN, correction=0.9
    )
    assert figures["tokens_per_s"] == pytest.approx(0.9 * 8 * 2 * 4 * S / (2.0 + delta))
    assert "peak_mem_bytes" not in figures


def test_a_profile_fit_prices_the_full_scale_reduction():
    fit = CollectiveFit("dp-across-nodes", "all-reduce", 8, alpha_s=1e-3, beta_s_per_byte=2e-11)
    profile = MachineProfile("m", 2, 4, "bf16", 1e12, collectives=(fit,))
    settings = EstimateSettings(dp_overlap=0.0, collective_latency_s=0.0, machine=profile)
    grads = REDUCED_PARAMS * 4
    # Across the nodes, 4 all-reduces of grads/4 over 2 nodes on the probed fit, rescaled from
    # its group of 8 (latency by ring steps, 2/14; bytes by ring volume, 1/1.75); inside each
    # node the data sheet. The proxy stays inside a node, which the profile did not probe.
    across = 1e-3 * 2 / 14 + grads / 4 * 2e-11 / 1.75
    full = 2 * (3 / 4) * grads / INTRA + across + optimizer_s(8)
    expected = full - ring_allreduce_s(grads, 2, INTRA) - optimizer_s(2)
    plan = ProxyPlan(FULL, dp=2, nodes=1)
    assert proxy_delta(MODEL, plan, ALLOCATION, settings).dp_comm_s == pytest.approx(expected)


@pytest.mark.parametrize(
    ("zero_stage", "sharded_bytes"),
    [(0, 0), (1, 12), (2, 12 + 4), (3, 12 + 4 + 2)],
)
def test_memory_moves_only_by_the_sharded_states(zero_stage, sharded_bytes):
    layout = ParallelLayout(tp=1, pp=1, dp=8, mbs=2, gas=4, zero_stage=zero_stage)
    plan = ProxyPlan(layout, dp=4, nodes=1)
    delta = proxy_delta(MODEL, plan, ALLOCATION, PLAIN).memory_bytes
    assert delta == pytest.approx(STAGE_PARAMS * sharded_bytes * (1 / 8 - 1 / 4))


def test_the_smallest_proxy_that_fits_is_chosen():
    two, four = (
        memory_per_rank(MODEL, ParallelLayout(1, 1, dp, 2, 4, zero_stage=1), PLAIN).total
        for dp in (2, 4)
    )
    assert two > four  # the smaller proxy holds more optimizer state per rank
    tight = replace(ALLOCATION, device_memory_bytes=int((two + four) / 2))
    assert choose_proxy(MODEL, FULL, tight, PLAIN) == ProxyPlan(FULL, dp=4, nodes=1)
    assert choose_proxy(MODEL, FULL, ALLOCATION, PLAIN) == ProxyPlan(FULL, dp=2, nodes=1)
    plain = replace(FULL, zero_stage=0)
    assert choose_proxy(MODEL, plain, ALLOCATION, PLAIN) == ProxyPlan(plain, dp=1, nodes=1)
    assert choose_proxy(MODEL, FULL, ALLOCATION, PLAIN, min_dp=3) == ProxyPlan(FULL, 4, 1)
    assert choose_proxy(MODEL, FULL, ALLOCATION, PLAIN, min_dp=5) is None  # no divisor left
    assert choose_proxy(MODEL, FULL, replace(ALLOCATION, device_memory_bytes=1), PLAIN) is None
    # No proxy saves a node when the full layout fits in one: measure at full scale.
    small = ParallelLayout(tp=1, pp=1, dp=4, mbs=2, gas=4, zero_stage=1)
    assert choose_proxy(MODEL, small, ALLOCATION, PLAIN) is None


def test_a_proxy_oom_condemns_full_scale_only_without_sharded_states():
    for zero_stage, condemned in ((0, True), (1, False), (3, False)):
        layout = ParallelLayout(tp=1, pp=1, dp=8, mbs=2, gas=4, zero_stage=zero_stage)
        plan = ProxyPlan(layout, dp=2, nodes=1)
        assert proxy_oom_is_full_scale(MODEL, plan, ALLOCATION, PLAIN) is condemned


def test_fidelity_record_and_learned_correction():
    plan = ProxyPlan(FULL, dp=2, nodes=1)
    record = fidelity_record(plan, {"tokens_per_s": 5.0})
    assert record == {"kind": "proxy", "dp": 2, "nodes": 1, "measured": {"tokens_per_s": 5.0}}
    assert learned_correction([]) == 1.0
    assert learned_correction([(100.0, 90.0), (100.0, 90.0)]) == pytest.approx(0.9)
    # Geometric mean: 0.5 and 2 cancel.
    assert learned_correction([(10.0, 5.0), (10.0, 20.0), (1.0, 0.0)]) == pytest.approx(1.0)


def test_learned_spread_pools_the_confirmations_with_a_prior():
    assert learned_spread([]) == PRIOR_SPREAD
    assert learned_spread([(100.0, 90.0)]) == pytest.approx(PRIOR_SPREAD)  # one pair: no spread
    # 0.5 and 2 about their mean 1: log 2 each; with the prior, sqrt((p^2 + 2 log^2 2) / 2).
    expected = math.sqrt((0.1**2 + 2 * math.log(2) ** 2) / 2)
    assert learned_spread([(10.0, 5.0), (10.0, 20.0)], prior=0.1) == pytest.approx(expected)
    assert learned_spread([(10.0, 9.0)] * 50) == pytest.approx(PRIOR_SPREAD / math.sqrt(50))
