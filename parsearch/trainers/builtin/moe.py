"""The mixture-of-experts FFN of the layers ``model.moe.is_moe_layer(i)`` names.

A linear router scores the ``E`` experts, a softmax and top-``k`` pick ``k`` of them per
token with their probabilities renormalised to sum to one (Mixtral's and Megatron-core's
``--moe-router-topk`` with pre-softmax scores); each routed expert is a SwiGLU of width
``expert_ffn_hidden_size``; a shared SwiGLU of width ``shared_expert_ffn_hidden_size``
(DeepSeek's) adds to the routed output. Routing is dropless: every expert takes every token
sent to it (``capacity_factor`` must be left out; the trainer refuses a capacity).

The load-balancing loss is Switch/GShard's ``coeff · E · Σ_i f_i · P_i`` (``f_i`` the
fraction of the ``k·T`` assignments that go to expert ``i``, ``P_i`` its mean router
probability), taken per sequence and averaged over sequences, as DeepSeek-V3's sequence-wise
balance loss: a per-sequence mean is what a data-parallel, micro-batched or context-parallel
run can sum exactly, so every layout trains the model one process trains. Its gradient is
attached to the layer's output (Megatron-core's ``MoEAuxLossAutoScaler``), which works
inside pipeline stages; the reported loss stays the language-model loss, and the balance
loss (summed over the layers) is reported apart, as Megatron logs it.

Without an :class:`~parsearch.trainers.builtin.expert_parallel.ExpertComm` one process holds
every expert; with one, tokens travel to the ``ep`` ranks holding their experts by
all-to-all and come back.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from parsearch.config import ModelSpec
from parsearch.trainers.builtin.expert_parallel import (
    AllToAll,
    ExpertComm,
    GatherSequence,
    SplitSequence,
)

BALANCE_COEFF = 1e-2


class SwiGLU(nn.Module):
    """``w2(silu(w1 x) * w3 x)`` without biases: the shared experts."""

    def __init__(self, hidden: int, width: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden, width, bias=False)
        self.w3 = nn.Linear(hidden, width, bias=False)
        self.w2 = nn.Linear(width, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Experts(nn.Module):
    """``count`` SwiGLU experts, global indices ``first ..``, their weights stacked as
    ``[expert, out, in]`` (one ``nn.Linear`` weight each) so an EP rank's share is one slice
    and :func:`~parsearch.trainers.builtin.model.init_weights` can give each expert the
    value it has in any split."""

    def __init__(self, count: int, hidden: int, width: int, first: int = 0) -> None:
        super().__init__()
        self.first = first
        self.w1 = nn.Parameter(torch.empty(count, width, hidden))
        self.w3 = nn.Parameter(torch.empty(count, width, hidden))
        self.w2 = nn.Parameter(torch.empty(count, hidden, width))

    def forward(self, rows: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """``rows`` grouped by expert, ``counts[e]`` rows for local expert ``e``."""
        outs = [
            F.linear(F.silu(F.linear(part, self.w1[e])) * F.linear(part, self.w3[e]), self.w2[e])
            for e, part in enumerate(rows.split(counts))
        ]
        return torch.cat(outs)


class _AttachLoss(torch.autograd.Function):
    """Identity on ``out`` whose backward also gives ``loss`` the gradient ``scale``: the
    balance loss joins the objective wherever the layer runs (a pipeline stage too). The
    backward also appends the loss to ``record``: it runs once per micro-batch, where a
    recomputed forward runs twice."""

    @staticmethod
    def forward(ctx, out, loss, scale, record):  # type: ignore[override]
        ctx.scale, ctx.record = scale, record
        ctx.save_for_backward(loss)
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        (loss,) = ctx.saved_tensors
        ctx.record.append(loss.detach())
        return grad, torch.full_like(loss, ctx.scale), None, None


class MoE(nn.Module):
    """Router, routed experts and shared experts of one layer, in place of the FFN."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        moe = spec.moe
        assert moe is not None
        self.num_experts, self.top_k = moe.num_experts, moe.top_k
        self.router = nn.Linear(spec.hidden_size, moe.num_experts, bias=False)
        self.experts = Experts(moe.num_experts, spec.hidden_size, moe.expert_ffn_hidden_size)
        width = moe.shared_expert_ffn_hidden_size
        self.shared = SwiGLU(spec.hidden_size, width) if width else None
        self.comm: ExpertComm | None = None
        # The balance loss's gradient: 1, or 1/gas where the trainer scales the loss itself
        # rather than letting a pipeline schedule scale the gradients.
        self.loss_scale = 1.0
        # This rank's share of the balance loss of each micro-batch trained since it was
        # last emptied (see _AttachLoss).
        self.balance_record: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        comm = self.comm
        if hasattr(x, "to_local"):  # sequence parallel: this tp rank's slice, as a DTensor
            x = x.to_local()
        split = comm is not None and comm.split_tp
        if split:
            x = SplitSequence.apply(x, comm.tp_group)
        batch, seq, hidden = x.shape
        tokens = x.reshape(-1, hidden)
        probs = self.router(tokens).float().softmax(dim=-1)
        top, chosen = probs.topk(self.top_k, dim=-1)
        weights = (top / top.sum(dim=-1, keepdim=True)).to(x.dtype)
        balance = self._balance_loss(probs.view(batch, seq, -1), chosen.view(batch, seq, -1))
        out = self._route(tokens, chosen, weights).view_as(x)
        if self.shared is not None:
            out = out + self.shared(x)
        out = _AttachLoss.apply(out, balance, self.loss_scale, self.balance_record)
        return GatherSequence.apply(out, comm.tp_group) if split else out

    def _balance_loss(self, probs: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        """This rank's share of the mean per-sequence balance loss. Each sequence's counts are
        summed over the ranks holding its pieces (``sequence_group``); its probabilities are
        this rank's, over its cp share of the sequence, so the shares sum over tp and average
        over cp to the loss of whole sequences."""
        counts = F.one_hot(chosen, self.num_experts).sum(dim=(1, 2)).float()
        pieces, cp = 1, 1
        if self.comm is not None:
            dist.all_reduce(counts, group=self.comm.sequence_group)
            pieces, cp = dist.get_world_size(self.comm.sequence_group), self.comm.cp
        length = probs.shape[1] * pieces  # the whole sequence
        fraction = counts / (self.top_k * length)
        mean_prob = probs.sum(dim=1) / (length / cp)
        return BALANCE_COEFF * self.num_experts * (fraction * mean_prob).sum(dim=-1).mean()

    def _route(
        self, tokens: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        """Each token through its ``k`` experts, weighted and summed: assignments sorted by
        expert, run (here or on their experts' ranks), scattered back by token."""
        flat = chosen.reshape(-1)
        order = flat.argsort(stable=True)
        source = order // self.top_k
        per_expert = torch.bincount(flat, minlength=self.num_experts)
        rows = tokens[source]
        if self.comm is None or self.comm.ep == 1:
            out = self.experts(rows, per_expert.tolist())
        else:
            out = self._exchange(rows, per_expert)
        out = out * weights.reshape(-1)[order].unsqueeze(-1)
        # In the experts' dtype: bf16 under autocast, where the tokens may be fp32.
        return out.new_zeros(tokens.shape).index_add(0, source, out)

    def _exchange(self, rows: torch.Tensor, per_expert: torch.Tensor) -> torch.Tensor:
        """Rows (sorted by expert) to the EP ranks holding their experts, through the local
        experts there, and back. Counts go first, so every rank knows how many rows it gets
        from each peer for each of its experts."""
        comm = self.comm
        assert comm is not None
        sent = per_expert.view(comm.ep, -1)  # [destination rank, its local expert]
        got = torch.empty_like(sent)  # [source rank, my local expert]
        dist.all_to_all_single(got, sent, group=comm.ep_group)
        sent_splits, got_splits = sent.sum(dim=1).tolist(), got.sum(dim=1).tolist()
        arrived = AllToAll.apply(rows, got_splits, sent_splits, comm.ep_group)
        # Arrived rows are grouped by source, then expert: regroup them by expert.
        chunks = torch.arange(arrived.shape[0], device=rows.device).split(got.flatten().tolist())
        local = got.shape[1]
        by_expert = torch.cat(
            [chunks[source * local + e] for e in range(local) for source in range(comm.ep)]
        )
        out = self.experts(arrived[by_expert], got.sum(dim=0).tolist())
        out = out[by_expert.argsort()]
        return AllToAll.apply(out, sent_splits, got_splits, comm.ep_group)
