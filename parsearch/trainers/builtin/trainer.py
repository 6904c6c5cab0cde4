"""One trial of the built-in benchmark, as run by every rank: build the parallel model, train
a few steps on synthetic tokens, time them and measure memory.

Numerics are those of one process training on the whole global batch: every layout starts
from the same weights (see :func:`parsearch.trainers.builtin.model.init_weights`), sees the
same tokens,
and its loss is the mean token cross-entropy over the global batch, so each micro-batch's
mean loss is divided by the number of micro-batches (``gas``) and gradients are averaged over
data-parallel and context-parallel ranks (each CP rank's loss is the mean over its equal
share of every sequence's tokens, and ring attention sends each rank the gradient of its
K/V from every rank's loss, so the dp·cp average is the global mean's gradient, as in
Megatron-core). Mixture-of-experts layers keep to it too: their balance loss is a mean over
sequences (:mod:`parsearch.trainers.builtin.moe`), and their parameters' gradients, computed
from parts of the tokens on several ranks, are summed over those ranks and divided by dp·cp
(:func:`~parsearch.trainers.builtin.parallelize.reduce_expert_gradients`).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from parsearch.config import check_layout
from parsearch.errors import TrainerError
from parsearch.estimate import flops_per_step
from parsearch.result import TrialResult, TrialState
from parsearch.trainers.builtin.env import RankEnv
from parsearch.trainers.builtin.expert_parallel import expert_comm
from parsearch.trainers.builtin.fp8 import fp8_unsupported, to_float8
from parsearch.trainers.builtin.limits import unsupported
from parsearch.trainers.builtin.memory import TensorPeak, peak_rss_bytes, reset_peak_rss
from parsearch.trainers.builtin.model import Transformer, materialize
from parsearch.trainers.builtin.parallelize import (
    align_gradients,
    allreduce_gradients,
    apply_cp,
    apply_ddp,
    apply_ep,
    apply_fsdp,
    apply_recompute,
    apply_tp,
    build_schedule,
    expert_parameters,
    make_loss,
    moe_layers,
    no_gradient_sync,
    reduce_expert_gradients,
    schedule_used,
    split_stage,
    stage_ids,
    sum_tied_embedding_grads,
    tied_embedding_group,
)
from parsearch.trainers.builtin.settings import TrainerSettings
from parsearch.trial import TrialSpec
from parsearch.units import format_bytes


def resolve_device(settings: TrainerSettings, spec: TrialSpec, env: RankEnv) -> torch.device:
    """The rank's device: ``cuda:<local rank>`` modulo the visible devices (the node agent
    makes one visible per rank), or the CPU. ``auto`` follows the allocation, and falls back
    to the CPU where no GPU is visible."""
    kind = settings.device
    if kind == "auto":
        gpu = spec.allocation.device != "cpu" and torch.cuda.is_available()
        kind = "cuda" if gpu else "cpu"
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise TrainerError("trainer.device is 'cuda' but no GPU is visible")
        return torch.device("cuda", env.local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def resolve_precision(settings: TrainerSettings, device: torch.device) -> str:
    if settings.precision != "auto":
        return settings.precision
    return "bf16" if device.type == "cuda" else "fp32"


def synthetic_batch(spec: TrialSpec) -> torch.Tensor:
    """The global batch ``[global_batch, seq + 1]`` of tokens, the same for every layout of a
    seed; each step trains on it again, so the loss falls visibly."""
    generator = torch.Generator().manual_seed(spec.seed)
    shape = (spec.layout.global_batch, spec.model.seq_length + 1)
    return torch.randint(spec.model.vocab_size, shape, generator=generator)


class ParallelJob:
    """The model of one rank, wrapped for its layout, with its optimizer and step."""

    def __init__(self, spec: TrialSpec, settings: TrainerSettings, device: torch.device) -> None:
        layout, model = spec.layout, spec.model
        self.spec, self.layout, self.device = spec, layout, device
        # Megatron's rank order, tp-cp-dp-pp innermost first (the estimate's placement).
        self.mesh = init_device_mesh(
            device.type,
            (layout.pp, layout.dp, layout.cp, layout.tp),
            mesh_dim_names=("pp", "dp", "cp", "tp"),
        )
        # Gradients are averaged, and ZeRO shards, over dp·cp (torchtitan's dp_shard_cp).
        replicas = self.mesh["dp", "cp"]._flatten("dp_cp") if layout.cp > 1 else self.mesh["dp"]
        self._loss = make_loss(self.mesh["tp"])
        refuse_unsupported_moe(spec)
        self.comm = expert_comm(self.mesh, layout) if model.moe is not None else None
        precision = resolve_precision(settings, device)
        self.param_dtype = torch.bfloat16 if precision == "bf16" else None
        with torch.device("meta"):
            whole = Transformer(model)
        num_stages = layout.pp * layout.vpp
        self.ids = stage_ids(layout, self.mesh["pp"].get_local_rank())
        self.stages: list[Transformer] = [
            split_stage(whole, i, num_stages) if num_stages > 1 else whole for i in self.ids
        ]
        for stage in self.stages:
            if layout.precision == "fp8":
                to_float8(stage)
            apply_tp(stage, self.mesh["tp"], layout.sequence_parallel)
            apply_ep(stage, self.comm)
            materialize(stage, device, spec.seed)
            apply_cp(stage, self.mesh["cp"])
            apply_recompute(stage, layout.recompute)
            if layout.zero_stage:
                ignored = set().union(*expert_parameters([stage]))
                apply_fsdp(stage, replicas, layout.zero_stage, self.param_dtype, ignored)
        expert_params = {id(p) for p in set().union(*expert_parameters(self.stages))}
        if layout.pp == 1:  # else the pipeline schedule divides gradients by gas itself
            for stage in self.stages:
                for moe in moe_layers(stage):
                    moe.loss_scale = 1.0 / layout.gas
        # What runs forward: the stages, or their DDP wrappers.
        self.modules: list[nn.Module] = list(self.stages)
        self.replicas = replicas.size()
        plain_dp = self.replicas > 1 and layout.zero_stage == 0
        # DDP would average the MoE layers' gradients over dp, not their own groups.
        self.manual_dp = plain_dp and (layout.tp > 1 or layout.pp > 1 or self.comm is not None)
        self.dp_group = replicas.get_group()
        if plain_dp and not self.manual_dp:
            self.modules = [apply_ddp(self.stages[0], replicas)]
        self.params = list({id(p): p for m in self.stages for p in m.parameters()}.values())
        self.dense_params = [p for p in self.params if id(p) not in expert_params]
        self.optimizer = torch.optim.AdamW(
            _groups_by_mesh(self.params),
            lr=settings.lr,
            weight_decay=settings.weight_decay,
            fused=True,
        )
        self.autocast = precision_context(precision, device)
        self.schedule = None
        if layout.pp > 1:
            self.schedule = build_schedule(
                self.modules,
                self.ids,
                layout,
                self.mesh["pp"].get_group(),
                device,
                self._loss,
                settings.schedule,
            )
        self.tied_group = tied_embedding_group(self.mesh, model)
        self.first = self.ids[0] == 0
        self.last = self.ids[-1] == num_stages - 1
        tokens = synthetic_batch(spec)
        rows = layout.mbs * layout.gas
        start = self.mesh["dp"].get_local_rank() * rows
        local = tokens[start : start + rows].to(device)
        # This rank's tokens of each sequence: all, or its CP chunks (see apply_cp).
        held = self.stages[0].positions
        self.inputs, self.targets = local[:, :-1][:, held], local[:, 1:][:, held]

    def _zero_grads(self) -> None:
        """Zero gradients in place (kept allocated, like Megatron's gradient buffer), one
        ``foreach`` call per parameter group: ``Optimizer.zero_grad`` would batch tensors of
        every group together and DTensors cannot be mixed with plain tensors."""
        for group in self.optimizer.param_groups:
            grads = [p.grad for p in group["params"] if p.grad is not None]
            if grads:
                torch._foreach_zero_(grads)

    def step(self) -> torch.Tensor:
        """One optimizer step; returns this rank's share of the global mean loss and of the
        MoE layers' balance loss (summed over all ranks they give the step's)."""
        layout = self.layout
        self._zero_grads()
        total = torch.zeros((), device=self.device)
        if self.schedule is not None:
            losses: list[torch.Tensor] = []
            args = (self.inputs,) if self.first else ()
            with self.autocast():
                self.schedule.step(
                    *args,
                    target=self.targets if self.last else None,
                    losses=losses if self.last else None,
                )
            if losses:
                total = torch.stack([loss.detach().float() for loss in losses]).sum()
        else:
            inputs = self.inputs.chunk(layout.gas)
            targets = self.targets.chunk(layout.gas)
            model = self.modules[0]
            for index, (x, y) in enumerate(zip(inputs, targets, strict=True)):
                # ZeRO-2/3 reduce-scatter every micro-batch; DDP and ZeRO-1 the last only.
                accumulate = index < layout.gas - 1 and layout.zero_stage in (0, 1)
                with no_gradient_sync(model) if accumulate else contextlib.nullcontext():
                    with self.autocast():
                        loss = self._loss(model(x), y)
                    (loss / layout.gas).backward()
                total = total + loss.detach().float()
        align_gradients(self.params)
        if self.manual_dp:
            allreduce_gradients(self.dense_params, self.dp_group)
        if self.comm is not None:
            reduce_expert_gradients(self.stages, self.comm)
        if self.tied_group is not None:
            sum_tied_embedding_grads(self.stages, self.tied_group)
        self.optimizer.step()
        owns_loss = self.last and self.mesh["tp"].get_local_rank() == 0
        share = total / (layout.gas * self.replicas) if owns_loss else torch.zeros_like(total)
        return torch.stack([share, self._balance_share()])

    def _balance_share(self) -> torch.Tensor:
        """This rank's share of the step's balance loss: every rank's shares of a
        micro-batch sum over tp and cp to cp times its loss (see MoE._balance_loss), so
        divided by gas·dp·cp they sum to the mean over the step's micro-batches."""
        shares = []
        for stage in self.stages:
            for moe in moe_layers(stage):
                # One per micro-batch: the last gas. Under a pipeline the first step also runs
                # torch's shape inference through the stage before them (torch 2.13).
                shares.extend(moe.balance_record[-self.layout.gas :])
                moe.balance_record.clear()
        total = torch.stack(shares).sum() if shares else torch.zeros((), device=self.device)
        return total.float() / (self.layout.gas * self.replicas)


def refuse_unsupported_moe(spec: TrialSpec) -> None:
    """What the built-in trainer does not run (:func:`.limits.unsupported`), refused before
    any work; the space refuses the same layouts before they are proposed."""
    problems = unsupported(spec.model, spec.layout)
    if problems:
        raise TrainerError("; ".join(problems))


def _groups_by_mesh(params: list[nn.Parameter]) -> list[dict[str, Any]]:
    """One optimizer parameter group per device mesh (plain tensors together), so the fused
    AdamW kernel (Megatron's choice too: no temporaries the size of the model) never mixes
    DTensors of different meshes with plain tensors."""
    groups: dict[Any, list[nn.Parameter]] = {}
    for param in params:
        groups.setdefault(getattr(param, "device_mesh", None), []).append(param)
    return [{"params": group} for group in groups.values()]


def precision_context(precision: str, device: torch.device):
    """A factory of the forward's precision context: bf16 autocast, or nothing for fp32."""
    if precision == "bf16":
        return lambda: torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def process_group(env: RankEnv, device: torch.device, timeout_s: float) -> Iterator[None]:
    """The trial's process group (NCCL on GPU, gloo on CPU) for the duration of the block.

    Also applies ``OMP_NUM_THREADS``, which torch only reads when it is imported: a
    preforked rank (:mod:`parsearch.launch.prefork`) imported it before its environment
    was set."""
    from datetime import timedelta

    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))

    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = timedelta(seconds=max(timeout_s, 60.0))
    if env.master_port is None:  # a lone process: no rendezvous needed
        store = dist.HashStore()
        dist.init_process_group(backend, store=store, rank=0, world_size=1, timeout=timeout)
    else:
        dist.init_process_group(
            backend,
            init_method=f"tcp://{env.master_addr}:{env.master_port}",
            rank=env.rank,
            world_size=env.world_size,
            timeout=timeout,
            device_id=device if device.type == "cuda" else None,
        )
    yield
    # Not on an exception: a peer may be stuck in a collective with us, and the destroy
    # could wait for it; the failing process exits anyway. The barrier first: a rank that
    # tore its gloo groups down while a peer was still finishing the last collective
    # aborted ("terminate called without an active exception", 1 launch in 5 with expert
    # parallelism's extra groups; REFERENCE.md saw the same with DeepSpeed).
    dist.barrier()
    dist.destroy_process_group()


@dataclass
class Measurements:
    """What the training loop of one rank observed."""

    peak: TensorPeak
    cap: int | None
    status: TrialState = TrialState.OK
    losses: list[torch.Tensor] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)


def train(
    spec: TrialSpec, env: RankEnv, phases: dict[str, float] | None = None
) -> TrialResult | None:
    """Run the trial on this rank (inside :func:`process_group`); rank 0 returns the result,
    the other ranks ``None``. ``phases`` (seconds spent before, e.g. importing) is reported
    with the build and step times as ``phases_s``, to show where a trial's time goes."""
    settings = TrainerSettings.from_spec(spec)
    device = resolve_device(settings, spec, env)
    check_layout(spec.layout, spec.model, env.world_size)
    if spec.layout.precision == "fp8" and (problem := fp8_unsupported(device)):
        # Every rank sees the same kind of device: all return before any collective.
        return TrialResult(status=TrialState.INFEASIBLE, error=problem) if env.rank == 0 else None
    began = time.perf_counter()
    job = ParallelJob(spec, settings, device)
    run = Measurements(TensorPeak(device), settings.memory_cap(spec), phases=dict(phases or {}))
    run.phases["build_s"] = time.perf_counter() - began
    run.peak.reset()
    reset_peak_rss()
    # torch.distributed.pipelining infers backward shapes with autograd.grad() on its first
    # step, which MemTracker's grad hooks cannot run inside: with pp > 1 never trace step 0.
    first_traceable = 1 if spec.layout.pp > 1 else 0
    traced_index = max(settings.warmup_steps - 1, first_traceable)
    for index in range(settings.warmup_steps + settings.steps):
        traced = index == traced_index
        dist.barrier()
        _synchronize(device)
        start = time.perf_counter()
        with run.peak.track(job.modules, job.optimizer) if traced else contextlib.nullcontext():
            run.losses.append(job.step())
        _synchronize(device)
        run.times.append(time.perf_counter() - start)
        if traced and run.cap is not None:
            peak = torch.tensor([run.peak.finish() or 0], device=device)
            if _reduce(peak, dist.ReduceOp.MAX)[0] > run.cap:
                run.status = TrialState.OOM
                break
    run.phases["steps_s"] = time.perf_counter() - began - run.phases["build_s"]
    return _report(spec, settings, env, job, run)


def _reduce(tensor: torch.Tensor, op: dist.ReduceOp) -> torch.Tensor:
    dist.all_reduce(tensor, op=op)
    return tensor


def _gather(values: list[int | None], device: torch.device) -> list[list[int | None]]:
    """``values`` of every rank, in rank order (``-1`` stands for ``None`` on the wire)."""
    local = torch.tensor([-1 if v is None else v for v in values], dtype=torch.int64, device=device)
    out = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(out, local)
    return [[None if v < 0 else int(v) for v in row.tolist()] for row in out]


def _report(
    spec: TrialSpec, settings: TrainerSettings, env: RankEnv, job: ParallelJob, run: Measurements
) -> TrialResult | None:
    """Combine every rank's figures (collectives: all ranks must call it) into rank 0's
    result."""
    device, peak, cap = job.device, run.peak, run.cap
    step_losses, balance_losses = _reduce(torch.stack(run.losses), dist.ReduceOp.SUM).T.tolist()
    times = torch.tensor(run.times, device=device, dtype=torch.float64)
    step_times = _reduce(times, dist.ReduceOp.MAX)
    memory = _gather([peak.finish(), peak_rss_bytes()], device)
    if env.rank != 0:
        return None
    layout, model = spec.layout, spec.model
    peaks = [row[0] for row in memory]
    rss = [row[1] for row in memory]
    metrics: dict[str, Any] = {
        "layout": layout.to_dict(),
        "world_size": env.world_size,
        "device": device.type,
        "precision": resolve_precision(settings, device),
        "schedule": schedule_used(layout, settings.schedule),
        "warmup_steps": settings.warmup_steps,
        "steps": settings.steps,
        "losses": step_losses,
        "peak_mem_bytes": max((p for p in peaks if p is not None), default=None),
        "peak_mem_bytes_per_rank": peaks,
        "peak_mem_source": "max_memory_allocated" if device.type == "cuda" else "MemTracker",
        "peak_mem_breakdown_rank0": peak.breakdown,
        "peak_rss_bytes": max((r for r in rss if r is not None), default=None),
        "peak_rss_bytes_per_rank": rss,
        "memory_cap_bytes": cap,
        "phases_s": run.phases,
    }
    if model.moe is not None:
        metrics["balance_losses"] = balance_losses
    if run.status is TrialState.OOM:
        return TrialResult(
            status=run.status,
            metrics=metrics,
            error=f"measured peak {_size(metrics['peak_mem_bytes'])} per rank exceeds the cap "
            f"of {_size(cap)}",
        )
    measured = step_times.tolist()[settings.warmup_steps :]
    step_time = statistics.median(measured)
    tokens = layout.global_batch * model.seq_length
    flops = flops_per_step(model, layout.global_batch, recompute="none")
    tflops = flops / step_time / env.world_size / 1e12
    metrics |= {
        "step_time_s": step_time,
        "step_time_spread_s": max(measured) - min(measured),
        "step_times_s": step_times.tolist(),
        "tokens_per_step": tokens,
        "tokens_per_s": tokens / step_time,
        "model_flops_per_step": flops,
        "tflops_per_device": tflops,
        "mfu": tflops * 1e12 / spec.allocation.peak_flops_per_device,
    }
    return TrialResult(status=TrialState.OK, metrics=metrics)


def _size(value: float | None) -> str:
    """A size in an OOM reason: ``24.6 MiB`` (the exact bytes are in the metrics)."""
    return "?" if value is None else format_bytes(value)
