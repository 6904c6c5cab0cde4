"""Turn what a log said into a trial's metrics, by the same rules for every format.

* Warm-up steps (``index <= warmup_steps``) are excluded: the first iterations pay for
  allocator growth, kernel selection and compilation.
* The median of the measured steps is used: one slow step (a checkpoint, a straggler) must
  not decide a layout's rank.
* ``tflops_per_device`` and ``mfu`` are always recomputed from the measured step time with
  the model FLOPs of :func:`parsearch.estimate.flops_per_step` (no recompute), exactly as the
  built-in benchmark does, so layouts with and without recompute, and trainers that count
  FLOPs differently, are compared on one scale; a trainer's own figures are kept as
  ``reported_tflops_per_device`` / ``reported_mfu``.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from parsearch.estimate import flops_per_step
from parsearch.plausible import contradiction
from parsearch.trainers.command.parsers.base import LogScan, Step
from parsearch.trial import TrialSpec


class NoMeasurement(Exception):
    """The log holds no usable measurement; the message says why."""


def _finite(value: Any, what: str, *, positive: bool = True) -> float:
    """A logged figure that arithmetic can use: finite, and > 0 (or >= 0) as required.

    ``Infinity``, ``NaN`` or ``1e400`` in a log would otherwise divide by zero or overflow
    below, failing the driver instead of the trial.
    """
    number = float(value)
    if not math.isfinite(number) or number < 0 or (positive and number == 0):
        raise NoMeasurement(f"the log reports {what} = {value!r}, which no run can measure")
    return number


def summarize(scan: LogScan, spec: TrialSpec, warmup_steps: int) -> dict[str, Any]:
    """The metrics of one log (raise :class:`NoMeasurement` when it has none).

    A trainer's own summary decides the throughput when it has a timing figure and no step
    line has one (its own warm-up handling applies, not ``warmup_steps``); step lines then add
    the last loss. Timed steps win over a summary: their warm-up is left out, a run's figure
    counts its start-up (Hugging Face's ``train_samples_per_second``)."""
    check_launch(scan, spec)
    timed_steps = any(getattr(step, key) is not None for step in scan.steps for key in _TIMING_KEYS)
    summary = scan.summary if scan.summary is not None and not timed_steps else None
    if summary is not None and any(key in summary for key in _TIMING_KEYS):
        metrics = _from_summary(summary, spec)
        losses = [step.loss for step in scan.steps if step.loss is not None]
        if "loss" in summary or losses:
            metrics["loss"] = summary.get("loss", losses[-1] if losses else None)
    else:
        metrics = _from_steps(scan.steps, spec, warmup_steps)
    if scan.peak_mem_bytes is not None:
        metrics["peak_mem_bytes"] = int(_finite(scan.peak_mem_bytes, "peak memory", positive=False))
    if scan.peak_reserved_bytes is not None:
        reserved = int(_finite(scan.peak_reserved_bytes, "peak reserved memory", positive=False))
        metrics["peak_reserved_bytes"] = reserved
        metrics.setdefault("peak_mem_bytes", reserved)
    return metrics


def check_launch(scan: LogScan, spec: TrialSpec) -> None:
    """Raise :class:`NoMeasurement` when the program reports a world size or global batch
    that is not the layout's: it did not run the layout the trial stands for (a template
    that passes ``gas`` where the program wants ``gas*dp``; a launcher that ran fewer
    processes), so its figures must not be stored as that layout's."""
    layout = spec.layout
    expected = {"world_size": layout.world_size, "global_batch": layout.global_batch}
    words = {"world_size": "world size", "global_batch": "global batch size"}
    for name, values in scan.launch.items():
        # A scaled figure (tokens per step / seq_length) may carry a rounding error.
        wrong = sorted(value for value in values if abs(value - expected[name]) > 1e-6 * value)
        if wrong:
            raise NoMeasurement(
                f"the program reports {words[name]} {wrong[0]:g} but the layout "
                f"{layout.short()} has {words[name]} {expected[name]}: the command template "
                "or launcher does not give the program the layout's values"
            )


def _tokens_per_step(spec: TrialSpec) -> int:
    return spec.layout.global_batch * spec.model.seq_length


def _with_flops(metrics: dict[str, Any], spec: TrialSpec) -> dict[str, Any]:
    flops = flops_per_step(spec.model, spec.layout.global_batch, recompute="none")
    tflops = flops / metrics["step_time_s"] / spec.layout.world_size / 1e12
    metrics.update(
        tokens_per_step=_tokens_per_step(spec),
        model_flops_per_step=flops,
        tflops_per_device=tflops,
        mfu=tflops * 1e12 / spec.allocation.peak_flops_per_device,
    )
    return metrics


_TIMING_KEYS = (
    "tokens_per_s",
    "tokens_per_s_per_device",
    "samples_per_s",
    "steps_per_s",
    "step_time_s",
)


def _rate_and_time(
    figures: Any, spec: TrialSpec, tokens: float
) -> tuple[float | None, float | None]:
    """Tokens per second and seconds per step from whichever a trainer gave (a mapping or a
    :class:`Step`): a rate per token, per device, per sample or per step, or a step time."""

    def get(name: str) -> float | None:
        value = figures.get(name) if isinstance(figures, dict) else getattr(figures, name)
        return None if value is None else _finite(value, name)

    rate = get("tokens_per_s")
    if rate is None and (per_device := get("tokens_per_s_per_device")) is not None:
        rate = per_device * spec.layout.world_size
    if rate is None and (samples := get("samples_per_s")) is not None:
        rate = samples * spec.model.seq_length
    time = get("step_time_s")
    if time is None and (steps := get("steps_per_s")):
        time = 1.0 / steps
    if time is None and rate:
        time = tokens / rate
    if rate is None and time:
        rate = tokens / time
    why = contradiction(
        {name: get(name) for name in _TIMING_KEYS},
        tokens_per_step=tokens,
        global_batch=tokens / spec.model.seq_length,
        world_size=spec.layout.world_size,
    )
    if why is not None:  # every figure must tell the same step time: see parsearch.plausible
        raise NoMeasurement(why)
    return rate, time


def _from_summary(summary: dict[str, Any], spec: TrialSpec) -> dict[str, Any]:
    tokens_per_s, step_time_s = _rate_and_time(summary, spec, _tokens_per_step(spec))
    if not tokens_per_s or tokens_per_s <= 0 or not step_time_s or step_time_s <= 0:
        shown = {key: summary[key] for key in _TIMING_KEYS if key in summary}
        raise NoMeasurement(f"the trainer's summary reports no positive throughput: {shown}")
    metrics: dict[str, Any] = {"tokens_per_s": tokens_per_s, "step_time_s": step_time_s}
    for key in ("tflops_per_device", "mfu"):
        if key in summary:
            metrics[f"reported_{key}"] = _finite(summary[key], key, positive=False)
    if "peak_mem_bytes" in summary:
        metrics["peak_mem_bytes"] = int(
            _finite(summary["peak_mem_bytes"], "peak_mem_bytes", positive=False)
        )
    return _with_flops(metrics, spec)


def _from_steps(steps: list[Step], spec: TrialSpec, warmup_steps: int) -> dict[str, Any]:
    if not steps:
        raise NoMeasurement("no metric lines in the log")
    measured = [step for step in steps if step.index > warmup_steps]
    if not measured:
        raise NoMeasurement(
            f"the log has {len(steps)} step lines, all within the {warmup_steps} warm-up "
            f"steps (last step {steps[-1].index}); run more steps than trainer.warmup_steps"
        )
    expected = spec.layout.global_batch
    wrong = [step for step in measured if step.global_batch not in (None, expected)]
    if wrong:
        raise NoMeasurement(
            f"the log reports global batch size {wrong[0].global_batch} but the layout "
            f"{spec.layout.short()} asks for {expected}: the command template does not pass "
            f"the layout's batch to the trainer"
        )
    seq = spec.model.seq_length
    wrong = [step for step in measured if step.seq_length not in (None, seq)]
    if wrong:
        raise NoMeasurement(
            f"the log reports sequence length {wrong[0].seq_length} (step {wrong[0].index}) "
            f"but the model's seq_length is {seq}: the command template does not pass the "
            "space's sequence length to the trainer"
        )
    times, rates = [], []
    for step in measured:
        tokens = (step.global_batch or expected) * (step.seq_length or spec.model.seq_length)
        rate, time = _rate_and_time(step, spec, tokens)
        if time is None or time <= 0 or rate is None:
            raise NoMeasurement(
                f"step {step.index} has neither a step time nor a rate (tokens, samples or "
                "steps per second); with a pattern printed once at the end, give it "
                "role: summary"
            )
        times.append(time)
        rates.append(rate)
    metrics: dict[str, Any] = {
        "step_time_s": statistics.median(times),
        "step_time_spread_s": max(times) - min(times),
        "step_times_s": times,
        "tokens_per_s": statistics.median(rates),
        "measured_steps": len(measured),
        "warmup_steps": warmup_steps,
    }
    for field in ("reported_tflops_per_device", "reported_mfu"):
        values = [getattr(step, field) for step in measured if getattr(step, field) is not None]
        if values:
            metrics[field] = statistics.median(values)
    losses = [step.loss for step in measured if step.loss is not None]
    if losses:
        metrics["loss"] = losses[-1]
    return _with_flops(metrics, spec)
