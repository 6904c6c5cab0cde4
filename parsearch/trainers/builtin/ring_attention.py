"""Context parallelism's attention: load-balanced causal ring attention over a CP group.

The sequence is cut into ``2*cp`` chunks and CP rank ``i`` holds chunks ``i`` and
``2*cp-1-i`` (Megatron-core's and torchtitan's split), so under the causal mask every rank
does the same work. K/V travel around the ring with point-to-point send/recv (one
``batch_isend_irecv`` a step, overlapped with the block being computed); each rank merges
the blocks of its queries by their log-sum-exp (the online softmax). Backward runs the ring
again: K/V travel as in forward and the gradients of K/V travel with them, so after ``cp``
steps each rank holds the gradient of its own K/V.

Written here because torch's experimental ``context_parallel`` has no sharding rule for the
CPU attention kernels; this module uses only ``torch.distributed`` point-to-point calls, so
it runs on gloo (CPU tensors) and NCCL (CUDA tensors) alike. Each block is a fused attention
kernel that returns its log-sum-exp: the CPU flash kernel, or memory-efficient attention on
CUDA (the kernels torch's own ring attention calls), so no ``seq²`` scores are kept.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

aten = torch.ops.aten


def chunk_positions(seq_length: int, cp: int, cp_rank: int) -> torch.Tensor:
    """The token positions CP rank ``cp_rank`` holds, ascending: chunks ``cp_rank`` and
    ``2*cp-1-cp_rank`` of ``2*cp`` equal chunks (``seq_length % (2*cp) == 0``, a layout
    rule)."""
    chunk = seq_length // (2 * cp)
    first = torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk)
    second = torch.arange((2 * cp - 1 - cp_rank) * chunk, (2 * cp - cp_rank) * chunk)
    return torch.cat([first, second])


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """One block: the attention output of ``q`` over ``k, v`` (``[batch, heads, seq, dim]``,
    K/V already repeated to the query heads) and its log-sum-exp ``[batch, heads, seq]``."""
    if q.device.type == "cpu":
        return aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)
    out, lse, _, _ = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, causal)
    return out, lse[..., : q.shape[2]]


def _attend_backward(
    grad: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of one block given the *merged* output and log-sum-exp of its queries:
    ``P = exp(S - lse)`` is then the block's share of the full softmax, and the kernel's
    ``rowsum(grad * out)`` term the full one, so the block gradients sum to the exact ones."""
    if q.device.type == "cpu":
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad, q, k, v, out, lse, 0.0, causal
        )
    # The dropout RNG state, unused without dropout (the forward returns it empty).
    empty = torch.empty((), dtype=torch.int64, device=q.device)
    dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
        grad, q, k, v, None, out, lse, empty, empty, 0.0, [True, True, True, False], causal
    )
    return dq, dk, dv


def _repeat_heads(t: torch.Tensor, groups: int) -> torch.Tensor:
    """K/V heads shared by ``groups`` query heads each (grouped-query attention)."""
    return t if groups == 1 else t.repeat_interleave(groups, dim=1)


def _sum_heads(t: torch.Tensor, groups: int) -> torch.Tensor:
    """The gradient of :func:`_repeat_heads`: sum over the query heads sharing a K/V head."""
    return t if groups == 1 else t.unflatten(1, (-1, groups)).sum(2)


def _merge(
    out: torch.Tensor, lse: torch.Tensor, block: torch.Tensor, block_lse: torch.Tensor
) -> None:
    """Fold one block's output and log-sum-exp into the running ones of the same query rows
    (fp32 views, updated in place): each side weighted by its share of the merged softmax
    denominator. A running ``lse`` of ``-inf`` (nothing seen yet) takes the block as is."""
    merged = torch.logaddexp(lse, block_lse)
    out.mul_((lse - merged).exp().unsqueeze(-1))
    out.add_(block.float() * (block_lse - merged).exp().unsqueeze(-1))
    lse.copy_(merged)


class _Ring:
    """This rank's neighbours in the CP group, and one step of passing a tensor on."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.size)
        self.prev = dist.get_global_rank(group, (self.rank - 1) % self.size)

    def pass_on(self, tensor: torch.Tensor) -> tuple[torch.Tensor, list[Any]]:
        """Send ``tensor`` to the next rank and receive the previous rank's into a new
        buffer; returns the buffer and the requests to wait on before reading it."""
        received = torch.empty_like(tensor)
        ops = [
            dist.P2POp(dist.isend, tensor, self.next, self.group),
            dist.P2POp(dist.irecv, received, self.prev, self.group),
        ]
        return received, dist.batch_isend_irecv(ops)

    def blocks(self, step: int, half: int) -> tuple[slice, slice, bool]:
        """Which query rows and K/V columns of the local halves meet at ``step`` (this rank
        then holds the K/V of rank ``rank - step``), and whether the block is causal.

        Step 0 is the rank's own K/V: causal, since its positions ascend. From a rank
        before it, only that rank's first chunk is earlier than both local chunks and its
        second chunk later than both: all queries, the first K/V half. From a rank after it,
        both its chunks lie between the local two: the second query half, all K/V."""
        everything = slice(None)
        if step == 0:
            return everything, everything, True
        if (self.rank - step) % self.size < self.rank:
            return everything, slice(0, half), False
        return slice(half, None), everything, False


class RingAttention(torch.autograd.Function):
    """Causal attention of this rank's queries over the whole sequence's keys and values,
    ``[batch, heads, local_seq, head_dim]`` each (fewer K/V heads under GQA)."""

    @staticmethod
    def forward(ctx, q, k, v, group):  # type: ignore[override]
        ring = _Ring(group)
        groups = q.shape[1] // k.shape[1]
        half = q.shape[2] // 2
        out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        lse = torch.full(q.shape[:3], float("-inf"), dtype=torch.float32, device=q.device)
        kv = torch.stack([k, v])
        for step in range(ring.size):
            pending = ring.pass_on(kv) if step + 1 < ring.size else None
            rows, cols, causal = ring.blocks(step, half)
            keys, values = (_repeat_heads(t[:, :, cols], groups) for t in kv)
            block, block_lse = _attend(q[:, :, rows], keys, values, causal)
            _merge(out[:, :, rows], lse[:, :, rows], block, block_lse)
            if pending is not None:
                for request in pending[1]:
                    request.wait()
                kv = pending[0]
        out = out.to(q.dtype)
        ctx.group = group
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        ring = _Ring(ctx.group)
        groups = q.shape[1] // k.shape[1]
        half = q.shape[2] // 2
        grad = grad.contiguous()
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        kv = torch.stack([k, v])
        dkv = torch.zeros(kv.shape, dtype=torch.float32, device=q.device)
        for step in range(ring.size):
            pending = ring.pass_on(kv) if step + 1 < ring.size else None
            rows, cols, causal = ring.blocks(step, half)
            keys, values = (_repeat_heads(t[:, :, cols], groups) for t in kv)
            dq_block, dk_block, dv_block = _attend_backward(
                grad[:, :, rows],
                q[:, :, rows],
                keys,
                values,
                out[:, :, rows],
                lse[:, :, rows].contiguous(),
                causal,
            )
            dq[:, :, rows] += dq_block
            dkv[0][:, :, cols] += _sum_heads(dk_block, groups)
            dkv[1][:, :, cols] += _sum_heads(dv_block, groups)
            # The K/V gradient travels with the K/V it belongs to; the last pass brings
            # each rank the gradient of its own.
            received, requests = ring.pass_on(dkv)
            if pending is not None:
                requests = requests + pending[1]
            for request in requests:
                request.wait()
            dkv = received
            if pending is not None:
                kv = pending[0]
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None


class RingCore(nn.Module):
    """Drop-in for :class:`~parsearch.trainers.builtin.model.CausalCore` under context
    parallelism: same ``[batch, seq, heads, head_dim]`` tensors in and out, the sequence
    being this rank's two chunks."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        super().__init__()
        self.group = group

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        return RingAttention.apply(q, k, v, self.group).transpose(1, 2)
