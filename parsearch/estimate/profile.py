"""The machine profile's format: validation from its parsed form, the form written back,
and how the estimate's settings take it in. Pure (no YAML: :mod:`parsearch.profiles` reads
the files, ``parsearch probe`` writes them).

A profile looks like::

    name: machine-node01
    device: AMD Instinct MI250X, one GCD        # optional: what it describes
    allocation: {nodes: 1, devices_per_node: 4, compute_slots_per_node: 2}
    precision: fp32
    peak_tflops: 0.05
    memory_per_device: 64GiB                    # optional: usable by a trainer
    memory_bandwidth: 1.3TB/s                   # optional: what a streaming kernel reaches
    attention_tflops: 346                       # optional: fused attention, fwd+bwd
    fp8_peak_tflops: 1979                       # optional: dense FP8 peak (FP8 training)
    measured: {by: parsearch probe, backend: local, ...}   # free-form: how
    sources: [...]                              # optional: where each figure came from
    gemm_tiles: {tiles: [[128, 128]], units: 108, k_pipeline: 128}   # optional: by shape
    gemm:
      - {tp: 2, mbs: 4, seq: 128, efficiency: 0.41}     # a layer, probed at a space's shape
      - {m: 8192, n: 8192, k: 8192, tflops: 140.0}      # or one GEMM, from a benchmark
    collectives:
      - {kind: tp-intra-node, op: all-reduce, group_size: 2,
         latency: 85us, bandwidth: 1.2GB/s}             # or bus_bandwidth: (nccl-tests' busbw)
    memory: {context: 0B, communicator_buffers: 0B, allocator_reserve: 0.0}
    uncertainty:                                # optional: stated ranges (the band)
      gemm: {low: 0.8639, high: 1.0, basis: single point, reason: "...", measured: [127]}

``allocation.nodes`` may be left out: the profile then describes a node shape and fits any
number of nodes (a shipped device profile). ``gemm_tiles`` (the BLAS's output tile
shapes, the device's SMs or CUs and the K loop's pipeline fill in elements of K) times each
GEMM by its shape, tile and wave quantisation
(:func:`~parsearch.estimate.machine.wave_efficiency`). ``compute_slots_per_node`` (CPU
ranks only) is how many ranks of a node can compute at once. ``latency + bytes / bandwidth`` is the
alpha-beta fit of one collective (``bytes``: the buffer each rank contributes);
``bus_bandwidth`` is the same fit written as nccl-tests prints it, the ring's share of the
buffer per second, so ``bandwidth = bus_bandwidth / ring_volume``. ``memory`` is counted the
way the trainer reports its peak. ``uncertainty`` gives, for a figure that is an assumption,
a single point or a data-sheet value (``gemm``, ``attention``, ``memory_bandwidth``,
``collective_latency``, ``node_links``, ``network``), the factor range ``[low, high]`` on the
figure as written that its true value is stated to lie in, why, and what the profile's own
sources measured for it (``measured``, in the figure's unit: TFLOP/s, GB/s or us);
:mod:`parsearch.estimate.band` turns the ranges into a band. Every error names the file
and the field and exits 2.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from parsearch.config import AllocationSpec
from parsearch.errors import SpaceError
from parsearch.estimate.machine import (
    COLLECTIVE_OPS,
    GROUP_KINDS,
    UNCERTAIN_FIGURES,
    UNCERTAINTY_BASES,
    CollectiveFit,
    FigureUncertainty,
    GemmPoint,
    GemmShapePoint,
    GemmTiles,
    MachineProfile,
    MemoryBaseline,
    fit_gemm_curve,
    ring_volume,
    wave_ceiling,
)
from parsearch.estimate.memory import EstimateSettings
from parsearch.units import parse_bytes, parse_rate

_TOP_KEYS = (
    "name",
    "device",
    "allocation",
    "precision",
    "peak_tflops",
    "memory_per_device",
    "memory_bandwidth",
    "attention_tflops",
    "fp8_peak_tflops",
    "measured",
    "sources",
    "gemm",
    "collectives",
    "memory",
    "uncertainty",
    "gemm_tiles",
)
_REQUIRED = ("allocation", "precision", "peak_tflops", "gemm", "collectives", "memory")
_PRECISIONS = ("bf16", "fp16", "fp32")
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(s|ms|us|ns)\s*$")
_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_LAYER_KEYS = ("tp", "mbs", "seq", "efficiency", "seconds", "with_tp_seconds")
_SHAPE_KEYS = ("m", "n", "k", "tflops", "source")
_UNCERTAINTY_KEYS = ("low", "high", "basis", "reason", "measured")
_COLLECTIVE_KEYS = (
    "kind",
    "op",
    "group_size",
    "latency",
    "bandwidth",
    "bus_bandwidth",
    "sizes",
    "times",
    "measured",
    "source",
)


class _Fields:
    """Field readers that raise :class:`SpaceError` naming the profile file and field."""

    def __init__(self, source: str):
        self.source = source

    def error(self, field: str, message: str) -> SpaceError:
        return SpaceError(message, source=self.source, field=field)

    def mapping(self, value: Any, field: str, keys: tuple[str, ...], required: tuple[str, ...]):
        if not isinstance(value, dict):
            raise self.error(field or "(top level)", f"must be a mapping, got {value!r}")
        unknown = sorted(set(value) - set(keys), key=str)
        if unknown:
            raise self.error(
                _join(field, str(unknown[0])), f"unknown field; valid fields: {', '.join(keys)}"
            )
        for key in required:
            if key not in value:
                raise self.error(_join(field, key), "missing (required)")
        return value

    def number(self, value: Any, field: str, *, low: float = 0.0, high: float | None = None):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(field, f"must be a number, got {value!r}")
        if not value > low or (high is not None and value > high):  # NaN fails the first
            bound = f"in ({low:g}, {high:g}]" if high is not None else f"> {low:g}"
            raise self.error(field, f"must be {bound}, got {value!r}")
        return float(value)

    def count(self, value: Any, field: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.error(field, f"must be an integer >= 1, got {value!r}")
        return value

    def duration(self, value: Any, field: str) -> float:
        match = _DURATION.match(str(value)) if isinstance(value, str) else None
        if not match:
            raise self.error(
                field, f"must be a duration such as 85us, 1.2ms or 0.003s, got {value!r}"
            )
        return float(match.group(1)) * _SECONDS[match.group(2)]

    def rate(self, value: Any, field: str) -> float:
        if not isinstance(value, str) or not value.strip().lower().endswith("/s"):
            raise self.error(
                field, f"must be a bandwidth such as 1.2GB/s or 300GB/s, got {value!r}"
            )
        try:
            return parse_rate(value)
        except ValueError as error:
            raise self.error(field, str(error)) from None

    def size(self, value: Any, field: str, *, zero: bool = True) -> float:
        if zero and value in (0, "0", "0B"):
            return 0.0
        if not isinstance(value, str):
            raise self.error(
                field, f"must be a size with its unit such as 0B, 512MiB or 1GiB, got {value!r}"
            )
        try:
            return float(parse_bytes(value))
        except ValueError as error:
            raise self.error(field, str(error)) from None

    def choice(self, value: Any, field: str, valid: tuple[str, ...]) -> str:
        if value not in valid:
            raise self.error(field, f"must be one of {list(valid)}, got {value!r}")
        return str(value)

    def items(self, value: Any, field: str, *, empty: bool = False) -> list[Any]:
        if not isinstance(value, list) or not (value or empty):
            kind = "a list" if empty else "a non-empty list"
            raise self.error(field, f"must be {kind}, got {value!r}")
        return value

    def text(self, value: Any, field: str) -> str:
        if not isinstance(value, str) or not value.strip() or len(value) > 2000:
            raise self.error(field, f"must be a non-empty line of text, got {value!r}")
        return value.strip()


def profile_from_dict(data: Any, *, source: str = "<profile>") -> MachineProfile:
    """Validate an already-parsed profile (campaign settings keep it as a dict)."""
    read = _Fields(source)
    top = read.mapping(data, "", _TOP_KEYS, _REQUIRED)
    allocation = read.mapping(
        top["allocation"],
        "allocation",
        ("nodes", "devices_per_node", "compute_slots_per_node"),
        ("devices_per_node",),
    )
    slots = allocation.get("compute_slots_per_node")
    peak = 1e12 * read.number(top["peak_tflops"], "peak_tflops")
    gemm, shapes = _gemm(read, top["gemm"], peak)
    collectives = [
        _collective(read, item, f"collectives[{index}]")
        # A single device has no groups to measure: a probe of one writes none.
        for index, item in enumerate(read.items(top["collectives"], "collectives", empty=True))
    ]
    memory = read.mapping(
        top["memory"],
        "memory",
        ("context", "communicator_buffers", "allocator_reserve"),
        ("context", "communicator_buffers", "allocator_reserve"),
    )
    reserve = memory["allocator_reserve"]
    if isinstance(reserve, bool) or not isinstance(reserve, int | float) or not 0 <= reserve < 1:
        raise read.error(
            "memory.allocator_reserve", f"must be a fraction in [0, 1), got {reserve!r}"
        )
    sources = top.get("sources", [])
    if not isinstance(sources, list):
        raise read.error("sources", f"must be a list of lines, got {sources!r}")
    name = top.get("name", Path(source).stem)
    measured = top.get("measured", {})
    return MachineProfile(
        name=str(name),
        nodes=None
        if "nodes" not in allocation
        else read.count(allocation["nodes"], "allocation.nodes"),
        devices_per_node=read.count(allocation["devices_per_node"], "allocation.devices_per_node"),
        precision=read.choice(top["precision"], "precision", _PRECISIONS),
        peak_flops_per_device=peak,
        gemm=tuple(gemm),
        compute_slots_per_node=(
            None if slots is None else read.count(slots, "allocation.compute_slots_per_node")
        ),
        collectives=tuple(collectives),
        memory=MemoryBaseline(
            context_bytes=read.size(memory["context"], "memory.context"),
            communicator_bytes=read.size(
                memory["communicator_buffers"], "memory.communicator_buffers"
            ),
            allocator_reserve_fraction=float(reserve),
        ),
        source=_measured_text(measured),
        path=source,
        gemm_shapes=tuple(shapes),
        device_memory_bytes=(
            read.size(top["memory_per_device"], "memory_per_device", zero=False)
            if "memory_per_device" in top
            else None
        ),
        memory_bandwidth_bytes_per_s=(
            read.rate(top["memory_bandwidth"], "memory_bandwidth")
            if "memory_bandwidth" in top
            else None
        ),
        attention_flops=(
            1e12 * read.number(top["attention_tflops"], "attention_tflops", high=peak / 1e12)
            if "attention_tflops" in top
            else None
        ),
        fp8_peak_flops=(
            1e12 * read.number(top["fp8_peak_tflops"], "fp8_peak_tflops")
            if "fp8_peak_tflops" in top
            else None
        ),
        device=read.text(top["device"], "device") if "device" in top else "",
        sources=tuple(read.text(line, f"sources[{i}]") for i, line in enumerate(sources)),
        uncertainty=_uncertainty(read, top.get("uncertainty", {})),
        gemm_tiles=_gemm_tiles(read, top["gemm_tiles"]) if "gemm_tiles" in top else None,
    )


def _gemm_tiles(read: _Fields, value: Any) -> GemmTiles:
    """``gemm_tiles: {tiles: [[rows, cols], ...], units, k_pipeline}``."""
    entry = read.mapping(
        value, "gemm_tiles", ("tiles", "units", "k_pipeline"), ("tiles", "units", "k_pipeline")
    )
    tiles = []
    for index, tile in enumerate(read.items(entry["tiles"], "gemm_tiles.tiles")):
        where = f"gemm_tiles.tiles[{index}]"
        if not isinstance(tile, list) or len(tile) != 2:
            raise read.error(where, f"must be [rows, cols], got {tile!r}")
        tiles.append((read.count(tile[0], where), read.count(tile[1], where)))
    return GemmTiles(
        tiles=tuple(tiles),
        units=read.count(entry["units"], "gemm_tiles.units"),
        k_pipeline=read.number(entry["k_pipeline"], "gemm_tiles.k_pipeline"),
    )


def _uncertainty(read: _Fields, value: Any) -> tuple[FigureUncertainty, ...]:
    """``uncertainty: {FIGURE: {low, high, basis, reason, measured}}``: a stated range for
    each figure that is an assumption, a single point or a data-sheet value."""
    figures = read.mapping(value, "uncertainty", tuple(UNCERTAIN_FIGURES), ())
    items = []
    for figure, entry in figures.items():
        where = f"uncertainty.{figure}"
        entry = read.mapping(entry, where, _UNCERTAINTY_KEYS, ("low", "high", "basis", "reason"))
        low = read.number(entry["low"], f"{where}.low")
        high = read.number(entry["high"], f"{where}.high")
        if not low <= 1.0 <= high:
            raise read.error(
                f"{where}.low",
                f"the range is a factor on the figure as written: low <= 1 <= high, "
                f"got [{low:g}, {high:g}]",
            )
        measured = read.items(entry.get("measured", []), f"{where}.measured", empty=True)
        items.append(
            FigureUncertainty(
                figure=figure,
                low=low,
                high=high,
                basis=read.choice(entry["basis"], f"{where}.basis", UNCERTAINTY_BASES),
                reason=read.text(entry["reason"], f"{where}.reason"),
                measured=tuple(
                    read.number(item, f"{where}.measured[{i}]") for i, item in enumerate(measured)
                ),
            )
        )
    return tuple(items)


def _gemm(read: _Fields, value: Any, peak: float) -> tuple[list[GemmPoint], list[GemmShapePoint]]:
    """A probe's layer points and a benchmark's GEMM shapes, in any mix."""
    points, shapes = [], []
    for index, item in enumerate(read.items(value, "gemm")):
        where = f"gemm[{index}]"
        if isinstance(item, dict) and "tflops" in item:
            shape = read.mapping(item, where, _SHAPE_KEYS, ("m", "n", "k", "tflops"))
            tflops = read.number(shape["tflops"], f"{where}.tflops", high=peak / 1e12)
            shapes.append(
                GemmShapePoint(
                    m=read.count(shape["m"], f"{where}.m"),
                    n=read.count(shape["n"], f"{where}.n"),
                    k=read.count(shape["k"], f"{where}.k"),
                    tflops=tflops,
                )
            )
            continue
        point = read.mapping(item, where, _LAYER_KEYS, ("tp", "mbs", "seq", "efficiency"))
        points.append(
            GemmPoint(
                tp=read.count(point["tp"], f"{where}.tp"),
                mbs=read.count(point["mbs"], f"{where}.mbs"),
                seq=read.count(point["seq"], f"{where}.seq"),
                efficiency=read.number(point["efficiency"], f"{where}.efficiency", high=1.0),
            )
        )
    return points, shapes


def _collective(read: _Fields, item: Any, where: str) -> CollectiveFit:
    fit = read.mapping(item, where, _COLLECTIVE_KEYS, ("kind", "op", "group_size", "latency"))
    kind = read.choice(fit["kind"], f"{where}.kind", GROUP_KINDS)
    op = read.choice(fit["op"], f"{where}.op", COLLECTIVE_OPS)
    group = read.count(fit["group_size"], f"{where}.group_size")
    if ("bandwidth" in fit) == ("bus_bandwidth" in fit):
        raise read.error(f"{where}.bandwidth", "give one of bandwidth or bus_bandwidth")
    if "bandwidth" in fit:
        beta = 1.0 / read.rate(fit["bandwidth"], f"{where}.bandwidth")
    else:
        bus = read.rate(fit["bus_bandwidth"], f"{where}.bus_bandwidth")
        if op != "send-recv" and group < 2:
            raise read.error(f"{where}.group_size", "a bus bandwidth needs a group of >= 2")
        beta = ring_volume(op, group) / bus
    return CollectiveFit(
        kind=kind,
        op=op,
        group_size=group,
        alpha_s=_nonnegative(read, fit["latency"], f"{where}.latency"),
        beta_s_per_byte=beta,
    )


def _measured_text(measured: Any) -> str:
    """The free-form ``measured`` section, kept as JSON text so the profile stays hashable
    and :func:`profile_to_dict` gives it back as written."""
    return json.dumps(measured, default=str) if measured else ""


def _nonnegative(read: _Fields, value: Any, field: str) -> float:
    if value in (0, "0"):
        return 0.0
    return read.duration(value, field)


def profile_to_dict(
    profile: MachineProfile, measured: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The form of ``profile`` that :func:`profile_from_dict` reads back."""
    data: dict[str, Any] = {"name": profile.name}
    if profile.device:
        data["device"] = profile.device
    data["allocation"] = {"devices_per_node": profile.devices_per_node}
    if profile.nodes is not None:
        data["allocation"] = {"nodes": profile.nodes, **data["allocation"]}
    data["precision"] = profile.precision
    data["peak_tflops"] = profile.peak_flops_per_device / 1e12
    if profile.compute_slots_per_node is not None:
        data["allocation"]["compute_slots_per_node"] = profile.compute_slots_per_node
    if profile.device_memory_bytes is not None:
        data["memory_per_device"] = f"{profile.device_memory_bytes:.0f}B"
    if profile.memory_bandwidth_bytes_per_s is not None:
        data["memory_bandwidth"] = f"{profile.memory_bandwidth_bytes_per_s / 1e9:.6g}GB/s"
    if profile.attention_flops is not None:
        data["attention_tflops"] = profile.attention_flops / 1e12
    if profile.fp8_peak_flops is not None:
        data["fp8_peak_tflops"] = profile.fp8_peak_flops / 1e12
    if measured:
        data["measured"] = measured
    elif profile.source:
        data["measured"] = json.loads(profile.source)
    if profile.sources:
        data["sources"] = list(profile.sources)
    data["gemm"] = [dataclasses.asdict(point) for point in profile.gemm] + [
        dataclasses.asdict(shape) for shape in profile.gemm_shapes
    ]
    data["collectives"] = [
        {
            "kind": fit.kind,
            "op": fit.op,
            "group_size": fit.group_size,
            "latency": f"{fit.alpha_s * 1e6:.6g}us",
            "bandwidth": f"{1.0 / fit.beta_s_per_byte / 1e9:.6g}GB/s",
        }
        for fit in profile.collectives
    ]
    data["memory"] = {
        "context": f"{profile.memory.context_bytes:.0f}B",
        "communicator_buffers": f"{profile.memory.communicator_bytes:.0f}B",
        "allocator_reserve": profile.memory.allocator_reserve_fraction,
    }
    if profile.gemm_tiles is not None:
        data["gemm_tiles"] = {
            "tiles": [list(tile) for tile in profile.gemm_tiles.tiles],
            "units": profile.gemm_tiles.units,
            "k_pipeline": profile.gemm_tiles.k_pipeline,
        }
    if profile.uncertainty:
        data["uncertainty"] = {
            item.figure: {
                "low": item.low,
                "high": item.high,
                "basis": item.basis,
                "reason": item.reason,
                **({"measured": list(item.measured)} if item.measured else {}),
            }
            for item in profile.uncertainty
        }
    return data


def check_profile(
    profile: MachineProfile, allocation: AllocationSpec, precision: str, *, source: str
) -> None:
    """Refuse a profile measured on another allocation (or node) shape or in another
    precision."""
    nodes = allocation.nodes if profile.nodes is None else profile.nodes
    if (nodes, profile.devices_per_node) != (allocation.nodes, allocation.devices_per_node):
        shape = (
            f"{profile.nodes} node(s) x {profile.devices_per_node} device(s)"
            if profile.nodes is not None
            else f"nodes of {profile.devices_per_node} device(s)"
        )
        raise SpaceError(
            f"profile was measured on {shape}; the space's allocation is {allocation.nodes} x "
            f"{allocation.devices_per_node}: probe this allocation (`parsearch probe`)",
            source=source,
            field="allocation",
        )
    if profile.precision != precision:
        raise SpaceError(
            f"profile was measured in {profile.precision}; the space's estimate uses "
            f"{precision}: probe in {precision}",
            source=source,
            field="precision",
        )


def with_machine(
    settings: EstimateSettings, profile: MachineProfile, allocation: AllocationSpec
) -> EstimateSettings:
    """The estimate's settings using ``profile``, its figures on the allocation's peak.

    A probe's layer points (rescaled to the allocation's peak) replace the curve for the
    layer's matmuls, and the best of them becomes the cap the curve tends to elsewhere
    (logits, attention), so measured and modelled matmuls share one scale. A benchmark's
    GEMM shapes set the curve itself: its cap and its half-efficiency size
    (:func:`~parsearch.estimate.machine.fit_gemm_curve`), and with ``gemm_tiles`` the
    ceiling of a full wave (:func:`~parsearch.estimate.machine.wave_ceiling`)."""
    scale = profile.peak_flops_per_device / allocation.peak_flops_per_device
    gemm = tuple(
        dataclasses.replace(point, efficiency=point.efficiency * scale) for point in profile.gemm
    )
    profile = dataclasses.replace(
        profile, gemm=gemm, peak_flops_per_device=allocation.peak_flops_per_device
    )
    changes: dict[str, Any] = {"machine": profile}
    if profile.gemm_shapes:
        cap, half = fit_gemm_curve(
            profile.gemm_shapes,
            allocation.peak_flops_per_device,
            settings.gemm_half_efficiency_elements,
        )
        changes.update(compute_efficiency=min(cap, 1.0), gemm_half_efficiency_elements=half)
    if profile.gemm_tiles is not None:
        ceiling = (
            wave_ceiling(profile.gemm_shapes, profile.gemm_tiles, allocation.peak_flops_per_device)
            if profile.gemm_shapes
            else changes.get("compute_efficiency", settings.compute_efficiency)
        )
        tiles = dataclasses.replace(profile.gemm_tiles, ceiling=ceiling)
        changes["machine"] = dataclasses.replace(profile, gemm_tiles=tiles)
    if gemm:
        changes["compute_efficiency"] = max(point.efficiency for point in gemm)
    return dataclasses.replace(settings, **changes)


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key
