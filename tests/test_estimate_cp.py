"""Context parallelism in the analytic estimate (issue 47, item 3): memory per rank, the
gradient group, and the ring attention's K/V exchange and what of it the attention hides."""

from __future__ import annotations

from dataclasses import replace

import pytest

from parsearch.config import AllocationSpec, ModelSpec, ParallelLayout
from parsearch.estimate import EstimateSettings, memory_per_rank, predict
from parsearch.estimate.memory import activation_bytes_per_layer
from parsearch.estimate.timing import (
    attention_layer_s,
    cp_ring_exposed_s,
    cp_ring_links,
    cp_ring_step_s,
    dp_collective_s,
)

# Llama-3-8B's shape (grouped-query attention: 8 K/V heads of 32) at 32k tokens.
MODEL = ModelSpec(
    name="llama3-8b",
    num_layers=32,
    hidden_size=4096,
    num_heads=32,
    num_kv_heads=8,
    ffn_hidden_size=14336,
    vocab_size=128256,
    seq_length=32768,
    arch="llama",
)
ALLOCATION = AllocationSpec(
    nodes=4,
    devices_per_node=8,
    device_memory_bytes=80 * 10**9,
    peak_flops_per_device=989e12,
    intra_node_bandwidth_bytes_per_s=450e9,
    inter_node_bandwidth_bytes_per_s=50e9,
)


def shape(cp: int, tp: int = 1, dp: int = 1, **extra) -> ParallelLayout:
    return ParallelLayout(tp=tp, pp=1, dp=dp, mbs=1, gas=4, cp=cp, **extra)


@pytest.mark.parametrize("framework", ["megatron", "torch"])
def test_activations_divide_by_cp_and_weights_do_not(framework):
    settings = EstimateSettings(framework=framework)
    one = memory_per_rank(MODEL, shape(1), settings)
    for cp in (2, 4, 8):
        split = memory_per_rank(MODEL, shape(cp), settings)
        assert split.activations == pytest.approx(one.activations / cp), (cp, split, one)
        assert split.weights == one.weights, (cp, split.weights, one.weights)
        assert split.total < one.total
    per_layer = activation_bytes_per_layer(MODEL, shape(4, tp=2), settings)
    assert per_layer == pytest.approx(
        activation_bytes_per_layer(MODEL, shape(1, tp=2), settings) / 4
    )


@pytest.mark.parametrize("framework", ["megatron", "torch"])
def test_gradients_and_optimizer_shard_over_dp_times_cp(framework):
    settings = EstimateSettings(framework=framework)
    # ZeRO-1: the optimizer state of dp2 x cp2 is that of dp4 (4 ranks hold the same weights).
    split = memory_per_rank(MODEL, shape(2, dp=2, zero_stage=1), settings)
    replicas = memory_per_rank(MODEL, shape(1, dp=4, zero_stage=1), settings)
    assert split.optimizer == pytest.approx(replicas.optimizer), (split, replicas)
    # ZeRO-3 / FSDP with dp 1: the weights still shard over the cp ranks.
    fsdp = memory_per_rank(MODEL, shape(8, zero_stage=3), settings)
    whole = memory_per_rank(MODEL, shape(8), settings)
    assert fsdp.optimizer == pytest.approx(whole.optimizer / 8), (fsdp, whole)
    # The gradient collective runs over the dp*cp group: nothing to reduce only at dp*cp 1.
    size = 1e9
    assert dp_collective_s("all-reduce", size, shape(1), ALLOCATION, settings) == 0.0
    over_cp = dp_collective_s("all-reduce", size, shape(2, dp=2), ALLOCATION, settings)
    over_dp = dp_collective_s("all-reduce", size, shape(1, dp=4), ALLOCATION, settings)
    assert over_cp == pytest.approx(over_dp) and over_cp > 0


def test_cp_1_has_no_ring_and_predicts_as_before():
    prediction = predict(MODEL, shape(1, dp=8), ALLOCATION)
    assert prediction.cp_comm_s == 0.0
    assert cp_ring_exposed_s(MODEL, shape(1), ALLOCATION, EstimateSettings()) == 0.0


def test_a_cp_group_inside_a_node_rides_nvlink_and_one_spanning_nodes_the_network():
    settings = EstimateSettings()
    inside, across = shape(4, tp=2), shape(4, tp=4)  # tp*cp = 8 (one node) and 16 (two)
    assert cp_ring_links(inside, ALLOCATION) == ("dp-intra-node", 450e9)
    assert cp_ring_links(across, ALLOCATION) == ("dp-across-nodes", 50e9)
    # One step moves the rank's K and V: 2 * (s/cp) * kv_width / tp elements of 2 bytes.
    kv_width = 8 * 128
    for layout, bandwidth in ((inside, 450e9), (across, 50e9)):
        chunk = 2 * 2 * (32768 / 4) * kv_width / layout.tp
        expected = chunk / bandwidth + settings.collective_latency_s
        step = cp_ring_step_s(MODEL, layout, ALLOCATION, settings)
        assert step == pytest.approx(expected), (layout.short(), step, expected)


def test_the_ring_hides_behind_long_attention_and_shows_when_it_cannot():
    settings = EstimateSettings()
    layout = shape(8)  # eight ranks of one node
    # 32k tokens on NVLink: each step's block of attention outlasts its transfer.
    assert cp_ring_exposed_s(MODEL, layout, ALLOCATION, settings) == 0.0
    # Short sequences over a slow link: the transfer outlasts the block.
    short = replace(MODEL, seq_length=2048)
    slow = replace(ALLOCATION, intra_node_bandwidth_bytes_per_s=5e9)
    exposed = cp_ring_exposed_s(short, layout, slow, settings)
    block = attention_layer_s(short, layout, slow, settings) / 3 / 8
    transfer = cp_ring_step_s(short, layout, slow, settings)
    # Forward exposes (cp-1) steps' excess, backward twice that (no recompute: 3 passes).
    assert exposed == pytest.approx(3 * 7 * (transfer - block)), (exposed, transfer, block)
    prediction = predict(short, layout, slow, settings)
    assert prediction.cp_comm_s == pytest.approx(layout.gas * 32 * exposed)
    assert prediction.step_time_s > predict(short, layout, ALLOCATION, settings).step_time_s


def test_each_rank_computes_its_share_of_the_sequence():
    settings = EstimateSettings()
    one, eight = predict(MODEL, shape(1, dp=8), ALLOCATION), predict(MODEL, shape(8), ALLOCATION)
    # Same 8 GPUs: cp 8 runs each sequence on 8 ranks, dp 8 runs 8 sequences; per rank the
    # work per micro-batch is an eighth, on smaller GEMMs (never faster per FLOP).
    assert eight.compute_s < one.compute_s
    assert eight.compute_s * 8 >= one.compute_s * (1 - 1e-9), (eight.compute_s, one.compute_s)
    assert attention_layer_s(MODEL, shape(8), ALLOCATION, settings) < attention_layer_s(
        MODEL, shape(1), ALLOCATION, settings
    )


def test_the_published_cp_table_loads_and_each_row_gets_a_ratio(capsys):
    from estimate_fidelity import cp_published, report_cp

    runs = cp_published()
    with_cp = [run for run in runs if run.layout.cp > 1]
    assert len(with_cp) >= 8, [run.layout.short() for run in runs]
    summaries = report_cp(runs)
    printed = capsys.readouterr().out
    rows = [line for line in printed.splitlines() if line.startswith("| ") and "seq" not in line]
    assert len(rows) >= len(runs), printed
    for table, summary in summaries.items():
        assert 0 < summary["ratio_min"] <= summary["ratio_max"] < 10, (table, summary)
        assert summary["cp_pairs"] > 0 and 0 <= summary["cp_agree"] <= summary["cp_pairs"]
