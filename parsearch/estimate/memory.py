"""Memory per rank: model states by sharding stage, activations by Korthikanti et al. (2022).

Activation bytes per layer and micro-batch, 16-bit, with dropout (the paper's table):
``s·b·h·(34 + 5·a·s/h)`` unsharded, ``s·b·h·(10 + 24/t + 5·a·s/(h·t))`` with tensor parallel
``t``, ``s·b·h·(34/t + 5·a·s/(h·t))`` with sequence parallel, ``2·s·b·h`` with full
recompute. We compute the same sum term by term, so it also holds without dropout, in fp32,
for SwiGLU MLPs and with flash attention (which removes the ``a·s/h`` term).

Context parallelism (``cp``) splits every sequence over ``cp`` ranks, so each rank keeps the
activations of ``s/cp`` tokens (:func:`tokens_per_rank`); weights are whole on each of them,
and the gradients and optimizer states are reduced and sharded over the ``dp·cp`` ranks that
hold the same weights (:func:`shard_group`), as Megatron-core's distributed optimizer (its
data-parallel group "with context parallel", ``megatron/core/parallel_state.py``) and
torchtitan's FSDP (sharded over ``dp_shard·cp``, ``ParallelDims``) do.

A mixture-of-experts layer's routed experts are split over ``ep·etp`` ranks, and their
gradients and optimizer states are reduced and sharded over the expert data-parallel group of
``edp = tp·cp·dp/(ep·etp)`` ranks that hold the same experts (:func:`expert_shard_group`;
Megatron-core's "parallel folding", its expert data-parallel group). The rest of the layer (the
attention, the shared experts, the router) is held as a dense layer's. Its activations keep
the ``top_k`` routed copies of every token the rank's experts compute, and the dispatch and
combine buffers hold them once more (:func:`moe_dispatch_bytes`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from parsearch.config import ModelSpec, MoESpec, ParallelLayout
from parsearch.estimate.flops import (
    embedding_params,
    head_params,
    layer_params,
    moe_layer_dense_params,
    routed_expert_params,
)
from parsearch.estimate.fp8 import fp8_weight_copy_bytes
from parsearch.estimate.machine import MachineProfile

# Bytes per parameter for (weights, gradients, optimizer states) by precision. Mixed
# precision follows Megatron's count: 16-bit weights, fp32 gradient accumulation, fp32
# master weights + Adam moments = 18 bytes; plain fp32 keeps no master copy = 16 bytes.
_STATE_BYTES = {"bf16": (2, 4, 12), "fp16": (2, 4, 12), "fp32": (4, 4, 8)}
_ACTIVATION_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
# "megatron": Megatron-LM / DeepSpeed accounting (16-bit weights, distributed optimizer for
# ZeRO-1). "torch": the built-in trainer (parsearch.trainers.builtin): fp32 weights with bf16
# autocast or FSDP2 mixed precision, FSDP2's sharded + gathered copies, autograd's weight-gradient
# temporaries and torch.distributed.pipelining's buffers (see _torch_memory).
FRAMEWORKS = ("megatron", "torch")


@dataclass(frozen=True)
class EstimateSettings:
    """Knobs of the analytic model that a search space may set (``estimate:`` section)."""

    precision: str = "bf16"
    flash_attention: bool = True
    # None: as the framework trains (Megatron-LM and DeepSpeed GPTs use dropout; the built-in
    # trainer has none).
    dropout: bool | None = None
    runtime_overhead_bytes: int = 0
    # Fraction of peak that large matmuls reach, before communication and the bubble:
    # above the end-to-end 57% hardware-FLOP utilisation Korthikanti et al. (2022) measured
    # for GPT-3 175B to 1T on A100, which includes both.
    compute_efficiency: float = 0.7
    gemm_half_efficiency_elements: float = 2.0**19
    dp_overlap: float = 0.7
    collective_latency_s: float = 30e-6
    framework: str = "megatron"
    machine: MachineProfile | None = None
    # Tokens the busiest expert rank gets, over the mean tokens·k/E share: an assumption
    # (the router's balance is not modelled); a profile's ``moe_imbalance`` range scales it.
    moe_imbalance: float = 1.0

    def __post_init__(self) -> None:
        if self.precision not in _STATE_BYTES:
            raise ValueError(f"precision must be one of {sorted(_STATE_BYTES)}")
        if self.framework not in FRAMEWORKS:
            raise ValueError(f"framework must be one of {list(FRAMEWORKS)}")
        if self.dropout is None:
            object.__setattr__(self, "dropout", self.framework == "megatron")


@dataclass(frozen=True)
class MemoryEstimate:
    """Predicted peak bytes on the most loaded rank, by category."""

    weights: float
    grads: float
    optimizer: float
    activations: float
    overhead: float
    stage: int = 0
    workspace: float = 0.0
    # Of ``weights``, ``grads`` and ``optimizer``: what a mixture of experts' routed experts
    # hold; and its dispatch and combine buffers (counted in ``total``).
    expert_weights: float = 0.0
    expert_grads: float = 0.0
    expert_optimizer: float = 0.0
    dispatch: float = 0.0

    @property
    def total(self) -> float:
        return (
            self.weights
            + self.grads
            + self.optimizer
            + self.activations
            + self.overhead
            + self.workspace
            + self.dispatch
        )

    def breakdown(self) -> dict[str, float]:
        """Bytes by what holds them, as ``plan`` shows them: the dense weights and gradients,
        the routed experts' weights and gradients, all optimizer states, activations,
        transient buffers (workspace, dispatch) and the runtime's overhead; they sum to
        :attr:`total`."""
        experts = self.expert_weights + self.expert_grads
        return {
            "dense": self.weights + self.grads - experts,
            "experts": experts,
            "optimizer": self.optimizer,
            "activations": self.activations,
            "buffers": self.workspace + self.dispatch,
            "overhead": self.overhead,
        }


def tokens_per_rank(model: ModelSpec, layout: ParallelLayout) -> float:
    """Tokens of one micro-batch a rank computes and keeps: its ``s/cp`` share of each of the
    ``mbs`` sequences (two of the ``2·cp`` load-balancing chunks)."""
    return layout.mbs * model.seq_length / layout.cp


def shard_group(layout: ParallelLayout) -> int:
    """Ranks that hold the same weights and so reduce (and ZeRO-shard) one gradient: the
    data-parallel replicas times the context-parallel ranks of each."""
    return layout.dp * layout.cp


def expert_shard_group(layout: ParallelLayout) -> int:
    """The expert data-parallel group ``edp``: ranks that hold the same experts and so reduce
    (and shard) their gradients, ``tp·cp·dp/(ep·etp)`` (Megatron-core's folding)."""
    return layout.tp * layout.cp * layout.dp // (layout.ep * layout.etp)


def stage_layers(model: ModelSpec, layout: ParallelLayout) -> list[tuple[int, int]]:
    """(dense, MoE) layers of each pipeline stage: stage ``s`` holds the model chunks ``j``
    of ``L/(pp·vpp)`` consecutive layers with ``j % pp == s`` (one chunk without
    interleaving), so DeepSeek's first dense layers fall on the first stage."""
    if model.moe is None:
        return [(model.num_layers // layout.pp, 0)] * layout.pp
    return list(_moe_stage_layers(model.num_layers, layout.pp, layout.vpp, model.moe))


@functools.lru_cache(maxsize=1024)
def _moe_stage_layers(
    num_layers: int, pp: int, vpp: int, moe: MoESpec
) -> tuple[tuple[int, int], ...]:
    """:func:`stage_layers` of an MoE model, cached: ``plan`` asks it for every layout."""
    chunk = max(1, num_layers // (pp * vpp))
    counts = [[0, 0] for _ in range(pp)]
    for index in range(num_layers // pp * pp):
        counts[(index // chunk) % pp][int(moe.is_moe_layer(index))] += 1
    return tuple((dense, moe_layers) for dense, moe_layers in counts)


def stage_dense_params(model: ModelSpec, layout: ParallelLayout, layers: tuple[int, int]) -> float:
    """Parameters of a stage's ``(dense, MoE)`` layers one rank holds besides the routed
    experts: split over TP, except the router, which every TP rank keeps whole."""
    dense_layers, moe_layers = layers
    params = dense_layers * layer_params(model) / layout.tp
    if moe_layers:
        assert model.moe is not None
        router = model.hidden_size * model.moe.num_experts
        params += moe_layers * ((moe_layer_dense_params(model) - router) / layout.tp + router)
    return params


def stage_expert_params(model: ModelSpec, layout: ParallelLayout, moe_layers: int) -> float:
    """Routed-expert parameters one rank holds: ``E/ep`` experts per MoE layer, each split
    over ``etp``."""
    if model.moe is None or not moe_layers:
        return 0.0
    experts = model.moe.num_experts * routed_expert_params(model)
    return moe_layers * experts / (layout.ep * layout.etp)


def moe_load(model: ModelSpec, settings: EstimateSettings) -> float:
    """Tokens the busiest expert rank computes over the mean share: the assumed imbalance
    when dropless, at most the capacity factor when tokens beyond capacity are dropped."""
    assert model.moe is not None
    capacity = model.moe.capacity_factor
    if capacity is None:
        return settings.moe_imbalance
    return min(settings.moe_imbalance, capacity)


def routed_tokens_per_rank(
    model: ModelSpec, layout: ParallelLayout, settings: EstimateSettings
) -> float:
    """Token copies one rank's experts compute per micro-batch and MoE layer: its TP
    group's ``tokens·k`` spread over the ``tp/etp`` expert-TP groups (each expert-TP rank
    sees all of its group's tokens, for a ``1/etp`` slice of each expert), at the busiest
    rank's load (:func:`moe_load`)."""
    assert model.moe is not None
    tokens = tokens_per_rank(model, layout) * model.moe.top_k * layout.etp / layout.tp
    return tokens * moe_load(model, settings)


def moe_dispatch_bytes(
    model: ModelSpec, layout: ParallelLayout, settings: EstimateSettings
) -> float:
    """One MoE layer's transient dispatch and combine buffers (the permuted token copies
    sent to the experts and the expert outputs coming back): the all-to-all's output for
    the dispatch and its input for the combine, ``k`` copies of the rank's tokens each. Under
    a capacity factor the buffers are padded to capacity."""
    assert model.moe is not None
    e = _ACTIVATION_BYTES[settings.precision]
    routed = routed_tokens_per_rank(model, layout, settings)
    if model.moe.capacity_factor is not None:
        routed *= model.moe.capacity_factor / moe_load(model, settings)
    return 2 * e * routed * model.hidden_size


def moe_activation_bytes_per_layer(
    model: ModelSpec, layout: ParallelLayout, settings: EstimateSettings
) -> float:
    """What an MoE layer keeps for backward, per micro-batch, on one rank: a dense layer's
    attention part, the shared experts' intermediates in place of the dense FFN's, the
    router's fp32 logits and probabilities, and, for every routed token copy the rank's
    experts compute, its input and the SwiGLU intermediates (counted as the dense MLP's,
    ``4·f_e`` per token, ``1/etp`` of them). Full recompute keeps only the layer input."""
    assert model.moe is not None
    dense = activation_bytes_per_layer(model, layout, settings)
    if layout.recompute == "full":
        return dense
    e = _ACTIVATION_BYTES[settings.precision]
    h, t = model.hidden_size, layout.tp
    tokens = tokens_per_rank(model, layout)
    mlp_saved = 4 if model.arch == "llama" else 2
    shared = 4 * model.moe.shared_expert_ffn_hidden_size
    ffn = e * (shared - mlp_saved * model.ffn) * tokens / t
    router = 2 * 4 * tokens * model.moe.num_experts / t
    expert_width = model.moe.expert_ffn_hidden_size / layout.etp
    experts = e * routed_tokens_per_rank(model, layout, settings) * (h + 4 * expert_width)
    return dense + ffn + router + experts


def activation_bytes_per_layer(
    model: ModelSpec, layout: ParallelLayout, settings: EstimateSettings
) -> float:
    """Bytes one layer keeps for backward, for one micro-batch, on one TP rank (of its
    ``s/cp`` tokens under context parallelism)."""
    s, h = model.seq_length, model.hidden_size
    t = layout.tp
    e = _ACTIVATION_BYTES[settings.precision]
    sbh = tokens_per_rank(model, layout) * h
    if layout.recompute == "full":
        return e * sbh / (t if layout.sequence_parallel else 1)
    mask = 1 if settings.dropout else 0
    # Replicated across TP ranks unless sequence parallel: two norm inputs, the attention and
    # MLP inputs, two dropout masks.
    replicated = (4 * e + 2 * mask) * sbh
    if layout.sequence_parallel:
        replicated /= t
    ffn_ratio = model.ffn / h
    mlp_saved = (4 if model.arch == "llama" else 2) * ffn_ratio
    kv_ratio = model.kv_heads / model.num_heads
    # Sharded by heads / FFN columns: Q, K, V, the attention output, the MLP intermediates.
    sharded = e * (1 + 2 * kv_ratio + 1 + mlp_saved) * sbh / t
    scores = 0.0
    if not settings.flash_attention and layout.recompute != "selective":
        # The rank's queries against every key.
        scores = model.num_heads * s * tokens_per_rank(model, layout) * (e + mask * (1 + e)) / t
    return replicated + sharded + scores


def _in_flight_microbatches(layout: ParallelLayout, stage: int, schedule: str) -> float:
    """Micro-batches whose activations a pipeline stage holds at its peak."""
    if layout.pp == 1 or schedule == "gpipe":
        return layout.gas if schedule == "gpipe" else 1
    if layout.vpp > 1:
        # Korthikanti et al.: interleaving costs the first stage a factor 1 + (p-1)/(p·v).
        extra = (layout.pp - 1) / (layout.pp * layout.vpp)
        return min(layout.gas * 1.0, (layout.pp - stage) * (1 + extra))
    return min(layout.gas, layout.pp - stage)


def memory_by_stage(
    model: ModelSpec,
    layout: ParallelLayout,
    settings: EstimateSettings,
    schedule: str = "1f1b",
) -> list[MemoryEstimate]:
    """Predicted peak memory of a rank in each pipeline stage."""
    weight_b, grad_b, optim_b = _STATE_BYTES[settings.precision]
    e = _ACTIVATION_BYTES[settings.precision]
    t, dp, pp = layout.tp, shard_group(layout), layout.pp
    edp = expert_shard_group(layout)
    act_layer = activation_bytes_per_layer(model, layout, settings)
    act_moe = (
        act_layer if model.moe is None else moe_activation_bytes_per_layer(model, layout, settings)
    )
    tokens = tokens_per_rank(model, layout)
    estimates = []
    for stage, (dense_layers, moe_layers) in enumerate(stage_layers(model, layout)):
        params = stage_dense_params(model, layout, (dense_layers, moe_layers))
        experts = stage_expert_params(model, layout, moe_layers)
        if stage == 0:
            params += embedding_params(model) / t
        if stage == pp - 1:
            params += head_params(model) / t
            if model.tied_embeddings and pp > 1:
                # Megatron keeps a copy of the tied embedding on the last stage.
                params += model.vocab_size * model.hidden_size / t
        weights = params * weight_b / (dp if layout.zero_stage >= 3 else 1)
        grads = params * grad_b / (dp if layout.zero_stage >= 2 else 1)
        optimizer = params * optim_b / (dp if layout.zero_stage >= 1 else 1)
        expert_weights = experts * weight_b / (edp if layout.zero_stage >= 3 else 1)
        expert_grads = experts * grad_b / (edp if layout.zero_stage >= 2 else 1)
        expert_optimizer = experts * optim_b / (edp if layout.zero_stage >= 1 else 1)
        in_flight = _in_flight_microbatches(layout, stage, schedule)
        activations = in_flight * dense_layers * act_layer + in_flight * moe_layers * act_moe
        if layout.recompute == "full":
            # Backward re-materialises one layer's full activations at a time.
            activations += activation_bytes_per_layer(
                model, replace(layout, recompute="none"), settings
            )
        if stage == pp - 1:
            # Logits and their softmax for the loss, in fp32, one micro-batch at a time.
            activations += 2 * 4 * tokens * model.vocab_size / t + e * tokens * model.hidden_size
        workspace = 0.0
        if settings.framework == "megatron":
            if stage == 0:
                activations += in_flight * embedding_activation_bytes(model, layout, settings)
            if layout.zero_stage >= 3:
                workspace = zero3_buffer_bytes(model, layout, settings)
        estimate = MemoryEstimate(
            weights=weights + expert_weights,
            grads=grads + expert_grads,
            optimizer=optimizer + expert_optimizer,
            activations=activations,
            overhead=float(settings.runtime_overhead_bytes),
            stage=stage,
            workspace=workspace,
            expert_weights=expert_weights,
            expert_grads=expert_grads,
            expert_optimizer=expert_optimizer,
            dispatch=moe_dispatch_bytes(model, layout, settings) if moe_layers else 0.0,
        )
        if settings.framework == "torch":
            estimate = _torch_memory(
                estimate, model, layout, settings, params, in_flight, (dense_layers, moe_layers)
            )
        estimates.append(_with_baseline(estimate, settings))
    return estimates


def embedding_activation_bytes(
    model: ModelSpec, layout: ParallelLayout, settings: EstimateSettings
) -> float:
    """What the first stage keeps per micro-batch for its embedding, as Megatron-LM counts it
    (``megatron/training/theoretical_memory_usage.py``, commit 1bcb3b9e): the int64 token
    ids and the embedding dropout's 1-byte mask (sharded along the sequence under sequence
    parallel), for the rank's ``s/cp`` tokens."""
    tokens = tokens_per_rank(model, layout)
    mask = tokens * model.hidden_size if settings.dropout else 0.0
    if layout.sequence_parallel:
        mask /= layout.tp
    return 8 * tokens + mask


# DeepSpeed's ZeRO-3 defaults (``stage3_max_live_parameters``, ``reduce_bucket_size``):
# how many gathered parameters may be alive at once, and the gradient bucket's elements.
ZERO3_MAX_LIVE_PARAMS = 1e9
ZERO3_REDUCE_BUCKET = 5e8


def largest_linear_params(model: ModelSpec, tp: int) -> float:
    """The largest single weight of a layer on one TP rank (an MLP matrix, ``h·ffn/t``):
    ZeRO-3 gathers a module's weight whole and produces its gradient whole, whatever its
    limits say."""
    return model.hidden_size * model.ffn / tp


def zero3_buffer_bytes(
    model: ModelSpec, layout: ParallelLayout, settings: EstimateSettings
) -> float:
    """ZeRO-3's transient full-size copies, in the weights' precision: the layer being
    computed and the one prefetched behind it (at most DeepSpeed's live-parameter limit,
    but never less than the largest weight, which is gathered whole), and the gradients
    waiting for their reduce-scatter: the reduction bucket (at most one layer) and, when a
    weight is larger than the bucket, that weight's gradient, produced whole by its
    matmul's backward beside the bucket's buffer."""
    weight_b = _STATE_BYTES[settings.precision][0]
    layer = layer_params(model) / layout.tp
    largest = largest_linear_params(model, layout.tp)
    gathered = max(min(2 * layer, ZERO3_MAX_LIVE_PARAMS), largest)
    bucket = min(layer, ZERO3_REDUCE_BUCKET)
    oversized = largest if largest > bucket else 0.0
    return (gathered + bucket + oversized) * weight_b


def _with_baseline(estimate: MemoryEstimate, settings: EstimateSettings) -> MemoryEstimate:
    """Add a machine profile's measured baseline: runtime context, communicator buffers and
    the allocator's reserve over the tensors it holds."""
    if settings.machine is None:
        return estimate
    baseline = settings.machine.memory
    tensors = estimate.total - estimate.overhead
    overhead = (
        estimate.overhead
        + baseline.context_bytes
        + baseline.communicator_bytes
        + baseline.allocator_reserve_fraction * tensors
    )
    return replace(estimate, overhead=overhead)


def _torch_memory(
    estimate: MemoryEstimate,
    model: ModelSpec,
    layout: ParallelLayout,
    settings: EstimateSettings,
    params: float,
    in_flight: float,
    layers: tuple[int, int],
) -> MemoryEstimate:
    """Model states and transient buffers of the built-in trainer, as measured on CPU with
    ``MemTracker`` (within a few per cent on the tiny test model).

    * Weights are fp32 (4 B) with fp32 gradients (4 B) and AdamW moments (8 B). Under bf16
      autocast the bf16 copy of every weight is kept for backward (2 B), 18 B in all.
    * FSDP2 (``zero_stage`` >= 1) keeps the fp32 shard of weights and gradients (``/dp``)
      plus the gathered copies (2 B in bf16 mixed precision, 4 B in fp32): all of the stage's
      weights for stages 1-2 (``reshard_after_forward=False``), the root's (embedding,
      output) and one layer's for stage 3; unsharded gradients of the whole stage for stage
      1 (accumulated without reduction) or of the root and one layer for stages 2-3.
    * Workspace: backward's largest transient, the MLP's (two ``[tokens, ffn]`` activation
      gradients and one weight-gradient temporary) or, on the last stage, the loss's (the
      logits' gradient and the output weight's gradient temporary); under pipelining the
      stage output each in-flight micro-batch keeps and the receive buffers that
      ``torch.distributed.pipelining`` allocates for every micro-batch, in both directions.
    """
    t, dp, pp, stage = layout.tp, shard_group(layout), layout.pp, estimate.stage
    h = model.hidden_size
    e = _ACTIVATION_BYTES[settings.precision]
    half = settings.precision != "fp32"
    layer = layer_params(model) / t
    if model.moe is None:
        root = params - (model.num_layers // pp) * layer
    else:
        root = params - stage_dense_params(model, layout, layers)
    optimizer = params * 8 / (dp if layout.zero_stage else 1)
    if layout.zero_stage == 0:
        weights, grads = params * (4 + (2 if half else 0)), params * 4.0
    else:
        gathered = 2 if half else 4
        held = params if layout.zero_stage < 3 else root + layer
        weights = params * 4 / dp + held * gathered
        unreduced = params if layout.zero_stage == 1 else root + layer
        grads = params * 4 / dp + unreduced * gathered
    grad_temp_b = 2 if half and layout.zero_stage else 4
    tokens = tokens_per_rank(model, layout)
    workspace = 2 * tokens * model.ffn / t * e + h * model.ffn / t * grad_temp_b
    if stage == pp - 1:
        loss = tokens * model.vocab_size / t * 4 + model.vocab_size * h / t * grad_temp_b
        workspace = max(workspace, loss)
    if pp > 1:
        boundary = tokens * h * e / (t if layout.sequence_parallel else 1)
        receives = (layout.vpp - (stage == 0)) + (layout.vpp - (stage == pp - 1))
        workspace += receives * layout.gas * boundary
        if stage != pp - 1:
            workspace += in_flight * boundary
        else:
            # The schedule keeps the last stage's output (the logits) of every micro-batch
            # until the step returns, to merge them.
            workspace += layout.gas * tokens * model.vocab_size / t * e
    # The routed experts keep Megatron's accounting (expert_*).
    return replace(
        estimate,
        weights=weights + estimate.expert_weights,
        grads=grads + estimate.expert_grads,
        optimizer=optimizer + estimate.expert_optimizer,
        workspace=workspace,
    )


def memory_per_rank(
    model: ModelSpec,
    layout: ParallelLayout,
    settings: EstimateSettings | None = None,
    schedule: str = "1f1b",
) -> MemoryEstimate:
    """Peak predicted memory over all ranks (the stage that runs out first)."""
    stages = memory_by_stage(model, layout, settings or EstimateSettings(), schedule)
    copies = fp8_weight_copy_bytes(model, layout)
    stages = [replace(stage, weights=stage.weights + copies) for stage in stages]
    return max(stages, key=lambda estimate: estimate.total)
