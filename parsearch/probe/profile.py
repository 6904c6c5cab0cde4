"""The machine profile's YAML form: a strict loader, a writer, and its use by a space.

A profile file looks like::

    name: machine-node01
    allocation: {nodes: 1, devices_per_node: 4, compute_slots_per_node: 2}
    precision: fp32
    peak_tflops: 0.05
    measured: {by: parsearch probe, backend: local, ...}   # free-form: how
    gemm:
      - {tp: 2, mbs: 4, seq: 128, efficiency: 0.41}
    collectives:
      - {kind: tp-intra-node, op: all-reduce, group_size: 2,
         latency: 85us, bandwidth: 1.2GB/s}
    memory: {context: 0B, communicator_buffers: 0B, allocator_reserve: 0.0}

``compute_slots_per_node`` (CPU ranks only) is how many ranks of a node can compute at once:
its cores over each rank's threads. ``latency`` + ``bytes / bandwidth`` is the alpha-beta fit
of one collective; ``memory`` is counted the way the trainer reports its peak (tensor bytes
for the built-in trainer on CPU). Every error names the file and the field and exits 2.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from parsearch.config import AllocationSpec
from parsearch.errors import SpaceError
from parsearch.estimate.machine import (
    COLLECTIVE_OPS,
    GROUP_KINDS,
    CollectiveFit,
    GemmPoint,
    MachineProfile,
    MemoryBaseline,
)
from parsearch.estimate.memory import EstimateSettings
from parsearch.units import parse_bytes, parse_rate

if TYPE_CHECKING:
    from parsearch.space import SearchSpace

_TOP_KEYS = (
    "name",
    "allocation",
    "precision",
    "peak_tflops",
    "measured",
    "gemm",
    "collectives",
    "memory",
)
_REQUIRED = ("allocation", "precision", "peak_tflops", "gemm", "collectives", "memory")
_PRECISIONS = ("bf16", "fp16", "fp32")
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(s|ms|us|ns)\s*$")
_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


class _Fields:
    """Field readers that raise :class:`SpaceError` naming the profile file and field."""

    def __init__(self, source: str):
        self.source = source

    def error(self, field: str, message: str) -> SpaceError:
        return SpaceError(message, source=self.source, field=field)

    def mapping(self, value: Any, field: str, keys: tuple[str, ...], required: tuple[str, ...]):
        if not isinstance(value, dict):
            raise self.error(field or "(top level)", f"must be a mapping, got {value!r}")
        unknown = sorted(set(value) - set(keys))
        if unknown:
            raise self.error(
                _join(field, unknown[0]), f"unknown field; valid fields: {', '.join(keys)}"
            )
        for key in required:
            if key not in value:
                raise self.error(_join(field, key), "missing (required)")
        return value

    def number(self, value: Any, field: str, *, low: float = 0.0, high: float | None = None):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(field, f"must be a number, got {value!r}")
        if value <= low or (high is not None and value > high):
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

    def size(self, value: Any, field: str) -> float:
        if value in (0, "0", "0B"):
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

    def items(self, value: Any, field: str) -> list[Any]:
        if not isinstance(value, list) or not value:
            raise self.error(field, f"must be a non-empty list, got {value!r}")
        return value


def profile_from_dict(data: Any, *, source: str = "<profile>") -> MachineProfile:
    """Validate an already-parsed profile (campaign settings keep it as a dict)."""
    read = _Fields(source)
    top = read.mapping(data, "", _TOP_KEYS, _REQUIRED)
    allocation = read.mapping(
        top["allocation"],
        "allocation",
        ("nodes", "devices_per_node", "compute_slots_per_node"),
        ("nodes", "devices_per_node"),
    )
    slots = allocation.get("compute_slots_per_node")
    gemm = []
    for index, item in enumerate(read.items(top["gemm"], "gemm")):
        where = f"gemm[{index}]"
        point = read.mapping(
            item,
            where,
            ("tp", "mbs", "seq", "efficiency", "seconds", "with_tp_seconds"),
            ("tp", "mbs", "seq", "efficiency"),
        )
        gemm.append(
            GemmPoint(
                tp=read.count(point["tp"], f"{where}.tp"),
                mbs=read.count(point["mbs"], f"{where}.mbs"),
                seq=read.count(point["seq"], f"{where}.seq"),
                efficiency=read.number(point["efficiency"], f"{where}.efficiency", high=1.0),
            )
        )
    collectives = []
    for index, item in enumerate(read.items(top["collectives"], "collectives")):
        where = f"collectives[{index}]"
        keys = ("kind", "op", "group_size", "latency", "bandwidth", "sizes", "times", "measured")
        fit = read.mapping(item, where, keys, keys[:5])
        collectives.append(
            CollectiveFit(
                kind=read.choice(fit["kind"], f"{where}.kind", GROUP_KINDS),
                op=read.choice(fit["op"], f"{where}.op", COLLECTIVE_OPS),
                group_size=read.count(fit["group_size"], f"{where}.group_size"),
                alpha_s=_nonnegative(read, fit["latency"], f"{where}.latency"),
                beta_s_per_byte=1.0 / read.rate(fit["bandwidth"], f"{where}.bandwidth"),
            )
        )
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
    name = top.get("name", Path(source).stem)
    measured = top.get("measured", {})
    return MachineProfile(
        name=str(name),
        nodes=read.count(allocation["nodes"], "allocation.nodes"),
        devices_per_node=read.count(allocation["devices_per_node"], "allocation.devices_per_node"),
        precision=read.choice(top["precision"], "precision", _PRECISIONS),
        peak_flops_per_device=1e12 * read.number(top["peak_tflops"], "peak_tflops"),
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
        source=yaml.safe_dump(measured, sort_keys=False).strip() if measured else "",
        path=source,
    )


def _nonnegative(read: _Fields, value: Any, field: str) -> float:
    if value in (0, "0"):
        return 0.0
    return read.duration(value, field)


def load_profile(path: str | Path) -> MachineProfile:
    """Read and validate a machine-profile YAML file."""
    source = str(path)
    try:
        data = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise SpaceError("machine profile not found", source=source) from None
    except OSError as error:
        raise SpaceError(f"cannot read: {error.strerror}", source=source) from None
    except yaml.YAMLError as error:
        raise SpaceError(f"not valid YAML: {error}", source=source) from None
    return profile_from_dict(data, source=source)


def profile_to_dict(
    profile: MachineProfile, measured: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The YAML form of ``profile`` (what :func:`profile_from_dict` reads back)."""
    data: dict[str, Any] = {
        "name": profile.name,
        "allocation": {"nodes": profile.nodes, "devices_per_node": profile.devices_per_node},
        "precision": profile.precision,
        "peak_tflops": profile.peak_flops_per_device / 1e12,
    }
    if profile.compute_slots_per_node is not None:
        data["allocation"]["compute_slots_per_node"] = profile.compute_slots_per_node
    if measured:
        data["measured"] = measured
    elif profile.source:
        data["measured"] = yaml.safe_load(profile.source)
    data["gemm"] = [dataclasses.asdict(point) for point in profile.gemm]
    data["collectives"] = [
        {
            "kind": fit.kind,
            "op": fit.op,
            "group_size": fit.group_size,
            "latency": f"{fit.alpha_s * 1e6:.4g}us",
            "bandwidth": f"{1.0 / fit.beta_s_per_byte / 1e9:.4g}GB/s",
        }
        for fit in profile.collectives
    ]
    data["memory"] = {
        "context": f"{profile.memory.context_bytes:.0f}B",
        "communicator_buffers": f"{profile.memory.communicator_bytes:.0f}B",
        "allocator_reserve": profile.memory.allocator_reserve_fraction,
    }
    return data


def check_profile(
    profile: MachineProfile, allocation: AllocationSpec, precision: str, *, source: str
) -> None:
    """Refuse a profile measured on another allocation shape or in another precision."""
    if (profile.nodes, profile.devices_per_node) != (allocation.nodes, allocation.devices_per_node):
        raise SpaceError(
            f"profile was measured on {profile.nodes} node(s) x {profile.devices_per_node} "
            f"device(s); the space's allocation is {allocation.nodes} x "
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
    """The estimate's settings using ``profile``: its GEMM figures (rescaled to the
    allocation's peak) replace the curve, and the best efficiency it measured becomes the
    cap the curve tends to elsewhere (logits, attention), so measured and modelled matmuls
    share one scale."""
    scale = profile.peak_flops_per_device / allocation.peak_flops_per_device
    gemm = tuple(
        dataclasses.replace(point, efficiency=point.efficiency * scale) for point in profile.gemm
    )
    profile = dataclasses.replace(
        profile, gemm=gemm, peak_flops_per_device=allocation.peak_flops_per_device
    )
    best = max(point.efficiency for point in gemm)
    return dataclasses.replace(settings, machine=profile, compute_efficiency=best)


def apply_profile(space: SearchSpace, path: str | Path) -> SearchSpace:
    """``space`` estimated with the profile at ``path`` (``run/plan --machine``)."""
    profile = load_profile(path)
    return space_with_profile(space, profile)


def space_with_profile(space: SearchSpace, profile: MachineProfile) -> SearchSpace:
    check_profile(profile, space.allocation, space.estimate.precision, source=profile.path)
    estimate = with_machine(space.estimate, profile, space.allocation)
    return dataclasses.replace(space, estimate=estimate)


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key
