"""Proxy trials: a layout measured on fewer data-parallel replicas, its full-scale figures
predicted from the measurement.

A proxy keeps ``tp``, ``pp``, ``mbs`` and ``gas`` and runs ``dp' < dp`` replicas on fewer
nodes. Every replica does the same work per step, so the full-scale step is the proxy's step
with the proxy's exposed data-parallel reduction swapped for the full-scale one (the
estimate's DP model, which uses a machine profile's ``dp-*`` alpha-beta fits when the
settings carry one), and tokens/s scale by ``dp/dp'`` through the global batch. Peak memory
differs only by the dp-sharded model states (ZeRO-1/2/3, the distributed optimizer, FSDP2):
a proxy holds *more* of them per rank, so the smallest proxy is not always the cheapest one
that fits, and a proxy that ran out of memory says nothing about full scale unless those
terms are the same at both sizes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from parsearch.config import AllocationSpec, ModelSpec, ParallelLayout
from parsearch.estimate.memory import EstimateSettings
from parsearch.estimate.timing import Prediction, predict


@dataclass(frozen=True)
class ProxyPlan:
    """How to measure ``layout`` by proxy: ``dp`` replicas on ``nodes`` nodes."""

    layout: ParallelLayout
    dp: int
    nodes: int

    @property
    def proxy_layout(self) -> ParallelLayout:
        return replace(self.layout, dp=self.dp)


def nodes_for(layout: ParallelLayout, devices_per_node: int) -> int:
    """Whole nodes a layout's ranks occupy (one rank per device)."""
    return math.ceil(layout.world_size / devices_per_node)


def proxy_dps(layout: ParallelLayout) -> list[int]:
    """Candidate proxy sizes: the divisors of ``dp`` below it, smallest first (a divisor keeps
    the full-scale batch an exact multiple of the proxy's); at least 2 under ZeRO, which
    shards over data-parallel ranks and needs some to shard over; and, with expert
    parallelism, sizes where ``etp·ep`` still divides ``tp·cp·dp'`` (Megatron's folding: the
    proxy must hold whole EP groups)."""
    smallest = 2 if layout.zero_stage else 1
    experts = layout.ep * layout.etp
    return [
        d
        for d in range(smallest, layout.dp)
        if layout.dp % d == 0 and layout.tp * layout.cp * d % experts == 0
    ]


def _sized(allocation: AllocationSpec, layout: ParallelLayout) -> AllocationSpec:
    return replace(allocation, nodes=nodes_for(layout, allocation.devices_per_node))


def choose_proxy(
    model: ModelSpec,
    layout: ParallelLayout,
    allocation: AllocationSpec,
    settings: EstimateSettings | None = None,
    min_dp: int = 1,
) -> ProxyPlan | None:
    """The smallest proxy (fewest nodes) predicted to fit in device memory, at least
    ``min_dp`` replicas; ``None`` when no proxy fits on fewer nodes than the full layout
    (it is then measured at full scale)."""
    full_nodes = nodes_for(layout, allocation.devices_per_node)
    for dp in proxy_dps(layout):
        if dp < min_dp:
            continue
        plan = ProxyPlan(layout, dp, nodes_for(replace(layout, dp=dp), allocation.devices_per_node))
        if plan.nodes >= full_nodes:
            return None
        if predict_run(model, plan.proxy_layout, allocation, settings).fits:
            return plan
    return None


def predict_run(
    model: ModelSpec,
    layout: ParallelLayout,
    allocation: AllocationSpec,
    settings: EstimateSettings | None = None,
) -> Prediction:
    """What the estimate expects of a run of ``layout`` on just the nodes it spans (a
    proxy's run, or a full-scale one)."""
    return predict(model, layout, _sized(allocation, layout), settings)


@dataclass(frozen=True)
class ProxyDelta:
    """What changes from the proxy to full scale, as the estimate predicts it."""

    dp_comm_s: float  # full-scale exposed DP reduction minus the proxy's, seconds per step
    memory_bytes: float  # full-scale peak minus the proxy's (<= 0 with sharded states)


def proxy_delta(
    model: ModelSpec,
    plan: ProxyPlan,
    allocation: AllocationSpec,
    settings: EstimateSettings | None = None,
) -> ProxyDelta:
    full = predict_run(model, plan.layout, allocation, settings)
    proxy = predict_run(model, plan.proxy_layout, allocation, settings)
    return ProxyDelta(
        dp_comm_s=full.dp_comm_s - proxy.dp_comm_s,
        memory_bytes=full.memory.total - proxy.memory.total,
    )


def full_scale_figures(
    model: ModelSpec,
    plan: ProxyPlan,
    measured: dict[str, Any],
    allocation: AllocationSpec,
    settings: EstimateSettings | None = None,
    correction: float = 1.0,
) -> dict[str, float]:
    """Full-scale ``tokens_per_s``, ``step_time_s``, ``tflops_per_device``, ``mfu`` and
    ``peak_mem_bytes`` predicted from a proxy's measured figures.

    ``correction`` multiplies the predicted throughput: the ratio calibration learns from
    confirmations (full-scale measured over proxy-predicted).
    """
    delta = proxy_delta(model, plan, allocation, settings)
    layout = plan.layout
    tokens = layout.global_batch * model.seq_length
    if measured.get("step_time_s"):
        proxy_step = float(measured["step_time_s"])
    else:
        proxy_tokens = plan.proxy_layout.global_batch * model.seq_length
        proxy_step = proxy_tokens / float(measured["tokens_per_s"])
    step = max(proxy_step + delta.dp_comm_s, 1e-12) / correction
    figures: dict[str, float] = {"step_time_s": step, "tokens_per_s": tokens / step}
    if measured.get("tflops_per_device") is not None:
        # The same work per device in a longer or shorter step.
        figures["tflops_per_device"] = float(measured["tflops_per_device"]) * proxy_step / step
        figures["mfu"] = figures["tflops_per_device"] * 1e12 / allocation.peak_flops_per_device
    if measured.get("peak_mem_bytes") is not None:
        figures["peak_mem_bytes"] = max(float(measured["peak_mem_bytes"]) + delta.memory_bytes, 0.0)
    return figures


def proxy_oom_is_full_scale(
    model: ModelSpec,
    plan: ProxyPlan,
    allocation: AllocationSpec,
    settings: EstimateSettings | None = None,
) -> bool:
    """Whether a proxy's out-of-memory also condemns the full-scale layout: only when the
    full layout holds no less per rank (nothing dp-sharded). Otherwise the smaller shard may
    be the cause, and the layout must be measured on more replicas before it is judged."""
    return proxy_delta(model, plan, allocation, settings).memory_bytes >= 0


def fidelity_record(plan: ProxyPlan, measured: dict[str, Any]) -> dict[str, Any]:
    """What a trial stores in ``metrics["fidelity"]``: the proxy's size and its own figures,
    next to the full-scale predictions that are the trial's objective."""
    return {"kind": "proxy", "dp": plan.dp, "nodes": plan.nodes, "measured": dict(measured)}


PRIOR_SPREAD = 0.05  # the estimate's DP-reduction error on unfamiliar networks: 5-10%


def learned_spread(pairs: list[tuple[float, float]], prior: float = PRIOR_SPREAD) -> float:
    """How far a corrected proxy prediction may be from the full-scale measurement: the
    standard deviation of log(measured / predicted) about the learnt correction, pooled with
    ``prior`` as if it were one more pair (so one or two confirmations cannot claim none)."""
    logs = [
        math.log(measured / predicted) for predicted, measured in pairs if predicted > 0 < measured
    ]
    if not logs:
        return prior
    mean = sum(logs) / len(logs)
    return math.sqrt((prior**2 + sum((value - mean) ** 2 for value in logs)) / len(logs))


def learned_correction(pairs: list[tuple[float, float]]) -> float:
    """The proxy->full-scale throughput correction from confirmations: the geometric mean of
    measured / predicted full-scale tokens/s over ``(predicted, measured)`` pairs (1 without
    any), so one outlier moves it less than an arithmetic mean would."""
    ratios = [measured / predicted for predicted, measured in pairs if predicted > 0 < measured]
    if not ratios:
        return 1.0
    return math.exp(sum(math.log(ratio) for ratio in ratios) / len(ratios))
