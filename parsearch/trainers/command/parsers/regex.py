"""The ``regex`` format: a user's own patterns, for a trainer no built-in parser knows.

``patterns`` maps a metric to a regular expression whose first group (or group ``value``)
is the number, or to ``{pattern: ..., role: step | summary}``:

* ``step`` (the default): a line the trainer prints every step (or every log interval). The
  n-th match of a step metric belongs to the n-th step, so the first ``warmup_steps`` are
  excluded and the median of the rest is taken, as for the built-in formats;
* ``summary``: a line the trainer prints once, at the end, with its own figure for the whole
  run (Hugging Face's ``train_samples_per_second``). The last match is taken as it is:
  ``warmup_steps`` does not apply to it, so it includes the trainer's own start-up unless the
  trainer excludes it. A summary timing metric decides the throughput when no step line was
  timed (timed steps leave their warm-up out); step lines then only add what the summary
  lacks (the loss).

``peak_mem_bytes`` keeps its largest match whatever its role. Every match on a line counts
(ranks sharing a log glue their lines together), each step match as its own step.

Rates may be given per token (``tokens_per_s``, ``tokens_per_s_per_device``), per sample
(``samples_per_s``: sequences of ``seq_length`` tokens) or per step (``steps_per_s``); times
as ``step_time_s``.

``world_size`` and ``global_batch`` (samples per optimizer step) are what the program says it
was launched as; they are checked against the trial's layout, whatever their role: a
template that passes ``gas`` where the program expects ``gas*dp``, or a launcher that starts
one process for a layout of two, is an error naming both (:func:`~..summary.check_launch`).

``scale`` optionally multiplies a metric: a number (``step_time_s: 0.001`` for milliseconds)
or a product or quotient of numbers and placeholders (``"{seq_length}"``,
``"{global_batch}*{seq_length}"``, ``"1/{world_size}"``), filled for each trial
(:func:`resolve_scale`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from parsearch.trainers.command.parsers.base import LogScan, Step, leading_number

STEP_METRICS = (
    "step_time_s",
    "tokens_per_s",
    "tokens_per_s_per_device",
    "samples_per_s",
    "steps_per_s",
    "tflops_per_device",
    "mfu",
    "loss",
)
LAUNCH_METRICS = ("world_size", "global_batch")
REGEX_METRICS = (*STEP_METRICS, "peak_mem_bytes", *LAUNCH_METRICS)
ROLES = ("step", "summary")
_STEP_FIELDS = {
    "tflops_per_device": "reported_tflops_per_device",
    "mfu": "reported_mfu",
}
TIMING_METRICS = (
    "step_time_s",
    "tokens_per_s",
    "tokens_per_s_per_device",
    "samples_per_s",
    "steps_per_s",
)
_FACTOR = re.compile(r"^\s*(?:\{(\w+)\}|([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?))\s*$")


@dataclass(frozen=True)
class Pattern:
    """One metric's compiled pattern and its role."""

    regex: re.Pattern[str]
    role: str = "step"


def compile_patterns(patterns: Mapping[str, Any]) -> dict[str, Pattern]:
    """Compile and check user patterns; ``ValueError`` names the metric that is wrong."""
    compiled = {}
    for metric, entry in patterns.items():
        if metric not in REGEX_METRICS:
            raise ValueError(f"{metric}: unknown metric; valid: {', '.join(REGEX_METRICS)}")
        role = "step"
        text = entry
        if isinstance(entry, Mapping):
            unknown = sorted(set(entry) - {"pattern", "role"})
            if unknown or "pattern" not in entry:
                raise ValueError(
                    f"{metric}: a mapping needs 'pattern' and may have 'role'; got keys "
                    f"{sorted(entry)}"
                )
            text, role = entry["pattern"], entry.get("role", "step")
            if role not in ROLES:
                raise ValueError(f"{metric}.role: must be one of {list(ROLES)}, got {role!r}")
        if not isinstance(text, str):
            raise ValueError(f"{metric}: must be a regular expression string, got {text!r}")
        try:
            pattern = re.compile(text)
        except re.error as error:
            raise ValueError(f"{metric}: not a valid regular expression: {error}") from None
        if pattern.groups < 1:
            raise ValueError(f"{metric}: needs a group around the number, e.g. '([0-9.]+)'")
        compiled[metric] = Pattern(pattern, role)
    if not any(metric in compiled for metric in TIMING_METRICS):
        raise ValueError(f"needs a pattern for at least one of {', '.join(TIMING_METRICS)}")
    return compiled


def scale_factors(text: Any, names: frozenset[str] | set[str]) -> None:
    """Check one ``scale`` entry: a positive number, or numbers and placeholders joined by
    ``*`` and ``/``; ``ValueError`` says what is wrong."""
    if isinstance(text, bool) or not isinstance(text, int | float | str):
        raise ValueError(f"must be a number or a product of placeholders, got {text!r}")
    if not isinstance(text, str):
        if not 0 < text < math.inf:
            raise ValueError(f"must be a positive finite number, got {text!r}")
        return
    for factor in re.split(r"[*/]", text):
        match = _FACTOR.match(factor)
        if match is None:
            raise ValueError(
                f"{text!r}: each factor must be a number or one placeholder such as "
                "{seq_length}, joined by * or /"
            )
        if match.group(1) is not None and match.group(1) not in names:
            raise ValueError(f"{text!r}: unknown placeholder {{{match.group(1)}}}")


def resolve_scale(scale: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, float]:
    """Every ``scale`` entry as a number, its placeholders filled from ``values``."""
    resolved = {}
    for metric, text in scale.items():
        if not isinstance(text, str):
            resolved[metric] = float(text)
            continue
        factor, operator = 1.0, "*"
        for token in re.split(r"([*/])", text):
            if token in ("*", "/"):
                operator = token
                continue
            match = _FACTOR.match(token)
            assert match is not None  # checked when the space was loaded
            name, number = match.groups()
            value = float(values[name]) if name is not None else float(number)
            factor = factor * value if operator == "*" else factor / value
        resolved[metric] = factor
    return resolved


class RegexParser:
    """Applies user patterns line by line."""

    def __init__(self, patterns: Mapping[str, Any], scale: Mapping[str, float] | None = None):
        self.patterns = compile_patterns(patterns)
        self.scale = {metric: float(factor) for metric, factor in (scale or {}).items()}
        self.counts = dict.fromkeys(self.patterns, 0)

    def feed(self, line: str, scan: LogScan) -> None:
        """Every match on the line counts, not only the first: ranks that share one log
        (torchrun's unbuffered workers) glue their records into one line, and a line with
        two ranks' peaks must keep the larger (:func:`~.base.records`)."""
        for metric, pattern in self.patterns.items():
            for match in pattern.regex.finditer(line):
                self._take(metric, pattern, match, scan)

    def _take(self, metric: str, pattern: Pattern, match: re.Match[str], scan: LogScan) -> None:
        regex = pattern.regex
        group = match.group("value") if "value" in regex.groupindex else match.group(1)
        value = leading_number(group or "")
        if value is None:
            return
        value *= self.scale.get(metric, 1.0)
        if metric == "peak_mem_bytes":
            scan.add_memory(allocated=value)
            return
        if metric in LAUNCH_METRICS:
            scan.add_launch(metric, value)
            return
        if pattern.role == "summary":
            scan.summary = {**(scan.summary or {}), metric: value}
            return
        position = self.counts[metric]
        self.counts[metric] += 1
        while len(scan.steps) <= position:
            scan.steps.append(Step(index=len(scan.steps) + 1))
        setattr(scan.steps[position], _STEP_FIELDS.get(metric, metric), value)
