"""Refuse measurements no machine can produce, before they rank a layout or steer the search.

A trial's figures come from programs parsearch did not write (a log line, a JSON summary) and
from the simulator; one wrong line (``Infinity``, ``NaN``, a rate a thousand times too high)
would otherwise become the campaign's best layout, and a NaN told to the optimiser breaks its
surrogate model. So an ``ok`` result whose figures are not finite, are negative, use more than
100% of the space's peak FLOP/s or more memory than any machine can address becomes an
``error`` trial whose message names the value: recorded, counted against the budget, never
the best, and told to the optimiser as a failure.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from parsearch.result import TrialResult, TrialState
from parsearch.units import format_bytes

# 57-bit virtual addresses (5-level paging) are the most any current CPU or GPU addresses.
MAX_ADDRESSABLE_BYTES = 2**57
# Figures that must be finite and >= 0 when present; the first two must also be > 0.
POSITIVE = ("tokens_per_s", "step_time_s")
NON_NEGATIVE = (
    "tflops_per_device",
    "mfu",
    "peak_mem_bytes",
    "peak_reserved_bytes",
    "reported_tflops_per_device",
    "reported_mfu",
)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    return float(value)


def problem(metrics: dict[str, Any], *, objective: str, peak_flops_per_device: float) -> str | None:
    """Why ``metrics`` cannot be a real measurement, or ``None``."""
    for key in (*POSITIVE, *NON_NEGATIVE):
        if key not in metrics:
            continue
        value = _number(metrics[key])
        if value is None:
            return f"{key} = {metrics[key]!r} is not a number"
        if not math.isfinite(value):
            return f"{key} = {value} is not a finite number"
        if value < 0 or (value == 0 and key in POSITIVE):
            return f"{key} = {value:g} is {'negative' if value < 0 else 'zero'}"
    value = _number(metrics.get(objective))
    if value is None or not math.isfinite(value):
        return f"the objective {objective} = {metrics.get(objective)!r} is not a finite number"
    mfu = _number(metrics.get("mfu"))
    tflops = _number(metrics.get("tflops_per_device"))
    if mfu is None and tflops is not None and peak_flops_per_device > 0:
        mfu = tflops * 1e12 / peak_flops_per_device
    if mfu is not None and mfu > 1.0:
        return (
            f"MFU {mfu:.0%} (tokens_per_s = {metrics.get('tokens_per_s')!r}) exceeds 100% of "
            f"the space's peak of {peak_flops_per_device / 1e12:g} TFLOP/s per device: the "
            "trainer's figure is wrong, or allocation.peak_tflops is too low"
        )
    memory = _number(metrics.get("peak_mem_bytes"))
    if memory is not None and memory > MAX_ADDRESSABLE_BYTES:
        return (
            f"peak_mem_bytes = {memory:g} is more than any device can address "
            f"({format_bytes(MAX_ADDRESSABLE_BYTES)})"
        )
    return None


def checked(result: TrialResult, *, objective: str, peak_flops_per_device: float) -> TrialResult:
    """``result`` itself, or for an ``ok`` one with impossible figures an ``error`` result
    that says which; the figures are kept under ``rejected_metrics`` for the record."""
    if not result.ok:
        return result
    why = problem(result.metrics, objective=objective, peak_flops_per_device=peak_flops_per_device)
    if why is None:
        return result
    return TrialResult(
        status=TrialState.ERROR,
        metrics={"rejected_metrics": {k: repr(v) for k, v in result.metrics.items()}},
        error=f"impossible measurement: {why}; the trial is not used",
        log_tail=result.log_tail,
        hosts=result.hosts,
        duration_s=result.duration_s,
    )
