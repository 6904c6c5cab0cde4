"""Expert parallelism's communication: the differentiable all-to-all that carries tokens to
their experts' ranks and back, the split of tensor-parallel copies of tokens among the tp
ranks, and the process groups of Megatron-core's "parallel folding".

Folding: per pipeline stage the experts' ``etp·ep·edp`` ranks are the attention's
``tp·cp·dp`` ranks in the same order (tp innermost, then cp, then dp), so EP rank ``j % ep``
and expert-data-parallel rank ``j // ep`` of the stage's ``j``-th rank. Only ``etp = 1`` is
run here (:mod:`parsearch.trainers.builtin.trainer` refuses more).

Everything uses ``torch.distributed`` calls that gloo (CPU) and NCCL (CUDA) both have.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from parsearch.config import ParallelLayout


class AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with uneven splits whose backward is the reverse exchange: the
    gradient of each received row goes back to the rank that sent it."""

    @staticmethod
    def forward(ctx, rows, received_splits, sent_splits, group):  # type: ignore[override]
        ctx.splits, ctx.group = (received_splits, sent_splits), group
        out = rows.new_empty((sum(received_splits), *rows.shape[1:]))
        dist.all_to_all_single(out, rows.contiguous(), received_splits, sent_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        received_splits, sent_splits = ctx.splits
        back = grad.new_empty((sum(sent_splits), *grad.shape[1:]))
        dist.all_to_all_single(
            back, grad.contiguous(), sent_splits, received_splits, group=ctx.group
        )
        return back, None, None, None


class SplitSequence(torch.autograd.Function):
    """Keep this tp rank's slice of a sequence that every tp rank holds whole (dim 1). Its
    gradient is every rank's slice gathered, so the copies' gradients stay identical."""

    @staticmethod
    def forward(ctx, x, group):  # type: ignore[override]
        ctx.group = group
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        return x.chunk(size, dim=1)[rank].contiguous()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return _gather_sequence(grad, ctx.group), None


class GatherSequence(torch.autograd.Function):
    """The inverse of :class:`SplitSequence`: every rank's slice gathered whole; the gradient
    (whole and identical on every tp rank) is cut back to this rank's slice."""

    @staticmethod
    def forward(ctx, x, group):  # type: ignore[override]
        ctx.group = group
        return _gather_sequence(x, group)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        size, rank = dist.get_world_size(ctx.group), dist.get_rank(ctx.group)
        return grad.chunk(size, dim=1)[rank].contiguous(), None


def _gather_sequence(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=1)


@dataclass(frozen=True)
class ExpertComm:
    """Where one stage's MoE layers find their experts and peers.

    ``ep_group``: the ``ep`` ranks whose experts together are all ``E`` (this rank holds
    ``E/ep`` of them, from ``ep_rank·E/ep``). ``edp_group``: the ranks holding the same experts,
    over which expert gradients are summed. ``stage_group``: all ``tp·cp·dp`` ranks of the
    stage, over which the replicated router and shared experts' gradients are summed.
    ``sequence_group``: the ``tp·cp`` ranks holding pieces of the same sequences, over which
    the balance loss counts its tokens. ``split_tp``: tokens arrive whole on every tp rank
    (tensor parallelism without sequence parallelism) and each rank routes its ``1/tp``."""

    ep: int
    ep_rank: int
    ep_group: dist.ProcessGroup
    edp_group: dist.ProcessGroup
    stage_group: dist.ProcessGroup
    sequence_group: dist.ProcessGroup
    tp_group: dist.ProcessGroup
    split_tp: bool
    cp: int
    # Gradients of every MoE parameter are summed over its group, then divided by this (dp·cp)
    # as the dense gradients are averaged over dp·cp.
    replicas: int


def expert_comm(mesh: DeviceMesh, layout: ParallelLayout) -> ExpertComm:
    """The expert groups of this rank, built by every rank of ``mesh`` (a collective)."""
    ranks = mesh.mesh  # (pp, dp, cp, tp): row-major flattening is Megatron's tp-cp-dp order
    inner = layout.dp * layout.cp * layout.tp
    stages = ranks.reshape(layout.pp, inner)
    by_ep = stages.reshape(layout.pp, inner // layout.ep, layout.ep)
    here = int(dist.get_rank())
    position = int((stages == here).nonzero()[0, 1])
    return ExpertComm(
        ep=layout.ep,
        ep_rank=position % layout.ep,
        ep_group=_own_group(by_ep.reshape(-1, layout.ep)),
        edp_group=_own_group(by_ep.transpose(1, 2).reshape(-1, inner // layout.ep)),
        stage_group=_own_group(stages),
        sequence_group=_own_group(ranks.reshape(-1, layout.cp * layout.tp)),
        tp_group=mesh["tp"].get_group(),
        split_tp=layout.tp > 1 and not layout.sequence_parallel,
        cp=layout.cp,
        replicas=layout.dp * layout.cp,
    )


def _own_group(rows: torch.Tensor) -> dist.ProcessGroup:
    """This rank's group among ``rows`` (one group of ranks a row). Every rank creates every
    group, in the same order, as ``new_group`` requires; names are then unique counters, so
    a group over the same ranks as a mesh's does not cross its connections."""
    here, mine = dist.get_rank(), None
    for row in rows.tolist():
        group = dist.new_group(row)
        if here in row:
            mine = group
    assert mine is not None, (here, rows)
    return mine
