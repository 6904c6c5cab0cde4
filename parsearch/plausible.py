"""Refuse measurements no machine can produce, before they rank a layout or steer the search.

A trial's figures come from programs parsearch did not write (a log line, a JSON summary) and
from the simulator; one wrong line (``Infinity``, ``NaN``, a rate a thousand times too high)
would otherwise become the campaign's best layout, and a NaN told to the optimiser breaks its
surrogate model. So an ``ok`` result whose figures are not finite, are negative, use more than
100% of the space's peak FLOP/s or more memory than any machine can address becomes an
``error`` trial whose message names the value: recorded, counted against the budget, never
the best, and told to the optimiser as a failure.

The figures must also agree with each other (:func:`contradiction`): tokens/s, samples/s,
steps/s and the step time each say how long a step of ``global_batch × seq_length`` tokens
took, and TFLOP/s and MFU follow from the step time; ``{"tokens_per_s": 1e9, "step_time_s":
100}`` cannot both be true, and a rate that contradicts its own step time must not win. Two
figures further apart than :data:`TOLERANCE` make the trial an ``error`` naming both.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
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


# How far two figures of one measurement may disagree (as a ratio, 1.25 = 25%): printed
# figures are rounded (``elapsed time per iteration (ms): 0.8``), and a rate and a time may be
# averaged over slightly different windows; a real contradiction is off by far more.
TOLERANCE = 1.25
# A figure's name -> how to turn it into seconds per step, given tokens per step ``t``,
# sequences per step ``b`` and the world size ``w``.
_AS_STEP_TIME = {
    "step_time_s": lambda x, t, b, w: x,
    "steps_per_s": lambda x, t, b, w: 1.0 / x,
    "tokens_per_s": lambda x, t, b, w: t / x,
    "tokens_per_s_per_device": lambda x, t, b, w: t / (x * w) if w else None,
    "samples_per_s": lambda x, t, b, w: b / x if b else None,
}


def contradiction(
    figures: Mapping[str, Any],
    *,
    tokens_per_step: float,
    global_batch: float | None = None,
    world_size: float | None = None,
) -> str | None:
    """Why the timing figures in ``figures`` (any of ``step_time_s``, ``steps_per_s``,
    ``tokens_per_s``, ``tokens_per_s_per_device``, ``samples_per_s``) cannot describe one
    step of ``tokens_per_step`` tokens (``global_batch`` sequences, on ``world_size``
    devices), or ``None``; figures that are absent, not numbers or not positive are left to
    the other checks."""
    implied: list[tuple[str, float, float]] = []  # (name, value, seconds per step)
    for name, as_time in _AS_STEP_TIME.items():
        value = _number(figures.get(name))
        if value is None or not math.isfinite(value) or value <= 0:
            continue
        seconds = as_time(value, tokens_per_step, global_batch, world_size)
        if seconds is not None and math.isfinite(seconds) and seconds > 0:
            implied.append((name, value, seconds))
    if len(implied) < 2:
        return None
    fast = min(implied, key=lambda item: item[2])
    slow = max(implied, key=lambda item: item[2])
    if slow[2] <= fast[2] * TOLERANCE:
        return None
    return (
        f"{fast[0]} = {fast[1]:g} and {slow[0]} = {slow[1]:g} contradict each other: "
        f"at {tokens_per_step:g} tokens per step the first means {fast[2]:.4g} s per step, "
        f"the second {slow[2]:.4g} s ({slow[2] / fast[2]:.3g}x apart, more than the "
        f"{TOLERANCE - 1:.0%} allowed)"
    )


def _derived_contradiction(metrics: Mapping[str, Any], peak_flops_per_device: float) -> str | None:
    """The figures parsearch derives from the step time (TFLOP/s per device from the model's
    FLOPs per step, MFU from the peak) checked against it."""
    step = _number(metrics.get("step_time_s"))
    flops = _number(metrics.get("model_flops_per_step"))
    world = _number(metrics.get("world_size"))
    tflops = _number(metrics.get("tflops_per_device"))
    if step and flops and world and tflops:
        expected = flops / step / world / 1e12
        if not expected / TOLERANCE <= tflops <= expected * TOLERANCE:
            return (
                f"tflops_per_device = {tflops:g} and step_time_s = {step:g} contradict each "
                f"other: {flops:g} FLOPs per step on {world:g} devices in {step:g} s is "
                f"{expected:.4g} TFLOP/s per device"
            )
    mfu = _number(metrics.get("mfu"))
    if mfu and tflops and peak_flops_per_device > 0:
        expected = tflops * 1e12 / peak_flops_per_device
        if not expected / TOLERANCE <= mfu <= expected * TOLERANCE:
            return (
                f"mfu = {mfu:g} and tflops_per_device = {tflops:g} contradict each other: "
                f"against the peak of {peak_flops_per_device / 1e12:g} TFLOP/s the MFU is "
                f"{expected:.4g}"
            )
    return None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    return float(value)


def problem(
    metrics: dict[str, Any],
    *,
    objective: str,
    peak_flops_per_device: float,
    tokens_per_step: float | None = None,
) -> str | None:
    """Why ``metrics`` cannot be a real measurement, or ``None``. ``tokens_per_step`` (else
    the metrics' own ``tokens_per_step``) lets the rates be checked against the step time."""
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
    tokens = _number(
        tokens_per_step if tokens_per_step is not None else metrics.get("tokens_per_step")
    )
    # Figures summarised from steps (``step_times_s``) were checked step by step where they
    # were read (parsearch.trainers.command.summary); their medians need not agree: the
    # median rate of two steps of 1 s and 3 s means 1.5 s a step, the median time is 2 s.
    per_step = isinstance(metrics.get("step_times_s"), list)
    if tokens is not None and math.isfinite(tokens) and tokens > 0 and not per_step:
        why = contradiction(
            metrics, tokens_per_step=tokens, world_size=_number(metrics.get("world_size"))
        )
        if why is not None:
            return why
    return _derived_contradiction(metrics, peak_flops_per_device)


def checked(
    result: TrialResult,
    *,
    objective: str,
    peak_flops_per_device: float,
    tokens_per_step: float | None = None,
) -> TrialResult:
    """``result`` itself, or for an ``ok`` one with impossible figures an ``error`` result
    that says which; the figures are kept under ``rejected_metrics`` for the record."""
    if not result.ok:
        return result
    why = problem(
        result.metrics,
        objective=objective,
        peak_flops_per_device=peak_flops_per_device,
        tokens_per_step=tokens_per_step,
    )
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
