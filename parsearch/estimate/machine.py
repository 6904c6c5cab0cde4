"""A machine profile: what a probe measured on the allocation, in the estimate's terms.

The estimate's own constants (an efficiency cap, a small-GEMM curve, data-sheet bandwidths)
describe no real machine exactly; a profile replaces them with measurements where it has
them: the GEMM efficiency of the shapes the space's layouts run, an alpha-beta fit per
collective and group placement, and the memory a rank holds before the model's tensors.
Pure data: the YAML loader lives in :mod:`parsearch.probe.profile`.
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


@dataclass(frozen=True)
class GemmPoint:
    """Measured fraction of peak of one rank's transformer-layer matmuls at one shape."""

    tp: int
    mbs: int
    seq: int
    efficiency: float


@dataclass(frozen=True)
class CollectiveFit:
    """``time(bytes) = alpha_s + bytes * beta_s_per_byte`` for one op on one group kind;
    ``bytes`` is the message each rank contributes (the full buffer of an all-reduce)."""

    kind: str
    op: str
    group_size: int
    alpha_s: float
    beta_s_per_byte: float


@dataclass(frozen=True)
class MemoryBaseline:
    """What a rank holds besides the model's tensors, in the trainer's own measure."""

    context_bytes: float = 0.0
    communicator_bytes: float = 0.0
    allocator_reserve_fraction: float = 0.0


@dataclass(frozen=True)
class MachineProfile:
    """A probe's figures for one allocation shape and precision."""

    name: str
    nodes: int
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
