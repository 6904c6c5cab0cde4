"""What a probe measures for a space: the shapes and groups its layouts will use.

Pure Python (no torch): the driver side builds a :class:`ProbePlan` from the space, ships it
inside the probe's :class:`~parsearch.trial.TrialSpec` (``trainer: {kind: probe, probe:
...}``), and every rank reads it back, so all ranks create the same groups in the same order.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from parsearch.config import ParallelLayout
from parsearch.estimate.flops import layer_params
from parsearch.space import SearchSpace
from parsearch.trial import TrialSpec

PROBE_KIND = "probe"
_ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
MIN_MESSAGE_BYTES = 4 * 1024
MAX_MESSAGE_BYTES = 64 * 2**20


@dataclass(frozen=True)
class GroupPattern:
    """Collectives over a partition of the world into groups of ``size`` ranks.

    ``stride`` 1: consecutive ranks (a TP group, innermost in Megatron's order); larger: every
    ``stride``-th rank (a DP group). ``ops`` are timed at every size in ``sizes`` (bytes of
    the full buffer), all groups at once, as a step of training runs them."""

    kind: str
    size: int
    stride: int
    ops: tuple[str, ...]
    sizes: tuple[int, ...]

    def groups(self, world: int) -> list[list[int]]:
        block = self.size * self.stride
        return [
            [start + offset + i * self.stride for i in range(self.size)]
            for start in range(0, world, block)
            for offset in range(self.stride)
        ]


@dataclass(frozen=True)
class ProbePlan:
    """Everything the probe's ranks run, as plain data."""

    precision: str
    gemm_shapes: tuple[tuple[int, int], ...]  # (tp, mbs)
    patterns: tuple[GroupPattern, ...]
    p2p_sizes: tuple[int, ...]
    peak_flops_per_device: float
    min_time_s: float = 0.02
    rounds: int = 5
    collective_rounds: int = 3
    repeats: dict[str, int] = field(default_factory=lambda: {"warmup": 1, "max": 30})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProbePlan:
        return cls(
            precision=data["precision"],
            gemm_shapes=tuple(tuple(shape) for shape in data["gemm_shapes"]),
            patterns=tuple(
                GroupPattern(
                    kind=p["kind"],
                    size=p["size"],
                    stride=p["stride"],
                    ops=tuple(p["ops"]),
                    sizes=tuple(p["sizes"]),
                )
                for p in data["patterns"]
            ),
            p2p_sizes=tuple(data["p2p_sizes"]),
            peak_flops_per_device=float(data["peak_flops_per_device"]),
            min_time_s=float(data["min_time_s"]),
            rounds=int(data["rounds"]),
            collective_rounds=int(data["collective_rounds"]),
            repeats=dict(data["repeats"]),
        )


def _message_sizes(largest: float) -> tuple[int, ...]:
    """Powers of four from 4 KiB up to the largest message a layout sends (at most 64 MiB)."""
    top = min(max(largest, 16 * MIN_MESSAGE_BYTES), MAX_MESSAGE_BYTES)
    sizes, size = [], MIN_MESSAGE_BYTES
    while size < top:
        sizes.append(size)
        size *= 4
    return (*sizes, int(top))


def plan_for(space: SearchSpace) -> ProbePlan:
    """The probe of ``space``: a layer's work at every (tp, mbs) its runnable layouts use,
    collectives over the TP and DP groups they form, and pipeline transfers."""
    layouts: list[ParallelLayout] = [layout for layout, _ in space.plan().feasible]
    layouts += [layout for layout, _ in space.plan().predicted_oom]
    if not layouts:
        raise ValueError("the space has no layout that divides: nothing to probe")
    model, allocation = space.model, space.allocation
    per_node, world = allocation.devices_per_node, allocation.world_size
    e = _ELEMENT_BYTES[space.estimate.precision]
    activation = {
        layout.mbs: model.seq_length * layout.mbs * model.hidden_size * e for layout in layouts
    }
    gemm_shapes = sorted({(layout.tp, layout.mbs) for layout in layouts})
    # TP all-reduces are timed in situ with the layer (see parsearch.probe.rank); what is
    # left for back-to-back collectives: a hierarchical TP's intra-node steps, DP groups.
    patterns: list[GroupPattern] = []
    if any(layout.tp > per_node for layout in layouts):
        pieces = _message_sizes(max(activation.values()))
        patterns.append(
            GroupPattern("tp-intra-node", per_node, 1, ("all-gather", "reduce-scatter"), pieces)
        )
    grads = max(
        model.num_layers // layout.pp * layer_params(model) / layout.tp * 4 for layout in layouts
    )
    sharded = any(layout.zero_stage for layout in layouts)
    ops = ("all-reduce", "all-gather", "reduce-scatter") if sharded else ("all-reduce",)
    for tp, dp in sorted({(layout.tp, layout.dp) for layout in layouts if layout.dp > 1}):
        kind = "dp-intra-node" if tp * dp <= per_node else "dp-across-nodes"
        if not any((p.kind, p.size) == (kind, dp) for p in patterns):
            patterns.append(GroupPattern(kind, dp, tp, ops, _message_sizes(grads)))
    p2p = (
        _message_sizes(max(activation.values()))
        if any(layout.pp > 1 for layout in layouts) and world > 1
        else ()
    )
    return ProbePlan(
        precision=space.estimate.precision,
        gemm_shapes=tuple(gemm_shapes),
        patterns=tuple(patterns),
        p2p_sizes=p2p,
        peak_flops_per_device=allocation.peak_flops_per_device,
    )


def probe_spec(
    space: SearchSpace, plan: ProbePlan, *, trial_id: str, timeout_s: float
) -> TrialSpec:
    """The probe as a trial: every device of the allocation, ranks running the probe."""
    world = space.allocation.world_size
    return TrialSpec(
        trial_id=trial_id,
        model=space.model,
        layout=ParallelLayout(tp=1, pp=1, dp=world, mbs=1, gas=1),
        allocation=space.allocation,
        trainer={
            "kind": PROBE_KIND,
            "device": space.trainer.get("device", "auto"),
            "probe": plan.to_dict(),
        },
        timeout_s=timeout_s,
    )
