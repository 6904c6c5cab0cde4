"""Simulated machines whose answers differ from parsearch's estimate in *shape*, not only scale.

A search strategy that leans on the estimate must be scored against machines the estimate
does not describe exactly, or the benchmark only measures how well the estimate predicts
itself. Each :class:`Truth` answers a layout with what a trial would report (tokens/s, step
time, peak memory, or out of memory / timeout), deterministically per seed:

* :class:`RescaledEstimate` (``rescaled``): the estimate with its knobs rescaled (slower
  compute and network, a bigger small-GEMM penalty); same functional form.
* :class:`IndependentModel` (``independent``): an analytic model written from the papers,
  not from ``parsearch/estimate/``: its own GEMM efficiency (tile and wave quantisation under
  a roofline), its own communication terms (alpha-beta ring collectives, Megatron's rank
  order for which groups cross nodes, bucketed overlap of the data-parallel reduction), and
  its own memory (Korthikanti et al.'s activation counts, an allocator that fragments
  activations but not the optimiser state, communicator buffers per group), so its memory
  is not affine in the estimate's.
* :class:`RandomField` (``field``): the estimate's throughput times a seeded smooth random
  field over the layout's dimensions (correlation length 1-2 index steps per dimension,
  within +-25%), drawn until the optimum is a layout the estimate ranks 5th to 50th.
* :class:`CostlyTensorParallel` (``tp-costly``): the estimate exactly, but for the tensor-
  parallel all-reduces inside a node, which cost 1.5 times what it predicts (a structural
  error in one part of the step, so the optimum moves to less TP than the estimate's).

On every truth the peak memory is then multiplied by ``mem_factor`` (the memory directions:
1, 1.2, 0.85, i.e. the limit as is, x1/1.2, x1/0.85) and the throughput by a per-layout
log-normal noise (sigma :data:`NOISE`), seeded by the seed and the layout.

Sources of the independent model: D. Narayanan et al., "Efficient Large-Scale Language Model
Training on GPU Clusters Using Megatron-LM", SC 2021 (FLOPs per iteration, 1F1B/interleaved
bubble, scatter/gather p2p); V. Korthikanti et al., "Reducing Activation Recomputation in
Large Transformer Models", arXiv 2205.05198 (activation bytes with TP/SP/recompute);
S. Rajbhandari et al., "ZeRO", SC 2020 (optimiser-state partitioning); NVIDIA, "Matrix
Multiplication Background User's Guide" (tile and wave quantisation); R. Thakur et al.,
"Optimization of Collective Communication Operations in MPICH", IJHPCA 2005 (ring alpha-beta
costs); AMD MI250X and NVIDIA H100/H200 data sheets (compute units, HBM bandwidth).
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import heapq
import math
import random
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from parsearch.backends import Finished
from parsearch.config import ModelSpec, ParallelLayout
from parsearch.errors import BackendError
from parsearch.result import TrialResult, TrialState
from parsearch.space import SearchSpace
from parsearch.trial import TrialSpec

NOISE = 0.05
REPLAY_DIR = Path(__file__).resolve().parent / "replay"
REPLAY_CSV = REPLAY_DIR / "hagemann2023.csv"
GIB = 2**30
STARTUP_S = 300.0  # per trial, for node-hours: job launch, communicators, model build


@dataclass(frozen=True)
class Answer:
    """What a truth says of a layout before noise: seconds per step and peak bytes per rank."""

    step_s: float
    peak_bytes: float


class Truth:
    """A simulated machine: :meth:`answer` is its noiseless shape, :meth:`measure` a trial."""

    name: str = "truth"

    def __init__(self, space: SearchSpace, seed: int, mem_factor: float = 1.0):
        self.space, self.seed, self.mem_factor = space, seed, mem_factor

    def answer(self, layout: ParallelLayout) -> Answer:
        raise NotImplementedError

    def measure(self, layout: ParallelLayout, *, noisy: bool = True) -> TrialResult:
        """What a trial of ``layout`` reports on this machine (same answer every time);
        without ``noisy``, the layout's own mean throughput (what repeated runs average)."""
        space = self.space
        answer = self.answer(layout)
        peak = answer.peak_bytes * self.mem_factor
        if peak > space.memory_limit_bytes:
            return TrialResult(status=TrialState.OOM, error=f"needs {peak / GIB:.1f} GiB")
        noise = math.exp(_rng(self.seed, layout, "noise").gauss(0.0, NOISE)) if noisy else 1.0
        return _timed_result(space, layout, answer.step_s * noise, {"peak_mem_bytes": peak})

    def node_seconds(self, result: TrialResult) -> float:
        """Node-seconds a trial with this result held: start-up, then its timed steps."""
        nodes = self.space.allocation.nodes
        if result.status is TrialState.INFEASIBLE:
            return 0.0
        if result.status is TrialState.TIMEOUT:
            return nodes * (STARTUP_S + self.space.trial_timeout_s)
        return nodes * (STARTUP_S + (result.duration_s or 0.0))


class RescaledEstimate(Truth):
    """The estimate with its knobs rescaled: the shape the strategy was designed against."""

    name = "rescaled"

    def __init__(self, space: SearchSpace, seed: int, mem_factor: float = 1.0):
        super().__init__(space, seed, mem_factor)
        estimate, allocation = space.estimate, space.allocation
        estimate = dataclasses.replace(
            estimate,
            compute_efficiency=estimate.compute_efficiency * 0.48 / 0.55,
            gemm_half_efficiency_elements=estimate.gemm_half_efficiency_elements * 4.0,
            dp_overlap=1 - (1 - estimate.dp_overlap) * 0.7 / 0.3,
            collective_latency_s=estimate.collective_latency_s * 100 / 30,
        )
        allocation = dataclasses.replace(
            allocation,
            inter_node_bandwidth_bytes_per_s=allocation.inter_node_bandwidth_bytes_per_s * 0.5,
        )
        self._truth = dataclasses.replace(space, estimate=estimate, allocation=allocation)

    def answer(self, layout: ParallelLayout) -> Answer:
        prediction = self._truth.predict(layout)
        return Answer(prediction.step_time_s, prediction.memory.total)


class RandomField(Truth):
    """The estimate's throughput times a smooth seeded field; memory as the estimate's.

    The field is a sum of random Fourier features of a squared-exponential kernel over the
    index of each searched value in its dimension (``f`` has unit variance; the factor is
    ``1 + AMPLITUDE·tanh(f)``). Fields are drawn (seed, then seed + 1000, ...) until the
    exhaustive optimum is one the estimate ranks 5th to 50th among the layouts predicted
    to fit: a field under which the estimate's first pick stays best tests nothing.
    """

    name = "field"
    AMPLITUDE = 0.25
    FEATURES = 96

    def __init__(self, space: SearchSpace, seed: int, mem_factor: float = 1.0):
        super().__init__(space, seed, mem_factor)
        self.names = list(space.searched)
        self.index = {n: {v: i for i, v in enumerate(space.searched[n])} for n in self.names}
        ranked = sorted(space.plan().feasible, key=lambda item: -item[1].tokens_per_s)
        self.rank_of_optimum = 0
        for attempt in range(60):
            self._draw(seed + 1000 * attempt)
            best = max(ranked, key=lambda item: self._factor(item[0]) * item[1].tokens_per_s)
            rank = next(i for i, item in enumerate(ranked, 1) if item[0] == best[0])
            self.rank_of_optimum = rank
            if 5 <= rank <= 50:
                break

    def _draw(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        lengths = rng.uniform(1.0, 2.0, size=len(self.names))
        self.lengths = lengths
        self._omega = rng.normal(size=(self.FEATURES, len(self.names))) / lengths
        self._phase = rng.uniform(0, 2 * np.pi, size=self.FEATURES)

    def _factor(self, layout: ParallelLayout) -> float:
        x = np.array([self.index[n][getattr(layout, n)] for n in self.names], dtype=float)
        f = math.sqrt(2.0 / self.FEATURES) * np.cos(self._omega @ x + self._phase).sum()
        return 1.0 + self.AMPLITUDE * math.tanh(f)

    def answer(self, layout: ParallelLayout) -> Answer:
        prediction = self.space.predict(layout)
        return Answer(prediction.step_time_s / self._factor(layout), prediction.memory.total)


class CostlyTensorParallel(Truth):
    """The estimate with its in-node tensor-parallel all-reduces :data:`FACTOR` times slower.

    Every micro-batch slot of the pipeline (the bubble's too) holds one slot of TP
    all-reduces, so the added time is ``(FACTOR - 1) * tp_comm_s * slots / micro-batches``;
    a TP group that spans nodes is as the estimate says.
    """

    name = "tp-costly"
    FACTOR = 1.5

    def answer(self, layout: ParallelLayout) -> Answer:
        prediction = self.space.predict(layout)
        step = prediction.step_time_s
        if layout.tp <= self.space.allocation.devices_per_node and prediction.tp_comm_s > 0:
            slots = (prediction.compute_s + prediction.tp_comm_s + prediction.bubble_s) / (
                prediction.compute_s + prediction.tp_comm_s
            )
            step += (self.FACTOR - 1.0) * prediction.tp_comm_s * slots
        return Answer(step, prediction.memory.total)


@dataclass(frozen=True)
class Device:
    """What the independent model needs of a device (from its data sheet)."""

    compute_units: int
    hbm_bytes_per_s: float
    gemm_ceiling: float  # best fraction of peak a large bf16 GEMM reaches


def device_of(space: SearchSpace) -> Device:
    """MI250X GCD (110 CUs, 1.6 TB/s), H100 SXM (132 SMs, 3.35 TB/s), H200 (4.8 TB/s)."""
    allocation = space.allocation
    if allocation.peak_flops_per_device < 400e12:
        return Device(110, 1.6e12, 0.62)
    if allocation.device_memory_bytes > 100e9:
        return Device(132, 4.8e12, 0.74)
    return Device(132, 3.35e12, 0.72)


class IndependentModel(Truth):
    """A machine written from the papers cited in the module docstring, not the estimate."""

    name = "independent"
    TILE = (256, 128)
    ALPHA_INTRA, ALPHA_INTER = 8e-6, 25e-6
    FRAGMENTATION = 0.12  # of activation bytes: the caching allocator's split blocks
    FRAMEWORK_BYTES = 2.2 * GIB
    COMMUNICATOR_BYTES = 0.35 * GIB

    def __init__(self, space: SearchSpace, seed: int, mem_factor: float = 1.0):
        super().__init__(space, seed, mem_factor)
        self.device = device_of(space)

    def answer(self, layout: ParallelLayout) -> Answer:
        return Answer(self._step_s(layout), self._peak_bytes(layout))

    # --- time -------------------------------------------------------------------------
    def _gemm_efficiency(self, m: float, n: float, k: float) -> float:
        device, (tm, tn) = self.device, self.TILE
        tiles = math.ceil(m / tm) * math.ceil(n / tn)
        waves = math.ceil(tiles / device.compute_units)
        wave_efficiency = tiles / (waves * device.compute_units)
        tile_efficiency = (m * n) / (math.ceil(m / tm) * tm * math.ceil(n / tn) * tn)
        intensity = m * n * k / (m * k + k * n + m * n)  # flops per byte at 2 bytes/element
        ridge = self.space.allocation.peak_flops_per_device / device.hbm_bytes_per_s
        roofline = min(1.0, intensity / ridge)
        return device.gemm_ceiling * wave_efficiency * tile_efficiency * roofline

    def _step_s(self, layout: ParallelLayout) -> float:
        space, model, allocation = self.space, self.space.model, self.space.allocation
        tp, pp, dp, b = layout.tp, layout.pp, layout.dp, layout.mbs
        s, h = model.seq_length, model.hidden_size
        ffn = model.ffn_hidden_size or 4 * h
        tokens = b * s
        # The GEMMs of a layer, weighted by their share of its flops.
        shapes = [(tokens, 3 * h / tp, h), (tokens, h, h / tp), (tokens, ffn / tp, h)]
        shapes.append((tokens, h, ffn / tp))
        efficiency = sum(self._gemm_efficiency(*sh) * sh[0] * sh[1] * sh[2] for sh in shapes)
        efficiency /= sum(sh[0] * sh[1] * sh[2] for sh in shapes)
        flops = _model_flops_per_token(space) * tokens * _recompute_factor(layout)
        compute = flops / (tp * pp) / (allocation.peak_flops_per_device * efficiency)
        per_node = allocation.devices_per_node
        intra, inter = (
            allocation.intra_node_bandwidth_bytes_per_s,
            allocation.inter_node_bandwidth_bytes_per_s,
        )
        layers = model.num_layers / pp
        activation = tokens * h * 2.0
        collectives = 4 + (2 if layout.recompute == "full" else 0)
        tp_bw, tp_alpha = (intra, self.ALPHA_INTRA) if tp <= per_node else (inter, self.ALPHA_INTER)
        tp_comm = layers * collectives * _ring(activation, tp, tp_bw, tp_alpha)
        crosses = tp * dp >= per_node  # Megatron's order: tp fastest, then dp, then pp
        p2p_bw, p2p_alpha = (inter, self.ALPHA_INTER) if crosses else (intra, self.ALPHA_INTRA)
        p2p = 0.0 if pp == 1 else 2 * (activation / tp / p2p_bw + p2p_alpha)
        per_microbatch = compute + tp_comm + p2p
        slots = layout.gas + (pp - 1) / layout.vpp
        pipeline = slots * per_microbatch
        params = _params_per_rank(space, layout)
        dp_bw = inter if tp * dp > per_node else intra
        dp_alpha = self.ALPHA_INTER if tp * dp > per_node else self.ALPHA_INTRA
        grads = _ring(params * 4.0, dp, dp_bw, dp_alpha) * 0.5  # reduce-scatter in fp32
        gather = _ring(params * 2.0, dp, dp_bw, dp_alpha) * 0.5  # all-gather bf16 weights
        hidden = 0.66 * compute  # the last micro-batch's backward
        exposed = max(grads - hidden, 0.2 * grads) + gather
        return pipeline + exposed

    # --- memory -----------------------------------------------------------------------
    def _peak_bytes(self, layout: ParallelLayout) -> float:
        space, model = self.space, self.space.model
        tp, pp, dp, b = layout.tp, layout.pp, layout.dp, layout.mbs
        s, h, a = model.seq_length, model.hidden_size, model.num_heads
        ffn = model.ffn_hidden_size or 4 * h
        gated = model.ffn_hidden_size is not None
        mlp_scale = ffn / (4 * h) * (1.5 if gated else 1.0)
        flash = space.estimate.flash_attention or layout.recompute == "selective"
        attention_scores = 0.0 if flash else 5 * a * s / h
        if layout.recompute == "full":
            per_layer = 2.0 * s * b * h
        elif layout.sequence_parallel:
            per_layer = s * b * h * ((15 + 19 * mlp_scale) / tp + attention_scores / tp)
        else:
            per_layer = s * b * h * (10 + (5 + 19 * mlp_scale) / tp + attention_scores / tp)
        in_flight = min(layout.gas, pp) * (
            1 + (pp - 1) / (pp * layout.vpp) if layout.vpp > 1 else 1
        )
        activations = in_flight * (model.num_layers / pp) * per_layer
        params = _params_per_rank(space, layout)
        per_param = {0: 18.0, 1: 6.0 + 12.0 / dp, 2: 2.0 + 16.0 / dp, 3: 18.0 / dp}
        states = params * per_param.get(layout.zero_stage, 18.0)
        logits = 0.0
        if pp == 1:
            logits = b * s * model.vocab_size / tp * 4.0 * 2
        groups = sum(1 for size in (tp, pp, dp) if size > 1)
        framework = self.FRAMEWORK_BYTES + self.COMMUNICATOR_BYTES * groups
        return states + (activations + logits) * (1 + self.FRAGMENTATION) + framework


class MemoryWall(IndependentModel):
    """The independent model with its memory scaled so the optimum needs 99.4% of the
    device, while the estimate predicts that layout to fit with at least 10% to spare.

    The shape an outside check found in a 22B space: the optimum's larger micro-batch
    neighbours run out of memory, the local memory evidence they leave then rules the
    optimum out by inference, and the campaign spends its budget below it. The scale
    ``memory_scale`` is chosen per space: for the layouts in order of (noiseless)
    throughput, the first whose scaled need is :data:`NEED` of the device while every
    better layout's exceeds the device, among those the estimate gives 10% room.
    """

    name = "wall"
    NEED = 0.994  # of the device, at the optimum
    ROOM = 0.9  # the estimate's prediction for the optimum, at most, of the device

    def __init__(self, space: SearchSpace, seed: int, mem_factor: float = 1.0):
        if mem_factor != 1.0:
            raise ValueError(
                f"the wall truth sets its own memory scale: memory x{mem_factor} does not apply"
            )
        super().__init__(space, seed, mem_factor)
        self.memory_scale = 1.0
        self.memory_scale, self.optimum = _wall(self, space)

    def answer(self, layout: ParallelLayout) -> Answer:
        answer = super().answer(layout)
        return Answer(answer.step_s, answer.peak_bytes * self.memory_scale)


def _wall(truth: IndependentModel, space: SearchSpace) -> tuple[float, ParallelLayout]:
    """(memory scale, the optimum it makes) for :class:`MemoryWall`."""
    plan = space.plan()
    limit = space.memory_limit_bytes
    rows = []
    for layout, prediction in plan.feasible + plan.predicted_oom:
        answer = IndependentModel.answer(truth, layout)
        tokens = layout.dp * layout.mbs * layout.gas / answer.step_s
        rows.append((tokens, answer.peak_bytes, prediction.memory.total, layout))
    rows.sort(key=lambda row: -row[0])
    lightest_better = float("inf")  # the least memory any better layout needs
    for _, peak, predicted, layout in rows:
        scale = MemoryWall.NEED * limit / peak
        if predicted <= MemoryWall.ROOM * limit and lightest_better * scale > limit:
            return scale, layout
        lightest_better = min(lightest_better, peak)
    raise ValueError(f"{space.name}: no layout makes a memory wall the estimate does not see")


class PublishedSweep(Truth):
    """Replay of a published sweep: what each layout measured, or that it ran out of memory.

    Hagemann et al. (arXiv 2311.05610) published every run of their layout sweeps of LLaMA
    13B, 30B and 65B on 64-256 A100 80GB GPUs, out-of-memory runs included
    (``replay/hagemann2023.csv``, converted from their spreadsheets: ``replay/README.md``).
    Each space file in ``replay/`` searches exactly one sweep's (tp, pp, micro-batch,
    recompute) values, so a search only proposes layouts that were measured. What a replay
    cannot give: the peak memory of the runs that fit (not published: its trials report
    none, so a strategy learns memory only from which layouts ran), other memory directions
    (the wall is where that machine had it) and a noise draw (each figure is already a
    mean of nine steps): its seeds vary only the strategies' own random choices.
    """

    name = "replay"
    KERNEL = "flash_attention2"  # the sweeps' attention kernel the space files describe

    def __init__(self, space: SearchSpace, seed: int, mem_factor: float = 1.0):
        if mem_factor != 1.0:
            raise ValueError(
                f"the replay truth's memory is as measured: memory x{mem_factor} does not apply"
            )
        super().__init__(space, seed, mem_factor)
        self.runs = published_runs(space.name, self.KERNEL)
        if not self.runs:
            raise ValueError(f"{REPLAY_CSV} has no {self.KERNEL} runs of a sweep {space.name!r}")

    def measure(self, layout: ParallelLayout, *, noisy: bool = True) -> TrialResult:
        run = self.runs.get((layout.tp, layout.pp, layout.mbs, layout.recompute))
        swept = (layout.zero_stage, layout.vpp, layout.sequence_parallel) == (1, 1, False)
        if run is None or not swept:
            return TrialResult(status=TrialState.ERROR, error="not measured in the published sweep")
        if run["status"] == "oom":
            return TrialResult(
                status=TrialState.OOM, error=f"out of memory in the sweep (run {run['trial_id']})"
            )
        return _timed_result(self.space, layout, float(run["step_time_s"]), {})


@cache
def published_runs(sweep: str, kernel: str) -> dict[tuple[int, int, int, str], dict[str, str]]:
    """One sweep's runs with one kernel, by (tp, pp, micro-batch, recompute)."""
    with REPLAY_CSV.open(newline="") as file:
        return {
            (int(row["tp"]), int(row["pp"]), int(row["mbs"]), row["recompute"]): row
            for row in csv.DictReader(file)
            if row["sweep"] == sweep and row["kernel"] == kernel
        }


def _timed_result(
    space: SearchSpace, layout: ParallelLayout, step: float, extra: dict[str, float]
) -> TrialResult:
    """A trial that ran at ``step`` seconds per step: timed out, or its metrics."""
    if step * space.timed_steps > space.trial_timeout_s:
        return TrialResult(status=TrialState.TIMEOUT, error=f"{step:.3g} s per step")
    tokens = layout.dp * layout.mbs * layout.gas * space.model.seq_length
    tflops = _model_flops_per_token(space) * tokens / step / space.world_size / 1e12
    return TrialResult(
        status=TrialState.OK,
        metrics={
            "step_time_s": step,
            "tokens_per_s": tokens / step,
            "tflops_per_device": tflops,
            "mfu": tflops * 1e12 / space.allocation.peak_flops_per_device,
            **extra,
        },
        duration_s=step * space.timed_steps,
    )


def _ring(size: float, group: int, bandwidth: float, alpha: float) -> float:
    """A ring all-reduce (Thakur et al. 2005): 2(g-1)/g of the bytes, 2(g-1) latencies."""
    if group <= 1:
        return 0.0
    return 2 * (group - 1) / group * size / bandwidth + 2 * (group - 1) * alpha


@cache
def _layer_params(model: ModelSpec) -> tuple[float, float]:
    """(parameters of one transformer layer, of the embedding) for ``model``."""
    h = model.hidden_size
    kv = (model.num_kv_heads or model.num_heads) / model.num_heads
    ffn = model.ffn_hidden_size or 4 * h
    mlp = (3 if model.ffn_hidden_size is not None else 2) * h * ffn
    attention = 2 * h * h + 2 * h * h * kv
    return attention + mlp + 4 * h, model.vocab_size * h


def _params_per_rank(space: SearchSpace, layout: ParallelLayout) -> float:
    """Parameters of the first stage's rank (its layers and the embedding)."""
    layer, embedding = _layer_params(space.model)
    return (space.model.num_layers / layout.pp * layer + embedding) / layout.tp


def _model_flops_per_token(space: SearchSpace) -> float:
    """Training flops per token (6 per parameter, plus causal attention), no recompute."""
    model = space.model
    layer, embedding = _layer_params(model)
    attention = 6 * model.num_layers * model.seq_length * model.hidden_size
    return 6 * (model.num_layers * layer + embedding) + attention


def _recompute_factor(layout: ParallelLayout) -> float:
    return {"none": 1.0, "selective": 1.03, "full": 4 / 3}.get(layout.recompute, 1.0)


def _rng(seed: int, layout: ParallelLayout, purpose: str) -> random.Random:
    digest = hashlib.sha256(f"{seed}:{layout.key()}:{purpose}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


TRUTHS: dict[str, type[Truth]] = {
    RescaledEstimate.name: RescaledEstimate,
    IndependentModel.name: IndependentModel,
    RandomField.name: RandomField,
    PublishedSweep.name: PublishedSweep,
    MemoryWall.name: MemoryWall,
    CostlyTensorParallel.name: CostlyTensorParallel,
}
MEMORY = {"as is": 1.0, "heavier": 1.2, "lighter": 0.85}


class TruthBackend:
    """A backend that answers each trial from a :class:`Truth`, at once, ``slots`` at a time."""

    name = "truth"

    def __init__(self, truth: Truth, slots: int = 1):
        self.truth = truth
        self._slots = slots
        self._running: list[tuple[int, str, TrialResult]] = []
        self._count = 0

    @property
    def capacity(self) -> int:
        return self._slots

    def free_slots(self) -> int:
        return self._slots - len(self._running)

    def submit(self, spec: TrialSpec) -> list[str]:
        if not self.free_slots():
            raise BackendError(f"truth backend: all {self._slots} slots are busy")
        result = self.truth.measure(spec.layout)
        result.hosts = ["truth"]
        heapq.heappush(self._running, (self._count, spec.trial_id, result))
        self._count += 1
        return ["truth"]

    def poll(self, timeout_s: float) -> list[Finished]:
        done = [Finished(trial_id, result) for _, trial_id, result in self._running]
        self._running = []
        return done

    def cancel(self, trial_id: str) -> None:
        self._running = [item for item in self._running if item[1] != trial_id]

    def close(self) -> None:
        self._running = []

    def describe(self) -> dict[str, Any]:
        truth = self.truth
        return {"truth": truth.name, "seed": truth.seed, "mem_factor": truth.mem_factor}
