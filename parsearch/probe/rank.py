"""``python -m parsearch.probe.rank --spec spec.json --out result.json``: one rank of a probe.

Started by the node agent like a trainer's rank (same environment, same process group
set-up). Every rank runs the same :class:`~parsearch.probe.plan.ProbePlan` at the same time,
as the ranks of a training step would:

1. **a transformer layer's work** at each (tp, micro-batch) shape: one rank's shard of the
   layer (Q/K/V and the MLP's first matmul split over TP, their partners' inner dimension
   split), forward and backward, in the space's precision; efficiency = the estimate's
   FLOPs for that shard / time / peak. With TP, also one layer of the built-in trainer
   under its own TP plan (DTensor, its four all-reduces in place): the difference is what
   TP costs *in situ*, between compute and with the framework's overhead (on an
   oversubscribed CPU far more than the all-reduces back to back);
2. **collectives** (all-reduce, all-gather, reduce-scatter) over each group pattern, all
   groups at once, at each message size; the slowest rank's mean time;
3. **point-to-point** transfers between ranks half the world apart;
4. **the memory baseline**: on GPUs what the device holds besides torch's tensors (context,
   communicator buffers) and the caching allocator's reserve; on the CPU the built-in
   trainer reports tensor bytes, so the baseline is zero (the process's RSS is recorded).

Rank 0 writes every timing into ``metrics["probe"]`` of its result; the driver fits them.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from parsearch.config import ModelSpec
from parsearch.estimate.flops import flops_breakdown
from parsearch.probe.plan import GroupPattern, ProbePlan
from parsearch.result import TrialResult, TrialState
from parsearch.trainers.builtin.__main__ import exit_after, write_result
from parsearch.trainers.builtin.env import RankEnv
from parsearch.trainers.builtin.memory import peak_rss_bytes
from parsearch.trainers.builtin.trainer import process_group
from parsearch.trial import TrialSpec

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def layer_shard(model: ModelSpec, tp: int, mbs: int, dtype: torch.dtype, device: torch.device):
    """A closure running forward and backward of one TP rank's shard of a layer, without
    communication: its matmuls, attention and elementwise work at this shape."""
    h, hd = model.hidden_size, model.head_dim
    heads, kv = model.num_heads // tp, model.kv_heads // tp
    ffn = model.ffn // tp
    gated = model.arch == "llama"

    def weight(rows: int, cols: int) -> torch.Tensor:
        return (torch.randn(rows, cols, device=device) / rows**0.5).to(dtype).requires_grad_()

    w_qkv, w_out = weight(h, (heads + 2 * kv) * hd), weight(heads * hd, h)
    w_in, w_down = weight(h, ffn * (2 if gated else 1)), weight(ffn, h)
    x = torch.randn(mbs, model.seq_length, h, device=device, dtype=dtype, requires_grad=True)

    def step() -> None:
        y = F.layer_norm(x, (h,))
        q, k, v = (y @ w_qkv).split([heads * hd, kv * hd, kv * hd], dim=-1)
        shape = (mbs, model.seq_length, -1, hd)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        if kv != heads:
            k = k.repeat_interleave(heads // kv, dim=1)
            v = v.repeat_interleave(heads // kv, dim=1)
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x2 = x + attention.transpose(1, 2).reshape(mbs, model.seq_length, -1) @ w_out
        z = F.layer_norm(x2, (h,)) @ w_in
        if gated:
            gate, up = z.chunk(2, dim=-1)
            z = F.silu(gate) * up
        else:
            z = F.gelu(z)
        out = x2 + z @ w_down
        out.sum().backward()

    return step


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(run, device: torch.device, plan: ProbePlan) -> float:
    """Mean seconds of ``run()``, every rank starting together and repeating as often as the
    slowest rank's first call allows within ``plan.min_time_s``; the slowest rank's mean."""
    for _ in range(plan.repeats["warmup"]):
        run()
    _sync(device)
    began = time.perf_counter()
    run()
    _sync(device)
    first = torch.tensor([time.perf_counter() - began], dtype=torch.float64)
    dist.all_reduce(first, op=dist.ReduceOp.MAX)
    count = int(max(1, min(plan.repeats["max"], plan.min_time_s / max(first.item(), 1e-6))))
    dist.barrier()
    began = time.perf_counter()
    for _ in range(count):
        run()
    _sync(device)
    mean = torch.tensor([(time.perf_counter() - began) / count], dtype=torch.float64)
    dist.all_reduce(mean, op=dist.ReduceOp.MAX)
    return float(mean.item())


def probe_gemm(spec: TrialSpec, plan: ProbePlan, device: torch.device) -> list[dict[str, float]]:
    """Each shape timed once per round, ``plan.rounds`` rounds over all shapes, and the
    median kept: other work on a shared machine then spreads over every shape instead of
    landing on one."""
    dtype = _DTYPES[plan.precision]
    steps = {}
    for tp, mbs in plan.gemm_shapes:
        steps[(tp, mbs, False)] = layer_shard(spec.model, tp, mbs, dtype, device)
        if tp > 1:
            steps[(tp, mbs, True)] = trainer_block(spec.model, tp, mbs, plan.precision, device)
    rounds = [
        {key: timed(step, device, plan) for key, step in steps.items()} for _ in range(plan.rounds)
    ]
    points = []
    for tp, mbs in plan.gemm_shapes:
        per_mb = flops_breakdown(spec.model, mbs, "none")
        flops = (per_mb["matmul"] + per_mb["attention"]) / spec.model.num_layers / tp
        seconds = statistics.median(times[(tp, mbs, False)] for times in rounds)
        point = {
            "tp": tp,
            "mbs": mbs,
            "seq": spec.model.seq_length,
            "seconds": seconds,
            "efficiency": flops / seconds / plan.peak_flops_per_device,
        }
        if tp > 1:
            # Paired within each round (same load), then the median: a difference of two
            # separately noisy figures would be noisier.
            extra = [times[(tp, mbs, True)] - times[(tp, mbs, False)] for times in rounds]
            point["with_tp_seconds"] = seconds + statistics.median(extra)
        points.append(point)
        print(f"probe: layer tp={tp} mbs={mbs}: {seconds * 1e3:.2f} ms", flush=True)
    return points


def trainer_block(model: ModelSpec, tp: int, mbs: int, precision: str, device: torch.device):
    """A closure running forward and backward of one layer of the built-in trainer under its
    own TP plan (DTensor, all-reduces in place) on this rank's TP group: what a TP layer
    costs in training, the framework's overhead included."""
    from torch.distributed.device_mesh import init_device_mesh

    from parsearch.trainers.builtin.model import Transformer, materialize
    from parsearch.trainers.builtin.parallelize import apply_tp

    world = dist.get_world_size()
    mesh = init_device_mesh(device.type, (world // tp, tp), mesh_dim_names=("dp", "tp"))
    with torch.device("meta"):
        whole = Transformer(dataclasses.replace(model, num_layers=1))
    apply_tp(whole, mesh["tp"], False)
    materialize(whole, device, 0)
    block, rotary = whole.layers["0"], whole.rotary
    x = torch.randn(mbs, model.seq_length, model.hidden_size, device=device, requires_grad=True)
    half = _DTYPES[precision] if precision != "fp32" else None

    def step() -> None:
        with torch.autocast(device.type, dtype=half, enabled=half is not None):
            out = block(x, rotary)
        out.float().sum().backward()

    return step


def _collective(op: str, size_bytes: int, group_size: int, dtype, device, group):
    element = torch.tensor([], dtype=dtype).element_size()
    count = max(group_size, size_bytes // element // group_size * group_size)
    full = torch.ones(count, dtype=dtype, device=device)
    shard = torch.ones(count // group_size, dtype=dtype, device=device)
    if op == "all-reduce":
        return lambda: dist.all_reduce(full, group=group)
    if op == "all-gather":
        return lambda: dist.all_gather_into_tensor(full, shard, group=group)
    return lambda: dist.reduce_scatter_tensor(shard, full, group=group)


def probe_pattern(pattern: GroupPattern, plan: ProbePlan, world: int, device) -> list[dict]:
    """Time each op of ``pattern`` over all its groups at once; an op the communication
    backend lacks (gloo's reduce-scatter in some builds) is left out."""
    dtype = _DTYPES[plan.precision]
    mine = None
    for ranks in pattern.groups(world):
        group = dist.new_group(ranks)
        if dist.get_rank() in ranks:
            mine = group
    fits = []
    for op in pattern.ops:
        try:
            runs = [
                _collective(op, size, pattern.size, dtype, device, mine) for size in pattern.sizes
            ]
            rounds = [
                [timed(run, device, plan) for run in runs] for _ in range(plan.collective_rounds)
            ]
            times = [statistics.median(column) for column in zip(*rounds, strict=True)]
        except (RuntimeError, NotImplementedError) as error:
            print(f"probe: {op} over {pattern.kind} skipped: {error}", flush=True)
            continue
        fits.append(
            {
                "kind": pattern.kind,
                "op": op,
                "group_size": pattern.size,
                "sizes": list(pattern.sizes),
                "times": times,
            }
        )
        print(f"probe: {op} x{pattern.size} ({pattern.kind}) done", flush=True)
    return fits


def probe_p2p(plan: ProbePlan, world: int, device) -> list[dict]:
    """Send/recv between rank r and r + world/2 (every pair at once); half a round trip."""
    if not plan.p2p_sizes or world < 2:
        return []
    dtype = _DTYPES[plan.precision]
    rank, half = dist.get_rank(), world // 2
    peer = rank + half if rank < half else rank - half
    times = []
    for size in plan.p2p_sizes:
        buffer = torch.ones(
            max(1, size // torch.tensor([], dtype=dtype).element_size()), dtype=dtype, device=device
        )
        if peer >= world:  # odd world: the last rank idles

            def run(buffer=buffer) -> None:
                return None
        elif rank < half:

            def run(buffer=buffer, peer=peer) -> None:
                dist.send(buffer, peer)
                dist.recv(buffer, peer)
        else:

            def run(buffer=buffer, peer=peer) -> None:
                dist.recv(buffer, peer)
                dist.send(buffer, peer)

        times.append(timed(run, device, plan) / 2)
    print("probe: send/recv done", flush=True)
    return [
        {
            "kind": "pp-p2p",
            "op": "send-recv",
            "group_size": 2,
            "sizes": list(plan.p2p_sizes),
            "times": times,
        }
    ]


def memory_baseline(device: torch.device) -> dict[str, float]:
    """What a rank holds besides its tensors, in the trainer's measure (see module doc)."""
    if device.type != "cuda":
        return {
            "context": 0.0,
            "communicator_buffers": 0.0,
            "allocator_reserve": 0.0,
            "rss_bytes": float(peak_rss_bytes() or 0),
        }
    free, total = torch.cuda.mem_get_info(device)
    outside = (total - free) - torch.cuda.memory_reserved(device)
    allocated = torch.cuda.max_memory_allocated(device)
    reserve = (torch.cuda.max_memory_reserved(device) - allocated) / allocated if allocated else 0.0
    return {
        "context": float(outside),
        "communicator_buffers": 0.0,
        "allocator_reserve": float(reserve),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m parsearch.probe.rank", description=__doc__)
    parser.add_argument("--spec", required=True, type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    spec = TrialSpec.from_json(args.spec.read_text())
    plan = ProbePlan.from_dict(spec.trainer["probe"])
    env = RankEnv.from_environ()
    gpu = spec.allocation.device != "cpu" and spec.trainer.get("device") != "cpu"
    device = (
        torch.device("cuda", env.local_rank)
        if gpu and torch.cuda.is_available()
        else torch.device("cpu")
    )
    if device.type == "cuda":
        torch.cuda.set_device(device)
    began = time.perf_counter()
    with process_group(env, device, spec.timeout_s):
        world = dist.get_world_size()
        gemm = probe_gemm(spec, plan, device)
        collectives = [
            fit for pattern in plan.patterns for fit in probe_pattern(pattern, plan, world, device)
        ]
        collectives += probe_p2p(plan, world, device)
        memory = memory_baseline(device)
        dist.barrier()
    if env.rank == 0:
        metrics = {
            "probe": {
                "gemm": gemm,
                "collectives": collectives,
                "memory": memory,
                "device": str(device),
                "communication": "nccl" if device.type == "cuda" else "gloo",
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                # Ranks of this node that can compute at once; GPU ranks never share.
                "compute_slots": (
                    max(1, len(os.sched_getaffinity(0)) // torch.get_num_threads())
                    if device.type == "cpu"
                    else None
                ),
                "world_size": world,
                "seconds": time.perf_counter() - began,
                "host": os.uname().nodename,
            }
        }
        result = TrialResult(status=TrialState.OK, metrics=metrics)
        if args.out is not None:
            write_result(args.out, result.to_dict())
    return 0


if __name__ == "__main__":
    exit_after(main)
