"""A predicted step time from the allocation's hardware description or a machine profile.

Compute at an efficiency that grows with each matmul's size, stage by stage (the last stage
also computes the logits and the loss, and the slowest stage sets the pipeline's pace);
tensor-parallel collectives on the critical path (hierarchical when the group spans nodes);
the pipeline's fill and drain, one pass through every other stage (:func:`bubble_in_slots`,
partly filled by the busy stages where ranks share a node's CPU cores); blocking
point-to-point transfers; the data-parallel traffic (once per step, hierarchical where a
group's ranks share a node's links; or per micro-batch under ZeRO-3) hidden behind compute
only as far as there is compute to hide it behind; and the once-per-step optimizer work. A
machine profile (:class:`~parsearch.estimate.machine.MachineProfile`) replaces the GEMM curve
and the data-sheet bandwidths with measured figures (a device profile also times the
element-wise work at its memory bandwidth). It ranks layouts and rehearses campaigns (the
``simulate`` backend); real trials decide.

A mixture-of-experts layer (:func:`moe_layer_s`, :func:`moe_comm_layer_s`) computes the
attention and the shared experts as a dense layer does, and its routed experts at their own
GEMM shape (``tokens·k/E`` tokens per expert, often few: the GEMM curve at that shape), at the
busiest expert rank's load (``moe_imbalance``, an assumption the band's ``moe_imbalance``
range spans); it sends its tokens to their experts and back by all-to-all over the EP group,
forward and backward, on the links the group spans, *not* overlapped with compute (Megatron's
``--overlap-moe-expert-parallel-comm`` and DeepSeek's DualPipe hide part of it: not modelled,
so the estimate errs slow there); the routed experts' gradients are reduced over the expert
data-parallel group once per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from parsearch.config import AllocationSpec, ModelSpec, ParallelLayout
from parsearch.estimate.flops import (
    _FORWARD_PASSES,
    attention_matmul_params,
    attention_passes,
    embedding_params,
    flops_breakdown,
    head_params,
    layer_params,
)
from parsearch.estimate.fp8 import fp8_layer_s
from parsearch.estimate.machine import ring_steps, ring_volume, wave_efficiency
from parsearch.estimate.memory import (
    _ACTIVATION_BYTES,
    _STATE_BYTES,
    EstimateSettings,
    MemoryEstimate,
    expert_shard_group,
    memory_per_rank,
    moe_load,
    routed_tokens_per_rank,
    shard_group,
    stage_dense_params,
    stage_expert_params,
    stage_layers,
    tokens_per_rank,
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
    # The once-per-step tail: exposed data-parallel traffic, and within it ``optimizer_s``,
    # the optimizer step and the per-step reductions (:func:`step_fixed_s`).
    dp_comm_s: float
    optimizer_s: float = 0.0
    # Context parallelism's K/V ring exchange left on the critical path (what the attention
    # blocks could not hide, :func:`cp_ring_exposed_s`), seconds per step.
    cp_comm_s: float = 0.0
    # A mixture of experts' all-to-all dispatch and combine (and the expert-TP gathers), not
    # overlapped, seconds per step on the busiest stage.
    moe_comm_s: float = 0.0

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
        volume = ring_volume(op, group) / ring_volume(op, fit.group_size)
        steps = ring_steps(op, group) / ring_steps(op, fit.group_size)
        return fit.alpha_s * steps + size_bytes * fit.beta_s_per_byte * volume
    steps = ring_steps(op, group) / (2 if op == "all-reduce" else 1)
    return ring_volume(op, group) * size_bytes / bandwidth + settings.collective_latency_s * steps


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


def _layer_gemms(model: ModelSpec, layout: ParallelLayout) -> list[tuple[float, float, float]]:
    """(m tokens, n output columns, k inner) of one layer's forward matmuls on one TP rank.

    Column-parallel matmuls (QKV, the MLP's first) split their outputs over TP;
    row-parallel ones (attention output, the MLP's second) split their inner dimension and
    keep a full-size output. So TP shrinks only half the layer's GEMM outputs; CP shrinks
    them all (each rank multiplies its ``s/cp`` tokens).
    """
    tokens = tokens_per_rank(model, layout)
    h, t = model.hidden_size, layout.tp
    qkv = (h + 2 * model.kv_heads * model.head_dim) / t
    gemms = [(tokens, qkv, h), (tokens, h, h / t)]
    return gemms + _mlp_gemms(tokens, h, model.ffn / t, model.arch == "llama")


def _mlp_gemms(
    tokens: float, h: int, width: float, swiglu: bool
) -> list[tuple[float, float, float]]:
    """(m, n, k) of an MLP's forward matmuls over ``tokens`` tokens, ``width`` of its
    columns on this rank."""
    first_mlp = (tokens, width, float(h))
    gemms = [first_mlp]
    if swiglu:
        gemms.append(first_mlp)  # SwiGLU's gate
    gemms.append((tokens, float(h), width))
    return gemms


def _curve_efficiency(gemms: list[tuple[float, float, float]], settings: EstimateSettings) -> float:
    """The GEMM curve's efficiency over ``gemms`` (by output size), weighted by their work."""
    work = sum(m * n * k for m, n, k in gemms)
    return work / sum(m * n * k / _curve(m * n, settings) for m, n, k in gemms)


def _shape_efficiency(
    gemms: list[tuple[float, float, float]], settings: EstimateSettings, forwards: int = 1
) -> float:
    """Fraction of peak ``gemms`` reach, weighted by their work, every pass they run: the
    profile's tile and wave model (:func:`~parsearch.estimate.machine.wave_efficiency`)
    on each forward ``(m, n, k)``, its input gradient ``(m, k, n)`` and its weight gradient
    ``(k, n, m)`` (``forwards``: 2 under full recompute), which shapes differ, so a narrow
    TP slice or a short expert is slow in one pass and not another. Without ``gemm_tiles``
    the GEMM curve of output size, forward shapes, as before."""
    machine = settings.machine
    tiles = machine.gemm_tiles if machine is not None else None
    if tiles is None:
        return _curve_efficiency(gemms, settings)
    passes = []
    for m, n, k in gemms:
        passes += [(m, n, k)] * forwards + [(m, k, n), (k, n, m)]
    work = sum(m * n * k for m, n, k in passes)
    time = sum(m * n * k / wave_efficiency(m, n, k, tiles) for m, n, k in passes)
    return tiles.ceiling * work / time


def _forwards(layout: ParallelLayout) -> int:
    return 2 if layout.recompute == "full" else 1


def expert_gemm_efficiency(
    model: ModelSpec, layout: ParallelLayout, settings: EstimateSettings
) -> float:
    """Fraction of peak a rank's routed-expert matmuls reach at their real shape, one
    SwiGLU FFN of ``f_e/etp`` columns over the tokens one local expert gets (its ``E/ep``
    experts share the rank's routed token copies), which is often small."""
    assert model.moe is not None
    local_experts = model.moe.num_experts / layout.ep
    tokens = routed_tokens_per_rank(model, layout, settings) / local_experts
    width = model.moe.expert_ffn_hidden_size / layout.etp
    gemms = _mlp_gemms(tokens, model.hidden_size, width, True)
    return _shape_efficiency(gemms, settings, _forwards(layout))


def gemm_efficiency(model: ModelSpec, layout: ParallelLayout, settings: EstimateSettings) -> float:
    """Fraction of peak a rank's layer matmuls reach: a profile's measurement at this shape,
    or each matmul by its shape (:func:`_shape_efficiency`), weighted by their work."""
    machine = settings.machine
    if machine is not None:
        measured = machine.gemm_efficiency(layout.tp, layout.mbs, model.seq_length // layout.cp)
        if measured is not None:
            return measured
    return _shape_efficiency(_layer_gemms(model, layout), settings, _forwards(layout))


def logits_gemm_efficiency(
    model: ModelSpec, layout: ParallelLayout, settings: EstimateSettings
) -> float:
    """Fraction of peak the output layer's matmul reaches: ``tokens x h`` by ``h x V/tp``."""
    gemm = (tokens_per_rank(model, layout), model.vocab_size / layout.tp, model.hidden_size)
    return _shape_efficiency([gemm], settings)


def unfused_softmax_bytes(
    model: ModelSpec, layout: ParallelLayout, settings: EstimateSettings
) -> float:
    """Memory traffic of one layer's attention softmax (and its dropout) for one micro-batch
    on one TP rank, without flash attention: every one of the ``b·a/t·s²`` scores is read and
    written by the fused scale-mask-softmax, and again by the dropout (plus its 1-byte mask),
    forward; backward reads the gradient and the probabilities and writes a gradient, and the
    dropout's backward reads the mask. Recompute (selective or full) runs the forward again.
    Memory-bound, so it costs small models, whose GEMMs per score are few, the most. Under
    context parallelism a rank scores its ``s/cp`` queries."""
    e = _ACTIVATION_BYTES[settings.precision]
    scores = layout.mbs * model.num_heads / layout.tp * model.seq_length**2 / layout.cp
    dropout = settings.dropout
    forward = 2 * e + (2 * e + 1 if dropout else 0)
    backward = 3 * e + (2 * e + 1 if dropout else 0)
    forwards = 2 if layout.recompute in ("selective", "full") else 1
    return scores * (forwards * forward + backward)


def elementwise_bytes(
    model: ModelSpec, layout: ParallelLayout, settings: EstimateSettings
) -> float:
    """Memory traffic of one layer's element-wise work for one micro-batch on one TP rank:
    the two norms, the two bias-dropout-residual adds and the MLP's activation, forward and
    backward (and forward again under full recompute), each reading and writing its
    tensors once (Megatron's fused kernels). Per token, the norms and adds move
    ``10·e + 2·mask`` bytes of each hidden element each way (``e`` bytes an activation, a
    1-byte dropout mask), replicated over TP unless sequence parallel; the activation moves
    ``2e`` (GELU) or ``3e`` (SwiGLU) bytes of each FFN element forward and ``3e`` or ``5e``
    backward, split over TP. Timed at the memory bandwidth when a device profile gives one
    (the default compute efficiency, calibrated end to end, already absorbs it)."""
    e = _ACTIVATION_BYTES[settings.precision]
    mask = 1 if settings.dropout else 0
    tokens = tokens_per_rank(model, layout)
    forwards = 2 if layout.recompute == "full" else 1
    replicated = (forwards + 1) * (10 * e + 2 * mask) * model.hidden_size
    if layout.sequence_parallel:
        replicated /= layout.tp
    swiglu = model.arch == "llama"
    activation = forwards * (3 if swiglu else 2) * e + (5 if swiglu else 3) * e
    sharded = activation * model.ffn / layout.tp
    return tokens * (replicated + sharded)


def attention_layer_s(
    model: ModelSpec,
    layout: ParallelLayout,
    allocation: AllocationSpec,
    settings: EstimateSettings,
) -> float:
    """One layer's attention core (the score and value matmuls, every pass: forward,
    backward, recompute) for one micro-batch on one rank: ``1/tp`` of the heads, ``1/cp`` of
    the work. A kernel's efficiency is that of one block it runs: the whole ``s×s`` score
    matrix without CP, one ``s/cp × s/cp`` block of the ring per step with it."""
    t, peak, cp = layout.tp, allocation.peak_flops_per_device, layout.cp
    attention = flops_breakdown(model, layout.mbs, layout.recompute)["attention"]
    block = model.seq_length**2 / cp**2
    attention_eff = _curve(layout.mbs * model.num_heads / t * block, settings)
    machine = settings.machine
    if settings.flash_attention and machine is not None and machine.attention_flops:
        # A device profile's fused-attention kernel, measured forward and backward.
        attention_eff = machine.attention_flops / peak
    return attention / cp / model.num_layers / t / (peak * attention_eff)


def stage_compute_s(
    model: ModelSpec,
    layout: ParallelLayout,
    allocation: AllocationSpec,
    settings: EstimateSettings,
) -> list[float]:
    """Compute time of one micro-batch on a rank of each pipeline stage (the last stage also
    runs the output layer and the loss). Under context parallelism a rank computes its
    ``s/cp`` tokens of every sequence: ``1/cp`` of the matmuls and logits and, with the
    load-balanced split, ``1/cp`` of the causal attention."""
    dense = replace(model, moe=None)
    per_mb = flops_breakdown(dense, layout.mbs, layout.recompute)
    t, peak, cp = layout.tp, allocation.peak_flops_per_device, layout.cp
    layers = model.num_layers
    machine = settings.machine
    logits_eff = logits_gemm_efficiency(model, layout, settings)
    layer_s = per_mb["matmul"] / cp / layers / t / (peak * gemm_efficiency(model, layout, settings))
    layer_s = fp8_layer_s(layer_s, model, layout, settings, memory_bandwidth(allocation, settings))
    layer_s += attention_layer_s(model, layout, allocation, settings)
    logits_s = per_mb["logits"] / cp / t / (peak * logits_eff)
    if not settings.flash_attention:
        layer_s += unfused_softmax_bytes(model, layout, settings) / memory_bandwidth(
            allocation, settings
        )
    if machine is not None and machine.memory_bandwidth_bytes_per_s:
        layer_s += elementwise_bytes(model, layout, settings) / memory_bandwidth(
            allocation, settings
        )
    moe_s = 0.0 if model.moe is None else moe_layer_s(model, layout, allocation, settings)
    return [
        dense_layers * layer_s + moe_layers * moe_s + (logits_s if stage == layout.pp - 1 else 0.0)
        for stage, (dense_layers, moe_layers) in enumerate(stage_layers(model, layout))
    ]


def moe_layer_s(
    model: ModelSpec,
    layout: ParallelLayout,
    allocation: AllocationSpec,
    settings: EstimateSettings,
) -> float:
    """Compute time of one MoE layer for one micro-batch on the busiest rank: the attention,
    router and shared-expert matmuls at the dense layer's efficiency, the routed experts'
    ``routed·3·h·f_e/etp`` multiply-adds (at the busiest rank's load) at their own shape's
    (:func:`expert_gemm_efficiency`), the attention core as in a dense layer, and, with a
    device profile, the element-wise work with the routed and shared widths in place of the
    dense FFN's."""
    assert model.moe is not None
    moe, h, t = model.moe, model.hidden_size, layout.tp
    peak = allocation.peak_flops_per_device
    passes = _FORWARD_PASSES[layout.recompute]
    tokens = tokens_per_rank(model, layout)
    dense_macs = tokens * (
        (attention_matmul_params(model) + 3 * h * moe.shared_expert_ffn_hidden_size) / t
        + h * moe.num_experts
    )
    expert_width = moe.expert_ffn_hidden_size / layout.etp
    expert_macs = routed_tokens_per_rank(model, layout, settings) * 3 * h * expert_width
    layer_s = 2 * passes * dense_macs / (peak * gemm_efficiency(model, layout, settings))
    layer_s += 2 * passes * expert_macs / (peak * expert_gemm_efficiency(model, layout, settings))
    layer_s = fp8_layer_s(layer_s, model, layout, settings, memory_bandwidth(allocation, settings))
    layer_s += attention_layer_s(model, layout, allocation, settings)
    if not settings.flash_attention:
        layer_s += unfused_softmax_bytes(model, layout, settings) / memory_bandwidth(
            allocation, settings
        )
    machine = settings.machine
    if machine is not None and machine.memory_bandwidth_bytes_per_s:
        width = moe.top_k * moe_load(model, settings) * moe.expert_ffn_hidden_size
        widened = replace(
            model, moe=None, ffn_hidden_size=width + moe.shared_expert_ffn_hidden_size
        )
        layer_s += elementwise_bytes(widened, layout, settings) / memory_bandwidth(
            allocation, settings
        )
    return layer_s


def ranks_per_node(group: int, stride: int, allocation: AllocationSpec) -> int:
    """Ranks of a group of ``group`` ranks ``stride`` apart that share a node (one when the
    stride fills the node)."""
    per_node = allocation.devices_per_node
    if stride >= per_node:
        return 1
    return max(1, min(group, per_node // stride))


def all_to_all_s(
    size_bytes: float,
    layout: ParallelLayout,
    allocation: AllocationSpec,
    settings: EstimateSettings,
) -> float:
    """One all-to-all over the EP group, each rank sending ``(ep-1)/ep`` of its
    ``size_bytes`` buffer to the others. Megatron-core orders the expert ranks etp-ep-edp-pp
    (``RankGenerator`` with ``order="tp-cp-ep-dp-pp"`` and the expert TP as its ``tp``): an
    EP group is ``ep`` ranks ``etp`` apart, inside one node when ``etp·ep <=
    devices_per_node``. A rank's per-peer sends all start at once, so its bytes move as a
    ring all-gather's do (the same ``(ep-1)/ep`` share, ``ep-1`` latencies): timed as one,
    by a profile's fit where it has one. Spanning nodes, the share bound for other nodes
    goes on the network (each rank on its own NIC share) while the rest goes on the node's
    links, at the same time: the slower of the two."""
    ep = layout.ep
    if ep <= 1:
        return 0.0
    intra = allocation.intra_node_bandwidth_bytes_per_s
    if layout.etp * ep <= allocation.devices_per_node:
        return collective_s("all-gather", size_bytes, ep, "dp-intra-node", intra, settings)
    inter = allocation.inter_node_bandwidth_bytes_per_s
    local = ranks_per_node(ep, layout.etp, allocation)
    across = size_bytes * (ep - local) / (ep - 1)
    inside = size_bytes * (local - 1) / (ep - 1)
    return max(
        collective_s("all-gather", across, ep, "dp-across-nodes", inter, settings),
        collective_s("all-gather", inside, ep, "dp-intra-node", intra, settings)
        if local > 1
        else 0.0,
    )


def moe_comm_layer_s(
    model: ModelSpec,
    layout: ParallelLayout,
    allocation: AllocationSpec,
    settings: EstimateSettings,
) -> float:
    """One MoE layer's token traffic for one micro-batch: a dispatch and a combine
    all-to-all forward, the same two backward (and again for a recomputed forward), each of
    the rank's ``k`` copies of its ``tokens/tp`` sequence-parallel share, at the busiest
    rank's load (:func:`all_to_all_s`); with expert TP, the gather of the routed tokens over
    the ``etp`` ranks and the reduce-scatter of their outputs (an all-reduce's bytes) per
    pass. Not overlapped with compute."""
    assert model.moe is not None
    e = _ACTIVATION_BYTES[settings.precision]
    passes = _FORWARD_PASSES[layout.recompute] - 1  # forward, backward, a recomputed forward
    sent = tokens_per_rank(model, layout) / layout.tp * model.moe.top_k * model.hidden_size
    size = e * sent * moe_load(model, settings)
    per_pass = 2 * all_to_all_s(size, layout, allocation, settings)
    if layout.etp > 1:
        routed = routed_tokens_per_rank(model, layout, settings) * model.hidden_size * e
        per_pass += tp_allreduce_s(routed, layout.etp, allocation, settings)
    return passes * per_pass


def cp_ring_links(layout: ParallelLayout, allocation: AllocationSpec) -> tuple[str, float]:
    """The links a context-parallel group's ring runs on, as a collective kind and its
    data-sheet bandwidth. Megatron orders ranks tp-cp-dp-pp, innermost first: a CP group is
    ``cp`` ranks ``tp`` apart within ``tp·cp`` consecutive ranks, inside one node when
    ``tp·cp <= devices_per_node``; otherwise its ring crosses the network at every node
    boundary and each step waits for that hop (one rank per boundary, on its own NIC share)."""
    if layout.tp * layout.cp <= allocation.devices_per_node:
        return "dp-intra-node", allocation.intra_node_bandwidth_bytes_per_s
    return "dp-across-nodes", allocation.inter_node_bandwidth_bytes_per_s


def cp_ring_step_s(
    model: ModelSpec,
    layout: ParallelLayout,
    allocation: AllocationSpec,
    settings: EstimateSettings,
) -> float:
    """One step of ring (p2p) attention's K/V exchange for one layer and micro-batch: every
    rank sends its K and V (``2·b·(s/cp)·kv_width/tp`` elements, ``kv_width`` = K/V heads ×
    head size, so grouped-query attention shrinks it) to the next rank and receives the
    previous rank's, all at once (Megatron-core's ``--cp-comm-type p2p``, Transformer
    Engine's ``AttnFuncWithCPAndKVP2P``). That is one step of a ring all-gather of the
    group's K/V, and it is timed as one: a profile's all-gather fit for where the group lies,
    or the data-sheet bandwidth and the settings' latency."""
    e = _ACTIVATION_BYTES[settings.precision]
    kv_width = model.kv_heads * model.head_dim
    chunk = e * 2 * tokens_per_rank(model, layout) * kv_width / layout.tp
    kind, bandwidth = cp_ring_links(layout, allocation)
    cp = layout.cp
    return collective_s("all-gather", chunk * cp, cp, kind, bandwidth, settings) / (cp - 1)


def cp_ring_exposed_s(
    model: ModelSpec,
    layout: ParallelLayout,
    allocation: AllocationSpec,
    settings: EstimateSettings,
) -> float:
    """The part of one layer's K/V ring exchange, for one micro-batch, that the attention
    compute cannot hide. A forward pass runs ``cp`` attention blocks (the rank's own chunks,
    then one per received K/V) and ``cp - 1`` transfers, each behind one block: a step whose
    transfer outlasts its block exposes the difference. The backward passes the K/V and
    their gradients (twice the bytes) behind the backward blocks (twice the work), so it
    exposes twice a forward's; a recomputed forward exposes one more. Zero without CP."""
    cp = layout.cp
    if cp <= 1:
        return 0.0
    passes = attention_passes(layout.recompute)
    block = attention_layer_s(model, layout, allocation, settings) / passes / cp
    transfer = cp_ring_step_s(model, layout, allocation, settings)
    forward = (cp - 1) * max(0.0, transfer - block)
    return passes * forward


def dp_ranks_per_node(layout: ParallelLayout, allocation: AllocationSpec) -> int:
    """Ranks of one data-parallel group (``dp·cp`` ranks: :func:`shard_group`) that share a
    node. Megatron orders ranks TP innermost, then CP, then DP: the group's ranks are ``tp``
    apart, so a node of ``g`` devices holds ``g / tp`` of them (one when TP fills the
    node)."""
    return ranks_per_node(shard_group(layout), layout.tp, allocation)


def dp_collective_s(
    op: str,
    size_bytes: float,
    layout: ParallelLayout,
    allocation: AllocationSpec,
    settings: EstimateSettings,
    *,
    hierarchical: bool = True,
) -> float:
    """One collective over a data-parallel group of ``dp·cp`` ranks (the ranks that hold the
    same weights; ``dp`` without context parallelism).

    Inside a node: a ring over the node's links. Across nodes with one rank of the group
    per node: a ring at the per-device network bandwidth. Across nodes with ``g > 1`` ranks
    of the group per node, those ``g`` ranks share the node's network links, and the
    collective runs as NCCL and RCCL run it there, hierarchically: an all-reduce is a
    reduce-scatter inside each node, ``g`` concurrent all-reduces of ``size/g`` across the
    nodes (one per device, each on its own share of the node's links), and an all-gather
    inside the node; an all-gather or a reduce-scatter is the across-nodes step on ``size/g``
    and the inside-node step on ``size``. Each device then sends ``1/g`` of what a flat
    ring at the per-device bandwidth would (``hierarchical=False``: the flat ring)."""
    return group_collective_s(
        op, size_bytes, shard_group(layout), layout.tp, allocation, settings, hierarchical
    )


def group_collective_s(
    op: str,
    size_bytes: float,
    dp: int,
    tp: int,
    allocation: AllocationSpec,
    settings: EstimateSettings,
    hierarchical: bool = True,
) -> float:
    """:func:`dp_collective_s` over any group of ``dp`` ranks ``tp`` apart (the expert
    data-parallel group: ``edp`` ranks ``etp·ep`` apart)."""
    if dp <= 1:
        return 0.0
    intra = allocation.intra_node_bandwidth_bytes_per_s
    inter = allocation.inter_node_bandwidth_bytes_per_s
    if tp * dp <= allocation.devices_per_node:
        return collective_s(op, size_bytes, dp, "dp-intra-node", intra, settings)
    g = ranks_per_node(dp, tp, allocation)
    if g == 1 or not hierarchical:
        return collective_s(op, size_bytes, dp, "dp-across-nodes", inter, settings)
    nodes = dp // g
    across = collective_s(op, size_bytes / g, nodes, "dp-across-nodes", inter, settings)
    if op == "all-reduce":
        inside = collective_s("reduce-scatter", size_bytes, g, "dp-intra-node", intra, settings)
        inside += collective_s("all-gather", size_bytes, g, "dp-intra-node", intra, settings)
    else:
        inside = collective_s(op, size_bytes, g, "dp-intra-node", intra, settings)
    return across + inside


# DeepSpeed's ZeRO-3 defaults: parameters below this many elements stay whole on every
# rank (``stage3_param_persistence_threshold``), never gathered.
ZERO3_PERSISTENCE_THRESHOLD = 1e5


def zero3_gathered_modules(model: ModelSpec, tp: int) -> list[float]:
    """Parameters of each module ZeRO-3 gathers in one layer, per TP rank: every linear
    layer is fetched on its own (its weight and bias in one all-gather); the norms, under
    DeepSpeed's persistence threshold, are never gathered."""
    h, f = model.hidden_size, model.ffn
    kv = model.kv_heads * model.head_dim
    bias = 1 if model.arch == "gpt" else 0
    modules = [
        (h + 2 * kv) * (h + bias),  # QKV
        h * (h + bias),  # attention output
        f * (h + bias),  # MLP up
    ]
    if model.arch == "llama":
        modules.append(f * h)  # SwiGLU's gate
    modules.append(h * (f + bias))  # MLP down
    return [params / tp for params in modules if params / tp >= ZERO3_PERSISTENCE_THRESHOLD]


def zero3_passes(layout: ParallelLayout) -> int:
    """How many times ZeRO-3 gathers a layer's weights per micro-batch: for the forward,
    for the backward, and, with full recompute, once more for the recomputed forward
    (released after each forward, they are fetched again for the next)."""
    return 3 if layout.recompute == "full" else 2


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
    last micro-batch's backward, hierarchically where ranks of the group share a node.
    ZeRO-3 gathers every linear layer's weights for each forward and backward of every
    micro-batch (:func:`zero3_passes`), one all-gather per module
    (:func:`zero3_gathered_modules`), and reduce-scatters the gradients, behind that
    micro-batch's compute. Either hides at most ``dp_overlap`` of the traffic and never
    more than the compute it runs behind. The group is the ``dp·cp`` ranks that hold the same
    weights.
    """
    weight_b, grad_b, _ = _STATE_BYTES[settings.precision]
    experts = expert_reduce_s(model, layout, allocation, settings)
    if experts:
        experts -= settings.dp_overlap * min(experts, slot_compute * 2 / 3)
    if shard_group(layout) <= 1:
        return experts
    tp = layout.tp
    stage_params = _stage_params(model, layout)
    if layout.zero_stage >= 3:
        layers = model.num_layers // layout.pp
        # One gather per layer (the modules of a layer go out back to back, so their rings'
        # latencies overlap), plus one for the stage's embedding or output layer.
        outer = stage_params - layers * layer_params(model) / tp
        traffic = 0.0
        for params in [*[layer_params(model) / tp] * layers, outer]:
            size = params * weight_b
            # DeepSpeed gathers on the flat data-parallel communicator, a module at a time.
            gather = dp_collective_s(
                "all-gather", size, layout, allocation, settings, hierarchical=False
            )
            traffic += zero3_passes(layout) * gather
            traffic += dp_collective_s(
                "reduce-scatter", size, layout, allocation, settings, hierarchical=False
            )
        hidden = settings.dp_overlap * min(traffic, slot_compute)
        return layout.gas * (traffic - hidden) + experts
    # The gradients are reduced in the precision they are accumulated in (fp32 main grads).
    traffic = dp_collective_s("all-reduce", stage_params * grad_b, layout, allocation, settings)
    backward = slot_compute * 2 / 3
    return traffic - settings.dp_overlap * min(traffic, backward) + experts


def _stage_params(model: ModelSpec, layout: ParallelLayout) -> float:
    """Parameters one rank of the largest stage reduces over the data-parallel group (all
    but the routed experts), with its share of the embedding or output layer."""
    tp = layout.tp
    if model.moe is None:
        stage_params = model.num_layers // layout.pp * layer_params(model) / tp
    else:
        stage_params = max(
            stage_dense_params(model, layout, layers) for layers in stage_layers(model, layout)
        )
    stage_params += max(embedding_params(model), head_params(model)) / tp / layout.pp
    return stage_params


def _stage_expert_params(model: ModelSpec, layout: ParallelLayout) -> float:
    """Routed-expert parameters of the stage with the most MoE layers, on one rank."""
    return max(
        stage_expert_params(model, layout, moe_layers)
        for _, moe_layers in stage_layers(model, layout)
    )


def expert_reduce_s(
    model: ModelSpec,
    layout: ParallelLayout,
    allocation: AllocationSpec,
    settings: EstimateSettings,
) -> float:
    """The routed experts' once-per-step gradient all-reduce (a reduce-scatter and the
    updated weights' all-gather under the distributed optimizer: the same bytes) over the
    expert data-parallel group, ``edp`` ranks ``etp·ep`` apart (Megatron's expert rank
    order etp-ep-edp-pp), in the fp32 main gradients' precision. Zero for a dense model.
    Under ZeRO-3 the experts' per-micro-batch gathers are not modelled (Megatron has no
    ZeRO-3; DeepSpeed's MoE keeps experts out of ZeRO-3's partitioning by default)."""
    experts = _stage_expert_params(model, layout)
    if not experts:
        return 0.0
    grad_b = _STATE_BYTES[settings.precision][1]
    stride = layout.etp * layout.ep
    return group_collective_s(
        "all-reduce", experts * grad_b, expert_shard_group(layout), stride, allocation, settings
    )


def memory_bandwidth(allocation: AllocationSpec, settings: EstimateSettings) -> float:
    """What a streaming kernel reaches: a profile's figure, else the allocation's."""
    machine = settings.machine
    if machine is not None and machine.memory_bandwidth_bytes_per_s:
        return machine.memory_bandwidth_bytes_per_s
    return allocation.memory_bandwidth_bytes_per_s


# Bytes the optimizer step streams per parameter (Megatron-LM's mixed-precision Adam:
# fp32 main gradients, fp32 master weights and two moments): the gradient norm reads each
# gradient (4), the fused Adam reads weight, gradient and moments and writes weight and
# moments (16 + 12), the 16-bit copy reads the master and writes the model weight (4 + 2),
# and the gradient buffer is zeroed for the next step (4). The built-in trainer (torch's
# AdamW on fp32 weights) streams the Adam part only.
_OPTIMIZER_BYTES = {"megatron": {"shard": 34, "local": 8}, "torch": {"shard": 28, "local": 0}}


def step_fixed_s(
    model: ModelSpec,
    layout: ParallelLayout,
    allocation: AllocationSpec,
    settings: EstimateSettings,
) -> float:
    """The once-per-step work after the last micro-batch: the optimizer step over the
    rank's shard of the optimizer state (memory-bound, at :func:`memory_bandwidth`),
    gradient zeroing and norm over its local gradients, and the small all-reduces of the
    loss and the gradient norm over every rank (latency-bound: a tree's ``2·log2(world)``
    hops each)."""
    stage_params = _stage_params(model, layout)
    shard = stage_params / (shard_group(layout) if layout.zero_stage >= 1 else 1)
    experts = _stage_expert_params(model, layout)
    if experts:
        shard += experts / (expert_shard_group(layout) if layout.zero_stage >= 1 else 1)
        stage_params += experts
    per_param = _OPTIMIZER_BYTES[settings.framework]
    streamed = shard * per_param["shard"] + stage_params * per_param["local"]
    hops = 2 * math.ceil(math.log2(layout.world_size)) if layout.world_size > 1 else 0
    return (
        streamed / memory_bandwidth(allocation, settings) + 2 * hops * settings.collective_latency_s
    )


def _compute_share(
    layout: ParallelLayout, allocation: AllocationSpec, settings: EstimateSettings
) -> float:
    """What a rank's compute speed is while all its node's ranks compute, as a fraction of
    its speed alone (a profile's knowledge; 1.0 without one)."""
    if settings.machine is None:
        return 1.0
    ranks_per_node = min(allocation.devices_per_node, layout.world_size)
    return settings.machine.compute_share(ranks_per_node)


def bubble_in_slots(stage_slots: list[float], vpp: int = 1) -> float:
    """The pipeline's fill and drain, in slots of its slowest stage.

    Under 1F1B each micro-batch but one waits on the slowest stage, and the first and last
    pass once through every other stage: the step is ``(m - 1)·max + sum`` of the stage
    slots, so the bubble is the *other* stages' slots, ``(sum - max) / max`` slowest-stage
    slots (``(p - 1)`` when the stages are alike), each ``1/vpp`` long when interleaved. A
    last stage made slower by the logits thus no longer paces the fill and drain."""
    slowest = max(stage_slots)
    if slowest <= 0:
        return (len(stage_slots) - 1) / vpp
    return (sum(stage_slots) - slowest) / slowest / vpp


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
    # Megatron's rank order: TP innermost, then CP, then DP, then PP.
    pp_bw = intra if tp * layout.cp * dp * pp <= per_node else inter
    e = _ACTIVATION_BYTES[settings.precision]
    microbatches = layout.gas

    stages = stage_compute_s(model, layout, allocation, settings)
    activation_bytes = tokens_per_rank(model, layout) * model.hidden_size * e
    allreduces_per_layer = 6 if layout.recompute == "full" else 4
    layers_per_stage = model.num_layers // pp
    tp_allreduce = tp_allreduce_s(activation_bytes, tp, allocation, settings)
    # An MoE layer keeps the attention's TP all-reduces only: its tokens reach the experts by
    # all-to-all (and expert TP's gathers, in moe_comm_layer_s), not by the MLP's all-reduce.
    tp_slots = [
        (dense_layers * allreduces_per_layer + moe_layers * allreduces_per_layer // 2)
        * tp_allreduce
        if model.moe is not None
        else layers_per_stage * allreduces_per_layer * tp_allreduce
        for dense_layers, moe_layers in stage_layers(model, layout)
    ]
    cp_slot = layers_per_stage * cp_ring_exposed_s(model, layout, allocation, settings)
    moe_layer = 0.0 if model.moe is None else moe_comm_layer_s(model, layout, allocation, settings)
    moe = [moe_layers * moe_layer for _, moe_layers in stage_layers(model, layout)]
    busy = [
        stage + tp + cp_slot + comm for stage, tp, comm in zip(stages, tp_slots, moe, strict=True)
    ]
    busiest = max(range(pp), key=lambda stage: busy[stage])
    compute_slot, tp_slot, moe_slot = stages[busiest], tp_slots[busiest], moe[busiest]
    slot = compute_slot + tp_slot + cp_slot + moe_slot
    bubble_slots = bubble_in_slots(busy, vpp)
    p2p = 0.0
    if pp > 1:
        p2p_bytes = activation_bytes / (tp if layout.sequence_parallel else 1)
        transfer = collective_s("send-recv", p2p_bytes, 2, "pp-p2p", pp_bw, settings)
        p2p = 2 * (microbatches + pp - 1) * vpp * transfer
    fixed = step_fixed_s(model, layout, allocation, settings)
    dp_exposed = _dp_exposed_s(model, layout, allocation, settings, compute_slot) + fixed

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
        optimizer_s=fixed,
        cp_comm_s=microbatches * cp_slot,
        moe_comm_s=microbatches * moe_slot,
    )
