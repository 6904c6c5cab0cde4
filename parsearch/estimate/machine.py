"""A machine profile: what was measured on a machine, in the estimate's terms.

The estimate's own constants (an efficiency cap, a small-GEMM curve, data-sheet bandwidths)
describe no real machine exactly; a profile replaces them with measurements where it has
them. Two kinds of profile share one format (read and written by
:mod:`parsearch.estimate.profile`):

* a **probed** profile (``parsearch probe``) holds the GEMM efficiency of the shapes the
  space's layouts run (:class:`GemmPoint`), an alpha-beta fit per collective and group
  placement, and the memory a rank holds before the model's tensors, for one allocation;
* a **device** profile (shipped under ``parsearch/profiles/``) holds published
  micro-benchmarks of one kind of device and node: the achieved TFLOP/s of GEMMs by shape
  (:class:`GemmShapePoint`, fitted to the estimate's GEMM curve), collective bandwidths and
  latencies within and across nodes, the memory usable per device and the memory bandwidth
  a streaming kernel reaches. It names no node count, so it fits any allocation of its node
  shape, and says where each figure came from (``source``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Where a collective's group lies on the allocation; the estimate picks one per group.
GROUP_KINDS = (
    "tp-intra-node",
    "tp-spanning-nodes",
    "dp-intra-node",
    "dp-across-nodes",
    "pp-p2p",
)
COLLECTIVE_OPS = ("all-reduce", "all-gather", "reduce-scatter", "send-recv")


def ring_volume(op: str, group: int) -> float:
    """Share of the buffer each rank sends in a ring algorithm over ``group`` ranks (a
    send/recv is one transfer of the whole buffer). A collective's *bus bandwidth*, as
    nccl-tests and rccl-tests print it, is this share of the buffer over the time."""
    if op == "send-recv":
        return 1.0
    share = (group - 1) / group
    return 2 * share if op == "all-reduce" else share


def ring_steps(op: str, group: int) -> float:
    """Sequential steps of that ring, each paying the link's latency."""
    if op == "send-recv":
        return 1.0
    return (2 if op == "all-reduce" else 1) * (group - 1)


@dataclass(frozen=True)
class GemmPoint:
    """Measured fraction of peak of one rank's transformer-layer matmuls at one shape."""

    tp: int
    mbs: int
    seq: int
    efficiency: float


@dataclass(frozen=True)
class GemmShapePoint:
    """Achieved TFLOP/s of one ``(m x k) @ (k x n)`` GEMM, as a vendor BLAS benchmark
    reports it (``2·m·n·k`` FLOPs over the kernel's time)."""

    m: int
    n: int
    k: int
    tflops: float

    @property
    def output_elements(self) -> float:
        return float(self.m * self.n)


@dataclass(frozen=True)
class GemmTiles:
    """How a device's BLAS cuts a GEMM: output tiles of ``tiles`` (rows x columns, the
    largest the library picks for big shapes), one tile per compute ``units`` at a time (SMs
    or CUs), and a K loop whose pipeline costs ``k_pipeline`` elements of K to fill and
    drain per tile. ``ceiling``: the efficiency of a perfectly filled wave with no pipeline
    loss, set from the profile's measured shapes (:func:`wave_ceiling`)."""

    tiles: tuple[tuple[int, int], ...]
    units: int
    k_pipeline: float
    ceiling: float = 1.0


def wave_efficiency(m: float, n: float, k: float, tiles: GemmTiles) -> float:
    """Fraction of the ceiling an ``(m x k) @ (k x n)`` GEMM reaches: tile quantisation
    (partial tiles at the edges compute in full) and wave quantisation (the last wave of
    ``ceil(tiles / units)`` leaves units idle), times the K loop's pipeline share
    ``k / (k + k_pipeline)``; the best of the device's tile shapes, as the library's
    heuristic picks. A hand-checkable case: 108 units, 128x128 tiles, ``m = n = 1536``:
    144 tiles in 2 waves, 144/216 = 2/3 of the units' time does work."""
    best = 0.0
    for rows, cols in tiles.tiles:
        count = math.ceil(m / rows) * math.ceil(n / cols)
        waves = math.ceil(count / tiles.units)
        best = max(best, m * n / (waves * tiles.units * rows * cols))
    return best * k / (k + tiles.k_pipeline)


def wave_ceiling(points: tuple[GemmShapePoint, ...], tiles: GemmTiles, peak: float) -> float:
    """The ceiling the measured shapes imply once their own quantisation is taken out: the
    mean over them of ``measured / (peak · wave_efficiency)``, at most 1."""
    if not points:
        raise ValueError("no GEMM shapes to fit")
    ceilings = [
        point.tflops * 1e12 / peak / wave_efficiency(point.m, point.n, point.k, tiles)
        for point in points
    ]
    return min(1.0, sum(ceilings) / len(ceilings))


@dataclass(frozen=True)
class CollectiveFit:
    """``time(bytes) = alpha_s + bytes * beta_s_per_byte`` for one op on one group kind;
    ``bytes`` is the message each rank contributes (the full buffer of an all-reduce)."""

    kind: str
    op: str
    group_size: int
    alpha_s: float
    beta_s_per_byte: float


# The figures a profile may state a range for (``uncertainty:``).
UNCERTAIN_FIGURES: dict[str, str] = {
    "gemm": "the GEMM rate (the curve's cap, or each probed point)",
    "gemm_pipeline": "the K loop's fill and drain per tile (gemm_tiles.k_pipeline)",
    "attention": "the fused attention rate (attention_tflops)",
    "memory_bandwidth": "the memory bandwidth a streaming kernel reaches",
    "collective_latency": "every collective's per-step latency",
    "node_links": "the bandwidth of collectives inside a node",
    "network": "the bandwidth of collectives and transfers across nodes",
    "moe_imbalance": "the busiest expert rank's tokens over the mean share (MoE models)",
}
# Figures whose high end makes a step slower (a latency, a load factor); the others are rates.
SLOW_WHEN_HIGH = frozenset({"collective_latency", "moe_imbalance", "gemm_pipeline"})
UNCERTAINTY_BASES = ("assumption", "single point", "data sheet")


@dataclass(frozen=True)
class FigureUncertainty:
    """A stated range for one figure: the true value lies in ``[low, high]`` times the
    figure as the profile writes it. ``measured``: values the profile's own sources
    measured for the figure, in the figure's unit (the band must contain them)."""

    figure: str
    low: float
    high: float
    basis: str
    reason: str
    measured: tuple[float, ...] = ()

    def slow(self) -> float:
        """The factor at the end that makes a step slower."""
        return self.high if self.figure in SLOW_WHEN_HIGH else self.low

    def fast(self) -> float:
        return self.low if self.figure in SLOW_WHEN_HIGH else self.high


@dataclass(frozen=True)
class MemoryBaseline:
    """What a rank holds besides the model's tensors, in the trainer's own measure."""

    context_bytes: float = 0.0
    communicator_bytes: float = 0.0
    allocator_reserve_fraction: float = 0.0


def fit_gemm_curve(
    points: tuple[GemmShapePoint, ...], peak_flops: float, default_half: float
) -> tuple[float, float]:
    """The estimate's GEMM curve ``cap · E / (E + half)`` (``E``: output elements) through
    measured shapes: ``(cap, half)``.

    ``1/efficiency = 1/cap + (half/cap) / E`` is linear in ``1/E``, so two or more shapes of
    different sizes give both by least squares; one shape (or shapes of one size, or a fit
    that comes out with a negative ``half``) keeps ``default_half`` and sets the cap
    through their mean. A hand-checkable case: one shape of ``E = half`` at efficiency
    0.4 gives ``cap = 0.8``."""
    if not points:
        raise ValueError("no GEMM shapes to fit")
    xs = [1.0 / point.output_elements for point in points]
    ys = [peak_flops / (point.tflops * 1e12) for point in points]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread > 0:
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
        intercept = mean_y - slope * mean_x
        if slope > 0 and intercept > 0:
            return 1.0 / intercept, slope / intercept
    caps = [y / (1 + default_half * x) for x, y in zip(xs, ys, strict=True)]
    return 1.0 / (sum(caps) / len(caps)), default_half


@dataclass(frozen=True)
class MachineProfile:
    """A probe's figures for one allocation shape and precision, or a device profile's
    published figures for one node shape (``nodes`` ``None``: any number of nodes)."""

    name: str
    nodes: int | None
    devices_per_node: int
    precision: str
    peak_flops_per_device: float
    gemm: tuple[GemmPoint, ...] = ()
    # Ranks of a node that can compute at once (CPU cores / threads per rank). Set by a
    # probe on CPU ranks only: a GPU rank computes on its own device, never shares it.
    compute_slots_per_node: int | None = None
    collectives: tuple[CollectiveFit, ...] = ()
    memory: MemoryBaseline = MemoryBaseline()
    source: str = ""
    path: str = ""
    gemm_shapes: tuple[GemmShapePoint, ...] = ()
    # The device's memory as a trainer can allocate it, and the bandwidth a streaming
    # kernel reaches (what element-wise layers and the optimizer step run at).
    device_memory_bytes: float | None = None
    memory_bandwidth_bytes_per_s: float | None = None
    # What a fused (flash) attention kernel reaches, forward and backward, FLOP/s.
    attention_flops: float | None = None
    # The dense FP8 tensor-core peak, FLOP/s (None: the device has no FP8 training; a space
    # searching ``precision: fp8`` needs it).
    fp8_peak_flops: float | None = None
    device: str = ""
    # Where each figure came from, one line per figure (a shipped profile's sources).
    sources: tuple[str, ...] = ()
    # Stated ranges of the figures that are assumptions, single points or data-sheet values
    # (:mod:`parsearch.estimate.band` turns them into a band around each prediction).
    uncertainty: tuple[FigureUncertainty, ...] = ()
    # The device's GEMM tiling (tile and wave quantisation by shape), when the profile gives it.
    gemm_tiles: GemmTiles | None = None

    def gemm_efficiency(self, tp: int, mbs: int, seq: int) -> float | None:
        """The measured efficiency at this shape, or at the nearest measured one with the same
        ``tp`` (by tokens per micro-batch, log scale); ``None`` when ``tp`` was not probed."""
        same_tp = [point for point in self.gemm if point.tp == tp]
        if not same_tp:
            return None
        tokens = mbs * seq
        nearest = min(same_tp, key=lambda point: abs(math.log2(point.mbs * point.seq / tokens)))
        return nearest.efficiency

    def collective(self, kind: str, op: str, group_size: int) -> CollectiveFit | None:
        """The fit for ``op`` on ``kind``, preferring the probed group size nearest this one."""
        fits = [fit for fit in self.collectives if fit.kind == kind and fit.op == op]
        if not fits:
            return None
        return min(fits, key=lambda fit: abs(fit.group_size - group_size))

    def compute_share(self, ranks_per_node: int) -> float:
        """Fraction of a rank's own compute speed it gets when every rank of its node
        computes (1.0 unless the node has fewer compute slots than ranks)."""
        if self.compute_slots_per_node is None:
            return 1.0
        return min(1.0, self.compute_slots_per_node / ranks_per_node)
