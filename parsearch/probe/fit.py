"""From a probe's raw timings to a :class:`~parsearch.estimate.machine.MachineProfile`."""

from __future__ import annotations

from typing import Any

from parsearch.estimate.machine import CollectiveFit, GemmPoint, MachineProfile, MemoryBaseline
from parsearch.space import SearchSpace


def alpha_beta(sizes: list[float], times: list[float]) -> tuple[float, float]:
    """``time ≈ alpha + size·beta``, least squares on relative error (each message size
    counts alike, small ones fix ``alpha``, large ones ``beta``); ``alpha >= 0``, ``beta > 0``."""
    weights = [1.0 / t**2 for t in times]
    sw = sum(weights)
    sx = sum(w * x for w, x in zip(weights, sizes, strict=True))
    sy = sum(w * y for w, y in zip(weights, times, strict=True))
    sxx = sum(w * x * x for w, x in zip(weights, sizes, strict=True))
    sxy = sum(w * x * y for w, x, y in zip(weights, sizes, times, strict=True))
    det = sw * sxx - sx * sx
    beta = (sw * sxy - sx * sy) / det if det > 0 else 0.0
    alpha = (sy - beta * sx) / sw
    if alpha < 0 or beta <= 0:
        # A fit through the origin (no latency), or pure latency when size does not matter.
        beta = max(sxy / sxx if sxx > 0 else 0.0, 1e-15)
        alpha = max(0.0, (sy - beta * sx) / sw) if alpha < 0 else alpha
    return alpha, beta


def fit_profile(space: SearchSpace, measured: dict[str, Any], name: str) -> MachineProfile:
    """The profile of ``space``'s allocation from the rank program's ``metrics["probe"]``."""
    gemm = tuple(
        GemmPoint(tp=p["tp"], mbs=p["mbs"], seq=p["seq"], efficiency=min(1.0, p["efficiency"]))
        for p in measured["gemm"]
    )
    entries = tp_in_situ(space, measured["gemm"]) + measured["collectives"]
    collectives, seen = [], set()
    for entry in entries:  # an in-situ TP all-reduce replaces the back-to-back one
        key = (entry["kind"], entry["op"], entry["group_size"])
        if key in seen:
            continue
        seen.add(key)
        alpha, beta = alpha_beta(entry["sizes"], entry["times"])
        collectives.append(CollectiveFit(*key, alpha, beta))
    memory = measured["memory"]
    return MachineProfile(
        name=name,
        nodes=space.allocation.nodes,
        devices_per_node=space.allocation.devices_per_node,
        precision=space.estimate.precision,
        peak_flops_per_device=space.allocation.peak_flops_per_device,
        gemm=gemm,
        compute_slots_per_node=measured.get("compute_slots"),
        collectives=tuple(collectives),
        memory=MemoryBaseline(
            context_bytes=memory["context"],
            communicator_bytes=memory["communicator_buffers"],
            allocator_reserve_fraction=memory["allocator_reserve"],
        ),
    )


def tp_in_situ(space: SearchSpace, gemm: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """TP all-reduce cost per call from the layer timed with and without its four
    all-reduces, one point per micro-batch size (the activation's bytes)."""
    e = {"bf16": 2, "fp16": 2, "fp32": 4}[space.estimate.precision]
    model, per_node = space.model, space.allocation.devices_per_node
    by_tp: dict[int, list[tuple[int, float]]] = {}
    for point in gemm:
        if "with_tp_seconds" in point:
            size = point["mbs"] * model.seq_length * model.hidden_size * e
            cost = max((point["with_tp_seconds"] - point["seconds"]) / 4, 1e-7)
            by_tp.setdefault(point["tp"], []).append((size, cost))
    return [
        {
            "kind": "tp-intra-node" if tp <= per_node else "tp-spanning-nodes",
            "op": "all-reduce",
            "group_size": tp,
            "sizes": [size for size, _ in sorted(points)],
            "times": [cost for _, cost in sorted(points)],
            "in_situ": True,
        }
        for tp, points in sorted(by_tp.items())
    ]
