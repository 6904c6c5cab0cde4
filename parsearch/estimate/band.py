"""The band: what a machine profile's stated uncertainty makes of a prediction.

A shipped device profile takes some figures from a data sheet, one from a single GEMM
shape, and its latencies are assumptions. Each such figure may carry a stated range in
the profile (``uncertainty:``, a factor ``[low, high]`` on the figure as written, with the
reason and its basis: ``assumption``, ``single point`` or ``data sheet``). The band of a
layout is the lowest and the highest throughput over the box those ranges span.

Why the corners, and not a propagated distribution: the ranges are bounds someone stated,
not measured spreads, so there is no distribution to propagate; and the predicted step
time is monotone in every figure (non-increasing in each rate, non-decreasing in each
latency: every part of :func:`~parsearch.estimate.timing.predict` is a sum, a max or a
product of such terms), so the lowest throughput over the box is at its slow corner (every
rate at its low end, every latency and the experts' load imbalance at its high end) and the
highest at its fast corner (``tests/test_band.py`` checks interior points against the
corners). Taking every figure at its worst at once is the widest honest reading of
independent bounds; a user who wants a narrower band states narrower ranges in the
profile, with their sources.

The band lasts until a campaign measures a trial: from then on the campaign's calibrated
estimate (:class:`~parsearch.search.calibration.CalibratedEstimate`) re-weights the
prediction from its own measurements, and that replaces the band.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from parsearch.config import AllocationSpec, ModelSpec, ParallelLayout
from parsearch.estimate.machine import CollectiveFit, MachineProfile
from parsearch.estimate.memory import EstimateSettings
from parsearch.estimate.timing import Prediction, predict

_INTRA = ("tp-intra-node", "dp-intra-node")


def scaled_settings(settings: EstimateSettings, factors: dict[str, float]) -> EstimateSettings:
    """``settings`` (already carrying a profile, :func:`~parsearch.estimate.profile.
    with_machine`) with each named figure multiplied by its factor (a rate's factor > 1 is
    faster, a latency's, the experts' load imbalance's or the GEMM pipeline's slower). A GEMM
    or attention rate never passes the peak."""
    machine = settings.machine
    if machine is None:
        raise ValueError("the band needs a machine profile")
    changes: dict[str, object] = {}
    gemm = factors.get("gemm", 1.0)
    latency = factors.get("collective_latency", 1.0)
    links, network = factors.get("node_links", 1.0), factors.get("network", 1.0)
    changes["compute_efficiency"] = min(settings.compute_efficiency * gemm, 1.0)
    changes["collective_latency_s"] = settings.collective_latency_s * latency
    changes["moe_imbalance"] = settings.moe_imbalance * factors.get("moe_imbalance", 1.0)
    machine_changes: dict[str, object] = {
        "gemm": tuple(
            dataclasses.replace(point, efficiency=min(point.efficiency * gemm, 1.0))
            for point in machine.gemm
        ),
        "collectives": tuple(
            _scaled_fit(fit, latency, links if fit.kind in _INTRA else network)
            for fit in machine.collectives
        ),
    }
    if machine.gemm_tiles is not None:
        machine_changes["gemm_tiles"] = dataclasses.replace(
            machine.gemm_tiles,
            ceiling=min(machine.gemm_tiles.ceiling * gemm, 1.0),
            k_pipeline=machine.gemm_tiles.k_pipeline * factors.get("gemm_pipeline", 1.0),
        )
    if machine.attention_flops is not None:
        machine_changes["attention_flops"] = min(
            machine.attention_flops * factors.get("attention", 1.0),
            machine.peak_flops_per_device,
        )
    if machine.memory_bandwidth_bytes_per_s is not None:
        machine_changes["memory_bandwidth_bytes_per_s"] = (
            machine.memory_bandwidth_bytes_per_s * factors.get("memory_bandwidth", 1.0)
        )
    changes["machine"] = dataclasses.replace(machine, **machine_changes)
    return dataclasses.replace(settings, **changes)


def scaled_allocation(allocation: AllocationSpec, factors: dict[str, float]) -> AllocationSpec:
    """The allocation's own bandwidths (what the estimate falls back to where the profile
    has no fit for a group) under the same factors."""
    return dataclasses.replace(
        allocation,
        intra_node_bandwidth_bytes_per_s=allocation.intra_node_bandwidth_bytes_per_s
        * factors.get("node_links", 1.0),
        inter_node_bandwidth_bytes_per_s=allocation.inter_node_bandwidth_bytes_per_s
        * factors.get("network", 1.0),
        memory_bandwidth_bytes_per_s=allocation.memory_bandwidth_bytes_per_s
        * factors.get("memory_bandwidth", 1.0),
    )


def _scaled_fit(fit: CollectiveFit, latency: float, bandwidth: float) -> CollectiveFit:
    return dataclasses.replace(
        fit, alpha_s=fit.alpha_s * latency, beta_s_per_byte=fit.beta_s_per_byte / bandwidth
    )


def corner(profile: MachineProfile, end: str) -> dict[str, float]:
    """The factors of the ``slow`` or ``fast`` corner of the profile's stated ranges."""
    if end not in ("slow", "fast"):
        raise ValueError(f"end must be slow or fast, got {end!r}")
    return {
        item.figure: item.slow() if end == "slow" else item.fast() for item in profile.uncertainty
    }


@dataclass(frozen=True)
class Band:
    """A layout's predicted throughput at the slow and fast corners (``low`` <= nominal
    <= ``high``)."""

    tokens_per_s_low: float
    tokens_per_s_high: float
    mfu_low: float
    mfu_high: float

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


def predict_scaled(
    model: ModelSpec,
    layout: ParallelLayout,
    allocation: AllocationSpec,
    settings: EstimateSettings,
    factors: dict[str, float],
    schedule: str = "1f1b",
) -> Prediction:
    """The prediction with the profile's figures (and the allocation's own bandwidths)
    scaled by ``factors``: one point of the box the stated ranges span."""
    return predict(
        model,
        layout,
        scaled_allocation(allocation, factors),
        scaled_settings(settings, factors),
        schedule,
    )


def predict_band(
    model: ModelSpec,
    layout: ParallelLayout,
    allocation: AllocationSpec,
    settings: EstimateSettings,
    schedule: str = "1f1b",
) -> Band | None:
    """The band of ``layout`` (``None`` when the settings' profile states no uncertainty)."""
    machine = settings.machine
    if machine is None or not machine.uncertainty:
        return None
    slow, fast = (
        predict_scaled(model, layout, allocation, settings, corner(machine, end), schedule)
        for end in ("slow", "fast")
    )
    # MFU is on the allocation's (unscaled) peak, which scaled_allocation keeps.
    return Band(slow.tokens_per_s, fast.tokens_per_s, slow.mfu, fast.mfu)
