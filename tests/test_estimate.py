"""The analytic estimate against published numbers (Narayanan et al. 2021, Korthikanti et
al. 2022, Megatron's 18 bytes per parameter)."""

import pytest

from parsearch.config import AllocationSpec, ModelSpec, ParallelLayout
from parsearch.estimate import (
    EstimateSettings,
    activation_bytes_per_layer,
    flops_breakdown,
    flops_per_step,
    memory_by_stage,
    memory_per_rank,
    param_count,
    predict,
)

GPT3 = ModelSpec(num_layers=96, hidden_size=12288, num_heads=96, vocab_size=51200, seq_length=2048)
GPT_1T = ModelSpec(
    num_layers=128, hidden_size=25600, num_heads=160, vocab_size=51200, seq_length=2048
)
FRONTIER = AllocationSpec(
    nodes=128,
    devices_per_node=8,
    device_memory_bytes=64 * 2**30,
    peak_flops_per_device=191.5e12,
    intra_node_bandwidth_bytes_per_s=100e9,
    inter_node_bandwidth_bytes_per_s=12.5e9,
)


def test_gpt3_has_175_billion_parameters():
    assert param_count(GPT3) == pytest.approx(175e9, rel=0.01)
    assert param_count(GPT_1T) == pytest.approx(1.008e12, rel=0.01)


def test_parameter_count_matches_narayanan_formula():
    L, h, V, s = 96, 12288, 51200, 2048
    formula = 12 * L * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * L * h))
    # We also count the final LayerNorm (2h), which the formula leaves out.
    assert param_count(GPT3) - 2 * h == pytest.approx(formula, rel=1e-9)


@pytest.mark.parametrize("batch", [1, 512, 1536])
def test_flops_match_narayanan_with_and_without_recompute(batch):
    L, h, V, s = 96, 12288, 51200, 2048
    plain = 72 * batch * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))
    full = 96 * batch * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    assert flops_per_step(GPT3, batch) == pytest.approx(plain, rel=1e-12)
    assert flops_per_step(GPT3, batch, "full") == pytest.approx(full, rel=1e-12)
    parts = flops_breakdown(GPT3, batch)
    assert parts["attention"] == pytest.approx(12 * batch * s * s * h * L)
    assert parts["matmul"] + parts["attention"] + parts["logits"] == parts["total"]


def test_megatron_18_bytes_per_parameter_without_distributed_optimizer():
    layout = ParallelLayout(tp=1, pp=1, dp=8, mbs=1, gas=1)
    memory = memory_per_rank(GPT3, layout, EstimateSettings(precision="bf16"))
    states = memory.weights + memory.grads + memory.optimizer
    assert states == pytest.approx(18 * param_count(GPT3), rel=1e-6)


def test_distributed_optimizer_is_6_plus_12_over_dp():
    layout = ParallelLayout(tp=1, pp=1, dp=8, mbs=1, gas=1, zero_stage=1)
    memory = memory_per_rank(GPT3, layout, EstimateSettings(precision="bf16"))
    states = memory.weights + memory.grads + memory.optimizer
    assert states == pytest.approx((6 + 12 / 8) * param_count(GPT3), rel=1e-6)
    zero3 = memory_per_rank(GPT3, ParallelLayout(1, 1, 8, 1, 1, zero_stage=3))
    assert zero3.weights + zero3.grads + zero3.optimizer == pytest.approx(
        18 / 8 * param_count(GPT3), rel=1e-6
    )


@pytest.mark.parametrize(
    ("tp", "sequence_parallel", "coefficient"),
    [
        (1, False, lambda t, r: 34 + 5 * r),
        (8, False, lambda t, r: 10 + 24 / t + 5 * r / t),
        (8, True, lambda t, r: 34 / t + 5 * r / t),
    ],
)
def test_activation_formula_of_korthikanti(tp, sequence_parallel, coefficient):
    """Table 2 of Korthikanti et al. 2022: 16-bit, with dropout, no flash attention."""
    settings = EstimateSettings(precision="bf16", dropout=True, flash_attention=False)
    layout = ParallelLayout(tp, 1, 1, 2, 1, sequence_parallel=sequence_parallel)
    s, b, h, a = 2048, 2, 12288, 96
    expected = s * b * h * coefficient(tp, a * s / h)
    assert activation_bytes_per_layer(GPT3, layout, settings) == pytest.approx(expected)


def test_full_recompute_keeps_only_layer_inputs():
    settings = EstimateSettings(precision="bf16")
    layout = ParallelLayout(1, 1, 1, 1, 1, recompute="full")
    assert activation_bytes_per_layer(GPT3, layout, settings) == 2 * 2048 * 12288


def test_flash_attention_removes_the_quadratic_term():
    layout = ParallelLayout(1, 1, 1, 1, 1)
    flash = activation_bytes_per_layer(GPT3, layout, EstimateSettings(dropout=True))
    plain = activation_bytes_per_layer(
        GPT3, layout, EstimateSettings(dropout=True, flash_attention=False)
    )
    assert plain - flash == pytest.approx(5 * 96 * 2048 * 2048)


def test_one_f_one_b_first_stage_holds_pp_microbatches():
    layout = ParallelLayout(tp=8, pp=4, dp=1, mbs=1, gas=16)
    stages = memory_by_stage(GPT3, layout, EstimateSettings())
    per_layer = activation_bytes_per_layer(GPT3, layout, EstimateSettings())
    assert stages[1].activations == pytest.approx(3 * 24 * per_layer)
    gpipe = memory_by_stage(GPT3, layout, EstimateSettings(), schedule="gpipe")
    assert gpipe[1].activations == pytest.approx(16 * 24 * per_layer)


def test_prediction_is_consistent_and_ranks_sensibly():
    layout = ParallelLayout(tp=8, pp=16, dp=8, mbs=1, gas=64, zero_stage=1)
    prediction = predict(GPT3, layout, FRONTIER, EstimateSettings())
    tokens = layout.global_batch * 2048
    assert prediction.tokens_per_s * prediction.step_time_s == pytest.approx(tokens)
    assert prediction.mfu == pytest.approx(prediction.tflops_per_device * 1e12 / 191.5e12)
    assert 0.1 < prediction.mfu < 0.6
    # More micro-batches amortise the pipeline bubble; TP across nodes is slower.
    more = predict(GPT3, ParallelLayout(8, 16, 8, 1, 128, zero_stage=1), FRONTIER)
    assert more.tokens_per_s > prediction.tokens_per_s
    cross_node = predict(GPT3, ParallelLayout(16, 8, 8, 1, 64, zero_stage=1), FRONTIER)
    # Twice the layers per stage, each all-reduce ~1.6x dearer (hierarchical across 2 nodes).
    assert cross_node.tp_comm_s > 3 * prediction.tp_comm_s
    assert not predict(GPT3, ParallelLayout(1, 1, 1024, 1, 1), FRONTIER).fits
