"""Parallelism applied to the plain model by small functions, in torchtitan's order:
pipeline split → tensor parallel and expert parallel (on the meta device) → materialise +
init → context parallel → activation recompute → data parallel (FSDP2 or gradient
all-reduce over dp·cp; the MoE layers' parameters reduced over their own groups)
→ pipeline schedule.

Each function takes the piece of the device mesh it needs, so the same code runs any
``(pp, dp, cp, tp)`` layout, including the degenerate size-1 dimensions.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterable, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from parsearch.config import ModelSpec, ParallelLayout
from parsearch.errors import TrainerError
from parsearch.trainers.builtin.expert_parallel import ExpertComm
from parsearch.trainers.builtin.model import Transformer, loss_fn
from parsearch.trainers.builtin.moe import Experts, MoE
from parsearch.trainers.builtin.ring_attention import RingCore, chunk_positions
from parsearch.trainers.builtin.settings import SCHEDULES


def stage_ids(layout: ParallelLayout, pp_rank: int) -> list[int]:
    """Pipeline stages (model chunks) held by pipeline rank ``pp_rank``: one, or ``vpp``
    looped ones (``pp_rank, pp_rank + pp, ...``) for the interleaved schedule."""
    return [pp_rank + chunk * layout.pp for chunk in range(layout.vpp)]


def split_stage(model: Transformer, stage: int, num_stages: int) -> Transformer:
    """A copy of ``model`` keeping only pipeline stage ``stage`` of ``num_stages`` equal
    slices of layers; the embedding stays on the first stage, norm and output on the last.

    Call it on a meta-device model: copying is then free.
    """
    part = copy.deepcopy(model)
    per_stage = len(model.layers) // num_stages
    keep = range(stage * per_stage, (stage + 1) * per_stage)
    for name in list(part.layers):
        if int(name) not in keep:
            del part.layers[name]
    if stage != 0:
        part.embed = None
    if stage != num_stages - 1:
        part.norm = None
        part.output = None
    # With a tied embedding and several stages, the last stage's output weight is now its
    # own copy; its gradient is summed with the first stage's (see tied_embedding_group).
    return part


def apply_tp(module: Transformer, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Megatron-style tensor parallelism with DTensor plans.

    Q/K/V and the first MLP matrices are column-parallel (each rank owns ``heads/tp`` heads,
    ``ffn/tp`` columns), the output projections row-parallel (one all-reduce per sub-layer).
    The embedding is row-parallel over the vocabulary, and the output column-parallel over
    it: each rank returns its vocabulary shard of the logits, for :func:`make_loss`. With
    ``sequence_parallel`` the norms and the residual stream are sharded over the sequence
    (``Shard(1)``); the embedding output is all-reduced then split over the sequence, which
    keeps GPT's learned positions simple.
    """
    if tp_mesh.size() == 1:
        return
    seq = Shard(1) if sequence_parallel else Replicate()
    if module.embed is not None:
        plan: dict = {"tok": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())}
        parallelize_module(module.embed, tp_mesh, plan)
        if sequence_parallel:
            parallelize_module(
                module.embed,
                tp_mesh,
                PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=seq),
            )
    for block in module.layers.values():
        plan = {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=seq),
        }
        # An MoE layer's experts are not split over tp (etp 1): it takes its tokens as they
        # come, a sequence slice per tp rank (see MoE.forward).
        dense = not isinstance(block.feed_forward, MoE)
        if dense:
            plan["feed_forward.w1"] = ColwiseParallel()
            plan["feed_forward.w2"] = RowwiseParallel(output_layouts=seq)
        if dense and block.feed_forward.w3 is not None:
            plan["feed_forward.w3"] = ColwiseParallel()
        if sequence_parallel:
            plan |= {
                "attention_norm": SequenceParallel(),
                "ffn_norm": SequenceParallel(),
                "attention": PrepareModuleInput(
                    input_layouts=(seq, None), desired_input_layouts=(Replicate(), None)
                ),
            }
        if sequence_parallel and dense:
            plan["feed_forward"] = PrepareModuleInput(
                input_layouts=(seq,), desired_input_layouts=(Replicate(),)
            )
        parallelize_module(block, tp_mesh, plan)
    if module.output is not None:
        plan = {"output": ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1))}
        if sequence_parallel:
            plan["norm"] = SequenceParallel()
        parallelize_module(module, tp_mesh, plan)
        if module.embed is not None and module.spec.tied_embeddings:
            module.output.weight = module.embed.tok.weight


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token cross-entropy of logits sharded over the vocabulary (Megatron's kernel):
    three all-reduces of ``[tokens]``-sized vectors (max, target logit, sum of exponentials)
    replace gathering ``[tokens, vocab]`` logits. Every TP rank gets the same loss; each
    back-propagates into its own shard only, so backward needs no communication."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, group: dist.ProcessGroup):
        shard = logits.shape[-1]
        start = dist.get_rank(group) * shard  # shards are equal (vocab % tp == 0, checked)
        top = logits.max(dim=-1).values
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
        exp = (logits - top.unsqueeze(-1)).exp_()
        outside = (targets < start) | (targets >= start + shard)
        local_targets = (targets - start).masked_fill(outside, 0)
        target_logit = logits.gather(-1, local_targets.unsqueeze(-1)).squeeze(-1) - top
        target_logit = target_logit.masked_fill(outside, 0.0)
        sum_exp = exp.sum(dim=-1)
        dist.all_reduce(target_logit, group=group)
        dist.all_reduce(sum_exp, group=group)
        exp /= sum_exp.unsqueeze(-1)  # now the softmax, kept for backward
        ctx.save_for_backward(exp, outside, local_targets)
        return sum_exp.log() - target_logit

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        softmax, outside, local_targets = ctx.saved_tensors
        grad_logits = softmax.clone()
        rows = torch.arange(grad_logits.shape[0], device=grad_logits.device)
        grad_logits[rows, local_targets] -= (~outside).to(grad_logits.dtype)
        return grad_logits * grad.unsqueeze(-1), None, None


def make_loss(tp_mesh: DeviceMesh) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Mean token cross-entropy of a micro-batch's logits as this rank holds them: whole, or
    its vocabulary shard under tensor parallelism (see :func:`apply_tp`), in fp32."""
    if tp_mesh.size() == 1:
        return loss_fn

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        per_token = _VocabParallelCrossEntropy.apply(
            logits.flatten(0, 1).float(), targets.flatten(), tp_mesh.get_group()
        )
        return per_token.mean()

    return loss


def apply_cp(module: Transformer, cp_mesh: DeviceMesh) -> None:
    """Context parallelism: the module is fed this CP rank's two chunks of every sequence
    (:func:`chunk_positions`) and attends over the others' through ring attention. Every
    other layer is per token and runs unchanged on the shorter sequence."""
    if cp_mesh.size() == 1:
        return
    module.hold_positions(
        chunk_positions(module.spec.seq_length, cp_mesh.size(), cp_mesh.get_local_rank())
    )
    for block in module.layers.values():
        block.attention.core = RingCore(cp_mesh.get_group())


def moe_layers(module: Transformer) -> list[MoE]:
    """The MoE FFNs of a model or stage (through recompute and FSDP wrappers, which forward
    attribute access to the layer they wrap)."""
    return [
        block.feed_forward
        for block in module.layers.values()
        if isinstance(block.feed_forward, MoE)
    ]


def apply_ep(module: Transformer, comm: ExpertComm | None) -> None:
    """Expert parallelism, on the meta device: each MoE layer keeps its EP rank's ``E/ep``
    experts (global indices from ``ep_rank·E/ep``) and routes through ``comm``."""
    if comm is None:
        return
    for moe in moe_layers(module):
        old = moe.experts
        local = moe.num_experts // comm.ep
        hidden, width = old.w1.shape[2], old.w1.shape[1]
        with torch.device(old.w1.device):
            moe.experts = Experts(local, hidden, width, first=comm.ep_rank * local)
        moe.comm = comm


def expert_parameters(modules: list[Transformer]) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """The MoE layers' routed-expert parameters, and their router and shared-expert ones."""
    experts: list[nn.Parameter] = []
    replicated: list[nn.Parameter] = []
    for module in modules:
        for moe in moe_layers(module):
            experts.extend(moe.experts.parameters())
            replicated.extend(moe.router.parameters())
            if moe.shared is not None:
                replicated.extend(moe.shared.parameters())
    return experts, replicated


def reduce_expert_gradients(modules: list[Transformer], comm: ExpertComm) -> None:
    """Gradients of the MoE layers, kept out of DDP and FSDP: summed over the ranks that
    computed parts of them, then divided by dp·cp as the dense gradients are averaged.

    Routed experts: every token of the stage reached its expert on exactly one rank of the
    expert-data-parallel group. Router and shared experts: each of the stage's tp·cp·dp
    ranks routed its own tokens (tp ranks a slice each)."""
    experts, replicated = expert_parameters(modules)
    allreduce_gradients(experts, comm.edp_group, divisor=comm.replicas)
    allreduce_gradients(replicated, comm.stage_group, divisor=comm.replicas)


def apply_recompute(module: Transformer, mode: str) -> None:
    """Activation checkpointing: ``full`` re-runs each whole layer in backward; ``selective``
    re-runs only the attention core (softmax(QKᵀ)V), whose saved state is the
    ``heads·seq²`` term when attention is not fused."""
    if mode == "none":
        return
    for name, block in list(module.layers.items()):
        if mode == "full":
            module.layers[name] = checkpoint_wrapper(block, preserve_rng_state=False)
        else:
            block.attention.core = checkpoint_wrapper(
                block.attention.core, preserve_rng_state=False
            )


def apply_fsdp(
    module: Transformer,
    dp_mesh: DeviceMesh,
    zero_stage: int,
    param_dtype: torch.dtype | None,
    ignored: set[nn.Parameter],
) -> None:
    """FSDP2 over the data-parallel ranks, one parameter group per layer plus the root.

    With ``param_dtype`` (bf16 training) weights are gathered in that dtype and gradients
    reduced in fp32 (torchtitan's mixed-precision policy), rather than leaving autocast to
    keep a 16-bit copy of every gathered weight.

    ZeRO stages map onto FSDP2's reshard settings as closely as it allows (FSDP2 always
    shards weights, gradients and optimizer states between steps):

    * 3: ``reshard_after_forward=True``: weights are gathered again for backward (ZeRO-3);
    * 2: ``reshard_after_forward=False``: weights stay gathered from forward to backward,
      gradients are reduce-scattered every micro-batch (ZeRO-2's communication pattern);
    * 1: as 2, and gradients are only reduce-scattered after the last micro-batch
      (``set_requires_gradient_sync``), so full gradients accumulate as in ZeRO-1.

    ``ignored`` parameters (the MoE layers') stay whole and out of FSDP's reductions.
    """
    options = {
        "ignored_params": ignored,
        "mesh": dp_mesh,
        "reshard_after_forward": zero_stage >= 3,
        "mp_policy": MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32),
    }
    for name, block in module.layers.items():
        module.layers[name] = fully_shard(block, **options)
    fully_shard(module, **options)


def apply_ddp(module: nn.Module, dp_mesh: DeviceMesh) -> nn.Module:
    """DDP over the data-parallel ranks: bucketed all-reduces overlapped with backward,
    gradients as views of the buckets (no copy). The weights are identical by construction,
    so no initial broadcast.

    Only for plain data parallelism: DDP does not take DTensor (tensor-parallel) weights,
    and under a pipeline schedule its bucket rebuilding asserts after the first step's
    several backward passes (torch 2.13); those layouts use :func:`allreduce_gradients`."""
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(
        module,
        process_group=dp_mesh.get_group(),
        broadcast_buffers=False,
        gradient_as_bucket_view=True,
        init_sync=False,
    )


@contextlib.contextmanager
def no_gradient_sync(module: nn.Module) -> Iterator[None]:
    """Accumulate gradients inside without the data-parallel reduction (DDP's ``no_sync``,
    FSDP2's ``set_requires_gradient_sync(False)``); the next backward outside reduces."""
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(module, DistributedDataParallel):
        with module.no_sync():
            yield
    elif isinstance(module, FSDPModule):
        module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            module.set_requires_gradient_sync(True)
    else:
        yield


def allreduce_gradients(
    params: list[torch.Tensor],
    group: dist.ProcessGroup,
    bucket_bytes: int = 64 * 2**20,
    divisor: int | None = None,
) -> None:
    """Average gradients over ``group`` after backward (or sum them and divide by
    ``divisor``): DDP's result for the tensor-parallel layouts DDP cannot wrap. Gradients are
    packed into flat buckets so a few large all-reduces replace many small."""
    world = divisor or dist.get_world_size(group)
    grads = [_local(p.grad) for p in params if p.grad is not None]
    for bucket in _buckets(grads, bucket_bytes):
        flat = torch.cat([g.reshape(-1) for g in bucket])
        dist.all_reduce(flat, group=group)
        flat /= world
        offset = 0
        for grad in bucket:
            grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
            offset += grad.numel()


def align_gradients(params: list[torch.Tensor]) -> None:
    """Give each DTensor gradient its parameter's placements.

    DTensor's embedding backward returns a replicated gradient for a vocabulary-sharded
    table; left alone it keeps a full table per rank and cannot be reduced element-wise
    against the last stage's sharded copy of a tied embedding.
    """
    for param in params:
        grad = param.grad
        if grad is not None and hasattr(grad, "placements") and grad.placements != param.placements:
            param.grad = grad.redistribute(param.device_mesh, param.placements)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _buckets(tensors: list[torch.Tensor], bucket_bytes: int) -> Iterable[list[torch.Tensor]]:
    bucket: list[torch.Tensor] = []
    size = 0
    for tensor in tensors:
        if bucket and (size + tensor.nbytes > bucket_bytes or tensor.dtype != bucket[0].dtype):
            yield bucket
            bucket, size = [], 0
        bucket.append(tensor)
        size += tensor.nbytes
    if bucket:
        yield bucket


def tied_embedding_group(mesh: DeviceMesh, spec: ModelSpec) -> dist.ProcessGroup | None:
    """The two ranks (first and last pipeline stage, same dp, cp and tp coordinates) that hold a
    copy of a tied embedding, as Megatron's "embedding group"; ``None`` when not needed.

    With two stages that is the pipeline group itself. (A new group over the same ranks
    would get the same hashed name as the mesh's and their connections would cross.)
    """
    pp = mesh["pp"].size()
    if not spec.tied_embeddings or pp == 1:
        return None
    pp_rank = mesh["pp"].get_local_rank()
    if pp_rank not in (0, pp - 1):
        return None
    if pp == 2:
        return mesh["pp"].get_group()
    inner = tuple(mesh[name].get_local_rank() for name in ("dp", "cp", "tp"))
    ranks = [int(mesh.mesh[(0, *inner)]), int(mesh.mesh[(pp - 1, *inner)])]
    return dist.new_group(ranks, use_local_synchronization=True)


def sum_tied_embedding_grads(stages: list[Transformer], group: dist.ProcessGroup) -> None:
    """Sum the gradient of the tied embedding's two copies (first and last stage)."""
    for stage in stages:
        for part in (stage.embed.tok if stage.embed is not None else None, stage.output):
            if part is not None and part.weight.grad is not None:
                dist.all_reduce(_local(part.weight.grad), group=group)


def build_schedule(
    modules: list[nn.Module],
    ids: list[int],
    layout: ParallelLayout,
    pp_group: dist.ProcessGroup,
    device: torch.device,
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    schedule: str,
):
    """Wrap this rank's stage modules in ``PipelineStage``s and the schedule
    :func:`schedule_used` names. ``layout.gas`` micro-batches; the schedule divides
    gradients by it (``scale_grads``), matching a loss that is the mean over each
    micro-batch."""
    num_stages = layout.pp * layout.vpp
    stages = [
        PipelineStage(module, stage_id, num_stages, device, group=pp_group)
        for module, stage_id in zip(modules, ids, strict=True)
    ]
    name = schedule_used(layout, schedule)
    if name == "interleaved1f1b":
        return ScheduleInterleaved1F1B(stages, layout.gas, loss_fn=loss)
    cls = Schedule1F1B if name == "1f1b" else ScheduleGPipe
    return cls(stages[0], layout.gas, loss_fn=loss)


def schedule_used(layout: ParallelLayout, requested: str) -> str | None:
    """The pipeline schedule a layout runs: none without pipelining, interleaved 1F1B with
    virtual stages, else the requested one, except that 1F1B with fewer micro-batches than
    stages (which torch refuses) is GPipe: with no steady state the two are the same
    sequence (every forward, then every backward)."""
    if requested not in SCHEDULES:
        raise TrainerError(f"trainer.schedule must be one of {list(SCHEDULES)}, got {requested!r}")
    if layout.pp == 1:
        return None
    if layout.vpp > 1:
        return "interleaved1f1b"
    if requested == "1f1b" and layout.gas < layout.pp:
        return "gpipe"
    return requested
