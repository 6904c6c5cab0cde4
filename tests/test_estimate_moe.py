"""Mixtures of experts in the analytic estimate (issue 49, item 3): parameters and active
FLOPs of published models, expert memory sharded by ep·etp and over the expert data-parallel
group, the all-to-all on the links the EP group spans, and the load imbalance in the band."""

from __future__ import annotations

from dataclasses import replace

import pytest

from parsearch.commands.plan import plan_rows
from parsearch.config import AllocationSpec, ModelSpec, MoESpec, ParallelLayout
from parsearch.estimate import EstimateSettings, memory_per_rank, predict
from parsearch.estimate.band import predict_band
from parsearch.estimate.flops import active_param_count, flops_per_step, param_count
from parsearch.estimate.memory import expert_shard_group, moe_dispatch_bytes, stage_layers
from parsearch.estimate.profile import with_machine
from parsearch.estimate.proxy import proxy_dps
from parsearch.estimate.timing import all_to_all_s, expert_gemm_efficiency, moe_comm_layer_s
from parsearch.profiles import load_profile, shipped
from parsearch.space import load_space

# Mixtral-8x7B (Mistral AI's config.json): 46.7B parameters, 12.9B active per token
# (https://mistral.ai/news/mixtral-of-experts).
MIXTRAL = ModelSpec(
    name="mixtral-8x7b",
    num_layers=32,
    hidden_size=4096,
    num_heads=32,
    num_kv_heads=8,
    ffn_hidden_size=14336,
    vocab_size=32000,
    seq_length=4096,
    arch="llama",
    moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=14336),
)
# DeepSeek-V3's shape (its config.json): 671B parameters, 37B active (DeepSeek-V3 technical
# report, arXiv:2412.19437, section 1), the multi-token-prediction module left out. Its
# multi-head latent attention is stood in for by plain attention of the same width
# (4·h² = 206M a layer against MLA's ~187M), which the tolerance below covers.
DEEPSEEK_V3 = ModelSpec(
    name="deepseek-v3",
    num_layers=61,
    hidden_size=7168,
    num_heads=128,
    ffn_hidden_size=18432,
    vocab_size=129280,
    seq_length=4096,
    arch="llama",
    moe=MoESpec(
        num_experts=256,
        top_k=8,
        expert_ffn_hidden_size=2048,
        shared_expert_ffn_hidden_size=2048,
        first_dense_layers=3,
    ),
)
H100_16 = AllocationSpec(
    nodes=16,
    devices_per_node=8,
    device_memory_bytes=80 * 2**30,
    peak_flops_per_device=989e12,
    intra_node_bandwidth_bytes_per_s=450e9,
    inter_node_bandwidth_bytes_per_s=50e9,
)


@pytest.mark.parametrize(
    ("model", "total", "active", "tolerance"),
    [(MIXTRAL, 46.7e9, 12.9e9, 0.01), (DEEPSEEK_V3, 671e9, 37e9, 0.05)],
)
def test_parameters_count_every_expert_and_active_ones_only_top_k(
    model, total, active, tolerance
) -> None:
    assert param_count(model) == pytest.approx(total, rel=tolerance)
    assert active_param_count(model) == pytest.approx(active, rel=tolerance)


def test_flops_are_megatrons_moe_formula() -> None:
    """Megatron-LM's ``num_floating_point_operations`` for an MoE layer: 6·B·s·h times
    (3·f_e·k + 3·f_s) for the experts, plus the attention and the logits as for a dense
    model; the router's ``2·h·E`` per token is ours on top."""
    model, batch = MIXTRAL, 8
    dense = replace(model, moe=None)
    tokens = batch * model.seq_length
    h, moe = model.hidden_size, model.moe
    dense_mlp = 6 * tokens * 3 * h * model.ffn * model.num_layers
    experts = 6 * tokens * h * 3 * moe.expert_ffn_hidden_size * moe.top_k * model.num_layers
    router = 6 * tokens * h * moe.num_experts * model.num_layers
    expected = flops_per_step(dense, batch) - dense_mlp + experts + router
    assert flops_per_step(model, batch) == pytest.approx(expected, rel=1e-12)


def test_first_dense_layers_fall_on_the_first_stage() -> None:
    layers = stage_layers(DEEPSEEK_V3, ParallelLayout(tp=1, pp=1, dp=1, mbs=1, gas=1))
    assert layers == [(3, 58)]
    layers = stage_layers(replace(DEEPSEEK_V3, num_layers=64), ParallelLayout(1, 4, 1, 1, 1))
    assert layers == [(3, 13), (0, 16), (0, 16), (0, 16)], layers


def test_expert_memory_falls_with_ep_and_shards_over_edp() -> None:
    settings = EstimateSettings()
    base = ParallelLayout(tp=1, pp=1, dp=16, mbs=1, gas=1, zero_stage=1)
    by_ep = {ep: memory_per_rank(MIXTRAL, replace(base, ep=ep), settings) for ep in (1, 2, 8)}
    weights = {ep: m.expert_weights for ep, m in by_ep.items()}
    assert weights[1] == pytest.approx(2 * weights[2]) == pytest.approx(8 * weights[8]), weights
    # The dense part does not depend on ep; weights count the experts' too.
    assert len({m.breakdown()["dense"] for m in by_ep.values()}) == 1
    assert by_ep[1].weights > by_ep[1].expert_weights > 0
    # The distributed optimizer shards the experts' states over edp = dp/ep ranks.
    for ep, estimate in by_ep.items():
        edp = expert_shard_group(replace(base, ep=ep))
        assert edp == 16 // ep
        experts = estimate.expert_weights / 2  # bf16 weights: 2 bytes a parameter
        assert estimate.expert_optimizer == pytest.approx(experts * 12 / edp), ep
    assert by_ep[8].total < by_ep[2].total < by_ep[1].total
    breakdown = by_ep[8].breakdown()
    assert set(breakdown) == {"dense", "experts", "optimizer", "activations", "buffers", "overhead"}
    assert sum(breakdown.values()) == pytest.approx(by_ep[8].total)
    assert breakdown["buffers"] >= by_ep[8].dispatch > 0


def test_capacity_factor_pads_the_dispatch_buffers() -> None:
    layout = ParallelLayout(tp=1, pp=1, dp=8, mbs=1, gas=1, ep=8)
    settings = EstimateSettings()
    dropless = moe_dispatch_bytes(MIXTRAL, layout, settings)
    padded = replace(MIXTRAL, moe=replace(MIXTRAL.moe, capacity_factor=1.25))
    assert moe_dispatch_bytes(padded, layout, settings) == pytest.approx(1.25 * dropless)
    # top_k copies of each token, dispatched and combined, 2 bytes an element.
    assert dropless == pytest.approx(2 * 2 * 2 * MIXTRAL.seq_length * MIXTRAL.hidden_size)


def test_all_to_all_inside_a_node_is_cheaper_than_across() -> None:
    """An EP group is ep ranks etp apart (Megatron's expert rank order etp-ep-edp-pp): ep 8
    with etp 1 fills one 8-GPU node; with etp 2 it spans two nodes and goes on the network."""
    settings = EstimateSettings()
    size = 64e6
    inside = ParallelLayout(tp=2, pp=1, dp=64, mbs=1, gas=1, ep=8, etp=1)
    across = replace(inside, etp=2)
    t_inside = all_to_all_s(size, inside, H100_16, settings)
    t_across = all_to_all_s(size, across, H100_16, settings)
    expected_inside = 7 / 8 * size / 450e9 + 7 * settings.collective_latency_s
    assert t_inside == pytest.approx(expected_inside)
    # Across: each node holds 4 of the group's ranks; 4/7 of the peers' share crosses.
    expected_across = 7 / 8 * size * 4 / 7 / 50e9 + 7 * settings.collective_latency_s
    assert t_across == pytest.approx(expected_across)
    assert t_across > 2 * t_inside
    assert all_to_all_s(size, replace(inside, ep=1), H100_16, settings) == 0.0


def test_moe_traffic_and_small_expert_gemms_show_in_the_prediction() -> None:
    settings = EstimateSettings()
    layout = ParallelLayout(tp=1, pp=1, dp=128, mbs=1, gas=8, ep=8)
    prediction = predict(MIXTRAL, layout, H100_16, settings)
    assert prediction.moe_comm_s == pytest.approx(
        layout.gas * MIXTRAL.num_layers * moe_comm_layer_s(MIXTRAL, layout, H100_16, settings)
    )
    assert prediction.moe_comm_s > 0
    assert predict(MIXTRAL, replace(layout, ep=1), H100_16, settings).moe_comm_s == 0.0
    # Many small experts (DeepSeek's 256 of width 2048) run their GEMMs below Mixtral's.
    few = ParallelLayout(tp=1, pp=1, dp=8, mbs=1, gas=1, ep=8)
    assert expert_gemm_efficiency(DEEPSEEK_V3, few, settings) < expert_gemm_efficiency(
        MIXTRAL, few, settings
    )


def test_imbalance_slows_the_step_and_the_band_spans_it() -> None:
    layout = ParallelLayout(tp=1, pp=1, dp=128, mbs=1, gas=8, ep=8)
    even = predict(MIXTRAL, layout, H100_16, EstimateSettings())
    skewed = predict(MIXTRAL, layout, H100_16, EstimateSettings(moe_imbalance=1.5))
    assert skewed.step_time_s > even.step_time_s
    # The bytes scale by 1.5, the collectives' latencies do not.
    assert even.moe_comm_s < skewed.moe_comm_s < 1.5 * even.moe_comm_s
    settings = with_machine(EstimateSettings(), load_profile(shipped()["h100-sxm-dgx"]), H100_16)
    only_imbalance = replace(
        settings,
        machine=replace(
            settings.machine,
            uncertainty=tuple(
                item for item in settings.machine.uncertainty if item.figure == "moe_imbalance"
            ),
        ),
    )
    band = predict_band(MIXTRAL, layout, H100_16, only_imbalance)
    nominal = predict(MIXTRAL, layout, H100_16, only_imbalance)
    assert band.tokens_per_s_high == pytest.approx(nominal.tokens_per_s)
    assert band.tokens_per_s_low < 0.99 * nominal.tokens_per_s, (band, nominal.tokens_per_s)
    # A dense model's band does not move with it.
    dense = replace(MIXTRAL, moe=None)
    dense_layout = replace(layout, ep=1)
    dense_band = predict_band(dense, dense_layout, H100_16, only_imbalance)
    assert dense_band.tokens_per_s_low == pytest.approx(dense_band.tokens_per_s_high)


def test_plan_rows_carry_the_memory_breakdown(tmp_path) -> None:
    space_file = tmp_path / "moe.yaml"
    space_file.write_text(
        """
name: moe-rows
model: {name: small-moe, arch: llama, num_layers: 4, hidden_size: 1024, num_heads: 8,
        vocab_size: 32000, seq_length: 2048,
        moe: {num_experts: 8, top_k: 2, expert_ffn_hidden_size: 1024}}
allocation: {name: one-node, nodes: 1, devices_per_node: 8, device_memory: 80GiB,
             peak_tflops: 989}
search: {tp: [1, 2], pp: [1], ep: [1, 2, 8], mbs: [1], gas: [1, 4]}
objective: tokens_per_s
trainer: {kind: builtin}
"""
    )
    rows = plan_rows(load_space(space_file).plan(), top=50)
    assert rows and {row["ep"] for row in rows} == {1, 2, 8}, rows
    for row in rows:
        parts = {key: value for key, value in row.items() if key.startswith("mem_")}
        assert set(parts) == {
            f"mem_{part}_bytes"
            for part in ("dense", "experts", "optimizer", "activations", "buffers", "overhead")
        }
        assert sum(parts.values()) == pytest.approx(row["peak_mem_bytes"]), row
        assert parts["mem_experts_bytes"] > 0 and parts["mem_buffers_bytes"] > 0, row


def test_moe_layers_keep_only_the_attentions_tp_all_reduces() -> None:
    layout = ParallelLayout(tp=2, pp=1, dp=64, mbs=1, gas=4, ep=8, sequence_parallel=True)
    moe = predict(MIXTRAL, layout, H100_16, EstimateSettings())
    dense = predict(replace(MIXTRAL, moe=None), replace(layout, ep=1), H100_16, EstimateSettings())
    assert moe.tp_comm_s == pytest.approx(dense.tp_comm_s / 2), (moe.tp_comm_s, dense.tp_comm_s)


def test_a_proxy_keeps_whole_expert_parallel_groups() -> None:
    layout = ParallelLayout(tp=1, pp=1, dp=32, mbs=1, gas=1, ep=8, zero_stage=1)
    assert proxy_dps(layout) == [8, 16]
    assert proxy_dps(replace(layout, tp=2, ep=4)) == [2, 4, 8, 16]
