"""A predicted step time from the allocation's hardware description.

Deliberately simple: compute at an efficiency that grows with GEMM size, TP all-reduces on
the critical path, the pipeline bubble ``(pp-1)/vpp`` slots, blocking point-to-point
transfers, and the data-parallel gradient reduction partly hidden behind backward. It ranks
layouts and rehearses campaigns (the ``simulate`` backend); real trials decide.
"""

from __future__ import annotations

from dataclasses import dataclass

from parsearch.config import AllocationSpec, ModelSpec, ParallelLayout
from parsearch.estimate.flops import (
    embedding_params,
    flops_breakdown,
    head_params,
    layer_params,
)
from parsearch.estimate.memory import (
    _ACTIVATION_BYTES,
    EstimateSettings,
    MemoryEstimate,
    memory_per_rank,
)


@dataclass(frozen=True)
class Prediction:
    """What the analytic model expects a layout to achieve."""

    step_time_s: float
    tokens_per_s: float
    tflops_per_device: float
    mfu: float
    memory: MemoryEstimate
    fits: bool
    compute_s: float
    tp_comm_s: float
    bubble_s: float
    p2p_s: float
    dp_comm_s: float

    @property
    def peak_mem_bytes(self) -> float:
        return self.memory.total

    def to_dict(self) -> dict[str, float | bool]:
        return {
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "tflops_per_device": self.tflops_per_device,
            "mfu": self.mfu,
            "peak_mem_bytes": self.memory.total,
            "fits": self.fits,
        }


def _ring_allreduce_s(size_bytes: float, group: int, bandwidth: float, latency: float) -> float:
    if group <= 1:
        return 0.0
    return 2 * (group - 1) / group * size_bytes / bandwidth + latency * (group - 1)


def gemm_efficiency(model: ModelSpec, layout: ParallelLayout, settings: EstimateSettings) -> float:
    """Fraction of peak a rank's matmuls reach: small per-rank GEMMs run far below peak."""
    elements = layout.mbs * model.seq_length * model.hidden_size / layout.tp
    half = settings.gemm_half_efficiency_elements
    return settings.compute_efficiency * elements / (elements + half)


def predict(
    model: ModelSpec,
    layout: ParallelLayout,
    allocation: AllocationSpec,
    settings: EstimateSettings | None = None,
    schedule: str = "1f1b",
) -> Prediction:
    """Predict step time, throughput and peak memory of ``layout`` on ``allocation``."""
    settings = settings or EstimateSettings()
    per_node = allocation.devices_per_node
    intra = allocation.intra_node_bandwidth_bytes_per_s
    inter = allocation.inter_node_bandwidth_bytes_per_s
    latency = settings.collective_latency_s
    tp, pp, dp, vpp = layout.tp, layout.pp, layout.dp, layout.vpp
    # Megatron's rank order: TP innermost, then DP, then PP.
    tp_bw = intra if tp <= per_node else inter
    dp_bw = intra if tp * dp <= per_node else inter
    pp_bw = intra if tp * dp * pp <= per_node else inter
    e = _ACTIVATION_BYTES[settings.precision]

    hardware_flops = flops_breakdown(model, layout.global_batch, layout.recompute)["total"]
    model_flops = flops_breakdown(model, layout.global_batch, "none")["total"]
    microbatches = layout.gas
    flops_per_slot = hardware_flops / (dp * microbatches * pp * tp)
    efficiency = gemm_efficiency(model, layout, settings)
    compute_slot = flops_per_slot / (allocation.peak_flops_per_device * efficiency)

    activation_bytes = model.seq_length * layout.mbs * model.hidden_size * e
    allreduces_per_layer = 6 if layout.recompute == "full" else 4
    layers_per_stage = model.num_layers // pp
    tp_slot = (
        layers_per_stage
        * allreduces_per_layer
        * _ring_allreduce_s(activation_bytes, tp, tp_bw, latency)
    )
    slot = compute_slot + tp_slot
    bubble_slots = (pp - 1) / vpp
    p2p_transfers = 2 * (microbatches + pp - 1) * vpp if pp > 1 else 0
    p2p_bytes = activation_bytes / (tp if layout.sequence_parallel else 1)
    p2p = p2p_transfers * (p2p_bytes / pp_bw + latency)

    stage_params = layers_per_stage * layer_params(model) / tp
    stage_params += max(embedding_params(model), head_params(model)) / tp / pp
    grad_bytes = stage_params * (4 if settings.precision == "fp32" else 2)
    dp_time = _ring_allreduce_s(grad_bytes, dp, dp_bw, latency)
    if layout.zero_stage >= 3:
        # Weights are all-gathered again for every micro-batch's forward and backward.
        dp_time += microbatches * 2 * _ring_allreduce_s(grad_bytes, dp, dp_bw, latency) / 2
    dp_exposed = dp_time * (1 - settings.dp_overlap)

    step = (microbatches + bubble_slots) * slot + p2p + dp_exposed
    memory = memory_per_rank(model, layout, settings, schedule)
    tflops = model_flops / step / layout.world_size / 1e12
    return Prediction(
        step_time_s=step,
        tokens_per_s=layout.global_batch * model.seq_length / step,
        tflops_per_device=tflops,
        mfu=tflops * 1e12 / allocation.peak_flops_per_device,
        memory=memory,
        fits=memory.total <= allocation.device_memory_bytes,
        compute_s=microbatches * compute_slot,
        tp_comm_s=microbatches * tp_slot,
        bubble_s=bubble_slots * slot,
        p2p_s=p2p,
        dp_comm_s=dp_exposed,
    )
