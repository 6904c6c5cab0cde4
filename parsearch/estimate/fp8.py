"""What FP8 matmuls change in a layout's estimate (``precision: fp8``): the linear layers'
GEMMs at the device's FP8 rate, the casts the recipe adds, and the FP8 weight copies it
keeps. Everything else (attention, the logits, communication, the optimizer) is as before.

- Rate: the profile's dense FP8 peak (1979 TFLOP/s on H100/H200 SXM, NVIDIA's data sheets)
  at the same efficiency as the 16-bit GEMMs (no published figure says otherwise), so the
  GEMM time scales by ``peak / fp8_peak``. The output layer stays in 16 bits: Megatron's is
  not a Transformer Engine layer, and torchtitan's float8 converter filters ``output`` out.
- Casts: each GEMM operand is cast to FP8 with its scale, a memory-bound pass. Per element:
  read 2 bytes (bf16), write 1 (FP8) and 1 more for the transposed copy Hopper's FP8 GEMMs
  need for the backward (Transformer Engine, "Performance considerations: handling
  transposes"): 4 bytes where the amax is taken inside the cast (Transformer Engine's
  delayed scaling, Megatron); torchao's dynamic tensorwise scaling reads the tensor once
  more for its amax first: 6 bytes. Operands: every linear layer's input and weight in each
  forward pass (twice under full recompute) and its output gradient in the backward.
- Memory: the FP8 copy of every linear weight and its transpose, 2 bytes a parameter on the
  rank (Transformer Engine's FP8 weight caching; torchao keeps the same casts for the
  backward). Activations are counted as before: the 16-bit inputs a framework may save in
  FP8 instead make this an upper bound.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from parsearch.config import ModelSpec, ParallelLayout
from parsearch.estimate.flops import _FORWARD_PASSES, attention_matmul_params, layer_matmul_params

if TYPE_CHECKING:  # memory.py counts the weight copies with this module's help
    from parsearch.estimate.memory import EstimateSettings

# Bytes one cast streams per element, by framework (see the module's docstring).
CAST_BYTES = {"megatron": 4, "torch": 6}
# The FP8 weight and its transpose, per linear-layer parameter.
WEIGHT_COPY_BYTES = 2


def fp8_layer_s(
    matmul_s: float,
    model: ModelSpec,
    layout: ParallelLayout,
    settings: EstimateSettings,
    bandwidth: float,
) -> float:
    """One layer's linear-layer matmul time ``matmul_s`` (16-bit rate) as ``layout`` runs
    it: unchanged unless its precision is ``fp8``, else at the FP8 peak plus the casts."""
    machine = settings.machine
    if layout.precision != "fp8" or machine is None or not machine.fp8_peak_flops:
        return matmul_s
    scale = machine.peak_flops_per_device / machine.fp8_peak_flops
    return matmul_s * scale + cast_elements(model, layout) * CAST_BYTES[settings.framework] / (
        bandwidth
    )


def _linear_model(model: ModelSpec) -> ModelSpec:
    """``model`` with an MoE layer's FFN as the dense width a token passes: its ``top_k``
    routed experts and the shared ones (what the casts see per token)."""
    if model.moe is None:
        return model
    moe = model.moe
    width = moe.top_k * moe.expert_ffn_hidden_size + moe.shared_expert_ffn_hidden_size
    return replace(model, moe=None, ffn_hidden_size=width)


def cast_elements(model: ModelSpec, layout: ParallelLayout) -> float:
    """Elements one layer casts to FP8 on a rank per micro-batch: the linear layers'
    inputs and weights per forward pass, their output gradients once."""
    model = _linear_model(model)
    t, h = layout.tp, model.hidden_size
    tokens = layout.mbs * model.seq_length / layout.cp
    kv_width = model.kv_heads * model.head_dim
    ffn = model.ffn / t
    gates = 2 if model.arch == "llama" else 1
    # QKV and the MLP's first GEMM(s) read the layer's h-wide input; the projection and
    # the MLP's last read their TP shard.
    inputs = tokens * (h + h / t + h + ffn)
    weights = layer_matmul_params(model) / t
    grads = tokens * ((h + 2 * kv_width) / t + h + gates * ffn + h)
    forwards = _FORWARD_PASSES[layout.recompute] - 2
    return forwards * (inputs + weights) + grads


def fp8_weight_copy_bytes(model: ModelSpec, layout: ParallelLayout) -> float:
    """Bytes of FP8 weight copies on a rank of ``layout`` (0 unless its precision is fp8):
    the linear weights of its ``num_layers/pp`` layers, its share of the routed experts."""
    if layout.precision != "fp8":
        return 0.0
    if model.moe is None:
        per_layer = layer_matmul_params(model) / layout.tp
    else:
        moe, h = model.moe, model.hidden_size
        dense = attention_matmul_params(model) + 3 * h * moe.shared_expert_ffn_hidden_size
        experts = 3 * h * moe.expert_ffn_hidden_size * moe.num_experts
        per_layer = dense / layout.tp + experts / (layout.ep * layout.etp)
    return WEIGHT_COPY_BYTES * per_layer * model.num_layers / layout.pp
