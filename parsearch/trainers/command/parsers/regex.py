"""The ``regex`` format: a user's own patterns, for a trainer no built-in parser knows.

``patterns`` maps a metric to a regular expression whose first group (or group ``value``)
is the number; ``scale`` optionally multiplies it (``step_time_s: 0.001`` for milliseconds).
The n-th match of every step metric belongs to the n-th step, so warm-up exclusion and the
median work as for the built-in formats; ``peak_mem_bytes`` keeps its largest match.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from parsearch.trainers.command.parsers.base import LogScan, Step, leading_number

STEP_METRICS = (
    "step_time_s",
    "tokens_per_s",
    "tokens_per_s_per_device",
    "tflops_per_device",
    "mfu",
    "loss",
)
REGEX_METRICS = (*STEP_METRICS, "peak_mem_bytes")
_STEP_FIELDS = {
    "tflops_per_device": "reported_tflops_per_device",
    "mfu": "reported_mfu",
}
TIMING_METRICS = ("step_time_s", "tokens_per_s", "tokens_per_s_per_device")


def compile_patterns(patterns: Mapping[str, str]) -> dict[str, re.Pattern[str]]:
    """Compile and check user patterns; ``ValueError`` names the metric that is wrong."""
    compiled = {}
    for metric, text in patterns.items():
        if metric not in REGEX_METRICS:
            raise ValueError(f"{metric}: unknown metric; valid: {', '.join(REGEX_METRICS)}")
        if not isinstance(text, str):
            raise ValueError(f"{metric}: must be a regular expression string, got {text!r}")
        try:
            pattern = re.compile(text)
        except re.error as error:
            raise ValueError(f"{metric}: not a valid regular expression: {error}") from None
        if pattern.groups < 1:
            raise ValueError(f"{metric}: needs a group around the number, e.g. '([0-9.]+)'")
        compiled[metric] = pattern
    if not any(metric in compiled for metric in TIMING_METRICS):
        raise ValueError(f"needs a pattern for at least one of {', '.join(TIMING_METRICS)}")
    return compiled


class RegexParser:
    """Applies user patterns line by line."""

    def __init__(
        self, patterns: Mapping[str, str], scale: Mapping[str, float] | None = None
    ) -> None:
        self.patterns = compile_patterns(patterns)
        self.scale = dict(scale or {})
        self.counts = dict.fromkeys(self.patterns, 0)

    def feed(self, line: str, scan: LogScan) -> None:
        for metric, pattern in self.patterns.items():
            match = pattern.search(line)
            if match is None:
                continue
            group = match.group("value") if "value" in pattern.groupindex else match.group(1)
            value = leading_number(group or "")
            if value is None:
                continue
            value *= self.scale.get(metric, 1.0)
            if metric == "peak_mem_bytes":
                scan.add_memory(allocated=value)
                continue
            position = self.counts[metric]
            self.counts[metric] += 1
            while len(scan.steps) <= position:
                scan.steps.append(Step(index=len(scan.steps) + 1))
            setattr(scan.steps[position], _STEP_FIELDS.get(metric, metric), value)
