"""A predicted step time from the allocation's hardware description or a probed profile.

Compute at an efficiency that grows with each matmul's size, stage by stage (the last stage
also computes the logits and the loss, and the slowest stage sets the pipeline's pace);
tensor-parallel collectives on the critical path (hierarchical when the group spans nodes);
the pipeline bubble ``(pp-1)/vpp`` slots (partly filled by the busy stages where ranks share
a node's CPU cores); blocking point-to-point transfers; and the
data-parallel traffic (once per step, or per micro-batch under ZeRO-3) hidden behind compute
only as far as there is compute to hide it behind. A machine profile
(:class:`~parsearch.estimate.machine.MachineProfile`) replaces the GEMM curve and the
data-sheet bandwidths with measured figures. It ranks layouts and rehearses campaigns (the
``simulate`` backend); real trials decide.
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
    _STATE_BYTES,
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


# Share of the buffer each rank sends, and the number of sequential steps, of a ring
# algorithm over ``g`` ranks (a send/recv is one transfer of the whole buffer).
def _ring_volume(op: str, group: int) -> float:
    if op == "send-recv":
        return 1.0
    share = (group - 1) / group
    return 2 * share if op == "all-reduce" else share


def _ring_steps(op: str, group: int) -> float:
    if op == "send-recv":
        return 1.0
    return (2 if op == "all-reduce" else 1) * (group - 1)


def collective_s(
    op: str,
    size_bytes: float,
    group: int,
    kind: str,
    bandwidth: float,
    settings: EstimateSettings,
) -> float:
    """Time of one ring collective over ``group`` ranks on ``kind`` links.

    A profile's fit for ``kind`` and ``op`` is used when there is one (rescaled by the ring's
    volume and steps to this group size when the probe measured another); otherwise the
    data-sheet ``bandwidth`` and the settings' per-step latency.
    """
    if group <= 1 and op != "send-recv":
        return 0.0
    machine = settings.machine
    fit = machine.collective(kind, op, group) if machine is not None else None
    if fit is not None:
        volume = _ring_volume(op, group) / _ring_volume(op, fit.group_size)
        steps = _ring_steps(op, group) / _ring_steps(op, fit.group_size)
        return fit.alpha_s * steps + size_bytes * fit.beta_s_per_byte * volume
    steps = _ring_steps(op, group) / (2 if op == "all-reduce" else 1)
    return _ring_volume(op, group) * size_bytes / bandwidth + settings.collective_latency_s * steps


def tp_allreduce_s(
    size_bytes: float, tp: int, allocation: AllocationSpec, settings: EstimateSettings
) -> float:
    """One tensor-parallel all-reduce of ``size_bytes``.

    Inside a node: a ring over the node's links. Spanning ``n`` nodes of ``g`` devices:
    hierarchical, as NCCL runs it: reduce-scatter inside each node, then ``g`` concurrent
    all-reduces of ``size/g`` across the nodes (one per device, each over its own share of
    the node's NICs: ``inter_node_bandwidth`` is per device), then all-gather inside the node.
    """
    per_node = allocation.devices_per_node
    intra = allocation.intra_node_bandwidth_bytes_per_s
    if tp <= per_node:
        return collective_s("all-reduce", size_bytes, tp, "tp-intra-node", intra, settings)
    machine = settings.machine
    if machine is not None and machine.collective("tp-spanning-nodes", "all-reduce", tp):
        return collective_s("all-reduce", size_bytes, tp, "tp-spanning-nodes", intra, settings)
    inter = allocation.inter_node_bandwidth_bytes_per_s
    nodes = tp // per_node
    inside = collective_s("reduce-scatter", size_bytes, per_node, "tp-intra-node", intra, settings)
    inside += collective_s("all-gather", size_bytes, per_node, "tp-intra-node", intra, settings)
    across = collective_s(
        "all-reduce", size_bytes / per_node, nodes, "dp-across-nodes", inter, settings
    )
    return inside + across


def _curve(elements: float, settings: EstimateSettings) -> float:
    half = settings.gemm_half_efficiency_elements
    return settings.compute_efficiency * elements / (elements + half)


def _layer_gemms(model: ModelSpec, layout: ParallelLayout) -> list[tuple[float, float]]:
    """(multiply-adds, output elements) of one layer's forward matmuls on one TP rank.

    Column-parallel matmuls (QKV, the MLP's first) split their outputs over TP;
    row-parallel ones (attention output, the MLP's second) split their inner dimension and
    keep a full-size output. So TP shrinks only half the layer's GEMM outputs.
    """
    tokens = layout.mbs * model.seq_length
    h, t = model.hidden_size, layout.tp
    qkv = (h + 2 * model.kv_heads * model.head_dim) / t
    mlp = model.ffn / t
    first_mlp = (tokens * h * mlp, tokens * mlp)
    gemms = [(tokens * h * qkv, tokens * qkv), (tokens * h / t * h, tokens * h), first_mlp]
    if model.arch == "llama":
        gemms.append(first_mlp)  # SwiGLU's gate
    gemms.append((tokens * mlp * h, tokens * h))
    return gemms


def gemm_efficiency(model: ModelSpec, layout: ParallelLayout, settings: EstimateSettings) -> float:
    """Fraction of peak a rank's layer matmuls reach: a profile's measurement at this shape,
    or the GEMM curve averaged over the layer's matmuls, weighted by their work."""
    machine = settings.machine
    if machine is not None:
        measured = machine.gemm_efficiency(layout.tp, layout.mbs, model.seq_length)
        if measured is not None:
            return measured
    gemms = _layer_gemms(model, layout)
    work = sum(macs for macs, _ in gemms)
    return work / sum(macs / _curve(out, settings) for macs, out in gemms)


def unfused_softmax_bytes(
    model: ModelSpec, layout: ParallelLayout, settings: EstimateSettings
) -> float:
    """Memory traffic of one layer's attention softmax (and its dropout) for one micro-batch
    on one TP rank, without flash attention: every one of the ``b·a/t·s²`` scores is read and
    written by the fused scale-mask-softmax, and again by the dropout (plus its 1-byte mask),
    forward; backward reads the gradient and the probabilities and writes a gradient, and the
    dropout's backward reads the mask. Recompute (selective or full) runs the forward again.
    Memory-bound, so it costs small models, whose GEMMs per score are few, the most."""
    e = _ACTIVATION_BYTES[settings.precision]
    scores = layout.mbs * model.num_heads / layout.tp * model.seq_length**2
    dropout = settings.dropout
    forward = 2 * e + (2 * e + 1 if dropout else 0)
    backward = 3 * e + (2 * e + 1 if dropout else 0)
    forwards = 2 if layout.recompute in ("selective", "full") else 1
    return scores * (forwards * forward + backward)


def stage_compute_s(
    model: ModelSpec,
    layout: ParallelLayout,
    allocation: AllocationSpec,
    settings: EstimateSettings,
) -> list[float]:
    """Compute time of one micro-batch on a rank of each pipeline stage (the last stage also
    runs the output layer and the loss)."""
    per_mb = flops_breakdown(model, layout.mbs, layout.recompute)
    t, peak = layout.tp, allocation.peak_flops_per_device
    layers = model.num_layers
    heads_per_rank = model.num_heads / t
    attention_eff = _curve(layout.mbs * heads_per_rank * model.seq_length**2, settings)
    logits_eff = _curve(layout.mbs * model.seq_length * model.vocab_size / t, settings)
    layer_s = per_mb["matmul"] / layers / t / (peak * gemm_efficiency(model, layout, settings))
    layer_s += per_mb["attention"] / layers / t / (peak * attention_eff)
    logits_s = per_mb["logits"] / t / (peak * logits_eff)
    if not settings.flash_attention:
        layer_s += unfused_softmax_bytes(model, layout, settings) / (
            allocation.memory_bandwidth_bytes_per_s
        )
    per_stage = layers // layout.pp * layer_s
    return [per_stage + (logits_s if stage == layout.pp - 1 else 0.0) for stage in range(layout.pp)]


def _dp_exposed_s(
    model: ModelSpec,
    layout: ParallelLayout,
    allocation: AllocationSpec,
    settings: EstimateSettings,
    slot_compute: float,
) -> float:
    """Data-parallel traffic left on the critical path.

    Plain DP and ZeRO-1/2 reduce the gradients once per step (an all-reduce, or a
    reduce-scatter then an all-gather of the updated weights: the same bytes), behind the
    last micro-batch's backward. ZeRO-3 gathers the weights for every micro-batch's forward
    and again for its backward and reduce-scatters its gradients, behind that micro-batch's
    compute. Either hides at most ``dp_overlap`` of the traffic and never more than the
    compute it runs behind.
    """
    tp, dp = layout.tp, layout.dp
    if dp <= 1:
        return 0.0
    per_node = allocation.devices_per_node
    across = tp * dp > per_node
    kind = "dp-across-nodes" if across else "dp-intra-node"
    bandwidth = (
        allocation.inter_node_bandwidth_bytes_per_s
        if across
        else allocation.intra_node_bandwidth_bytes_per_s
    )
    stage_params = model.num_layers // layout.pp * layer_params(model) / tp
    stage_params += max(embedding_params(model), head_params(model)) / tp / layout.pp
    weight_b, grad_b, _ = _STATE_BYTES[settings.precision]
    if layout.zero_stage >= 3:
        # One gather / reduce-scatter per layer (the unit ZeRO-3 fetches), each paying the
        # ring's latency, plus one for the embedding or output layer.
        layers = model.num_layers // layout.pp
        pieces = [layer_params(model) / tp] * layers + [
            stage_params - layers * layer_params(model) / tp
        ]
        traffic = 0.0
        for params in pieces:
            size = params * weight_b
            traffic += 2 * collective_s("all-gather", size, dp, kind, bandwidth, settings)
            traffic += collective_s("reduce-scatter", size, dp, kind, bandwidth, settings)
        hidden = settings.dp_overlap * min(traffic, slot_compute)
        return layout.gas * (traffic - hidden)
    # The gradients are reduced in the precision they are accumulated in (fp32 main grads).
    traffic = collective_s("all-reduce", stage_params * grad_b, dp, kind, bandwidth, settings)
    backward = slot_compute * 2 / 3
    return traffic - settings.dp_overlap * min(traffic, backward)


def _compute_share(
    layout: ParallelLayout, allocation: AllocationSpec, settings: EstimateSettings
) -> float:
    """What a rank's compute speed is while all its node's ranks compute, as a fraction of
    its speed alone (a profile's knowledge; 1.0 without one)."""
    if settings.machine is None:
        return 1.0
    ranks_per_node = min(allocation.devices_per_node, layout.world_size)
    return settings.machine.compute_share(ranks_per_node)


def pipeline_slots(microbatches: int, bubble_slots: float, share: float) -> float:
    """A pipeline step's length in micro-batch slots, a slot timed with every rank busy.

    With a device per rank the bubble is idle time: ``microbatches + bubble_slots``. Where
    ranks share a node's cores (``share`` < 1: CPU ranks outnumbering cores), a stage idle in
    the bubble hands its core to the busy ones, which then run ``1/share`` times faster: the
    step is bound by the critical path at that speed or by the node's total work, which is
    ``microbatches`` slots of every rank at the shared speed, whichever is longer."""
    return max(float(microbatches), (microbatches + bubble_slots) * share)


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
    tp, pp, dp, vpp = layout.tp, layout.pp, layout.dp, layout.vpp
    # Megatron's rank order: TP innermost, then DP, then PP.
    pp_bw = intra if tp * dp * pp <= per_node else inter
    e = _ACTIVATION_BYTES[settings.precision]
    microbatches = layout.gas

    stages = stage_compute_s(model, layout, allocation, settings)
    activation_bytes = model.seq_length * layout.mbs * model.hidden_size * e
    allreduces_per_layer = 6 if layout.recompute == "full" else 4
    layers_per_stage = model.num_layers // pp
    tp_slot = (
        layers_per_stage
        * allreduces_per_layer
        * tp_allreduce_s(activation_bytes, tp, allocation, settings)
    )
    compute_slot = max(stages)
    slot = compute_slot + tp_slot
    bubble_slots = (pp - 1) / vpp
    p2p = 0.0
    if pp > 1:
        p2p_bytes = activation_bytes / (tp if layout.sequence_parallel else 1)
        transfer = collective_s("send-recv", p2p_bytes, 2, "pp-p2p", pp_bw, settings)
        p2p = 2 * (microbatches + pp - 1) * vpp * transfer
    dp_exposed = _dp_exposed_s(model, layout, allocation, settings, compute_slot)

    pipeline = pipeline_slots(
        microbatches, bubble_slots, _compute_share(layout, allocation, settings)
    )
    step = pipeline * slot + p2p + dp_exposed
    memory = memory_per_rank(model, layout, settings, schedule)
    model_flops = flops_breakdown(model, layout.global_batch, "none")["total"]
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
        bubble_s=(pipeline - microbatches) * slot,
        p2p_s=p2p,
        dp_comm_s=dp_exposed,
    )
