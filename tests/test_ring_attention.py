"""Ring attention alone against full causal attention: each CP rank's output and the
gradients of its queries, keys and values equal the matching rows of one process's.

The ranks are spawned processes on gloo (one thread each); every rank builds the same full
tensors from a seed and keeps its two chunks, so the reference needs no communication.
"""

from __future__ import annotations

import multiprocessing
import socket

import pytest
import torch

from parsearch.trainers.builtin.model import CausalCore
from parsearch.trainers.builtin.ring_attention import RingCore, chunk_positions

pytestmark = pytest.mark.multiprocess

BATCH, SEQ, HEADS, KV_HEADS, HEAD_DIM = 2, 24, 4, 2, 8


def _full_inputs() -> tuple[torch.Tensor, ...]:
    """q, k, v (``[batch, seq, heads, dim]``, GQA: fewer K/V heads) and the weights of the
    scalar loss ``sum(out * weights)``."""
    generator = torch.Generator().manual_seed(3)
    shapes = [
        (BATCH, SEQ, HEADS, HEAD_DIM),
        (BATCH, SEQ, KV_HEADS, HEAD_DIM),
        (BATCH, SEQ, KV_HEADS, HEAD_DIM),
        (BATCH, SEQ, HEADS, HEAD_DIM),
    ]
    return tuple(torch.randn(shape, generator=generator) for shape in shapes)


def _attend(core: torch.nn.Module, q, k, v, weights) -> list[torch.Tensor]:
    """The output and the gradients of q, k, v of ``sum(core(q, k, v) * weights)``."""
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = core(q, k, v)
    (out * weights).sum().backward()
    return [out.detach(), q.grad, k.grad, v.grad]


def _rank(rank: int, world: int, port: int, results) -> None:
    torch.set_num_threads(1)
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        q, k, v, weights = _full_inputs()
        expected = _attend(CausalCore(), q, k, v, weights)
        held = chunk_positions(SEQ, world, rank)
        ring = RingCore(torch.distributed.group.WORLD)
        got = _attend(ring, *(t[:, held] for t in (q, k, v, weights)))
        errors = [(g - e[:, held]).abs().max().item() for g, e in zip(got, expected, strict=True)]
        results.put((rank, errors))
    finally:
        torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_chunks_pair_the_ends_of_the_sequence():
    assert chunk_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert chunk_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    every = torch.cat([chunk_positions(24, 3, r) for r in range(3)])
    assert sorted(every.tolist()) == list(range(24))


@pytest.mark.parametrize("world", [2, 3])
def test_ring_attention_matches_full_causal_attention(world, monkeypatch):
    """Forward and backward, GQA included; with 3 ranks K/V and their gradients travel
    more than one hop, and each rank meets ranks both before and after it."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = _free_port()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    ranks = [context.Process(target=_rank, args=(r, world, port, results)) for r in range(world)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(timeout=120)
    assert [p.exitcode for p in ranks] == [0] * world
    errors = dict(results.get(timeout=5) for _ in range(world))
    for rank, (out, dq, dk, dv) in sorted(errors.items()):
        assert max(out, dq, dk, dv) < 1e-5, (rank, "out, dq, dk, dv errors", out, dq, dk, dv)
