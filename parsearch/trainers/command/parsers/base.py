"""What every log parser produces: the steps a trainer logged and its memory reports.

Parsers only read; turning steps into the trial's metrics (warm-up, median, tokens/s, FLOPs)
is :mod:`parsearch.trainers.command.summary`'s job, so every format is judged by the same rules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_NUMBER = re.compile(r"[-+]?(?:\d[\d,]*)?\.?\d+(?:[eE][-+]?\d+)?")


def strip_ansi(line: str) -> str:
    """torchtitan (and others) colour their console lines; the codes hide the numbers."""
    return _ANSI.sub("", line)


def leading_number(text: str) -> float | None:
    """The first number in ``text`` (thousands separators allowed: ``10,050``)."""
    match = _NUMBER.search(text)
    if match is None:
        return None
    return float(match.group().replace(",", ""))


def records(line: str, start: re.Pattern[str]) -> list[str]:
    """``line`` cut before every match of ``start`` (the text before the first is kept).

    Ranks that share one log (torchrun without per-rank redirects) can join two records on
    one line: under ``PYTHONUNBUFFERED``, which parsearch sets so logs are live, a
    ``print``'s text and its newline are two writes, and another rank may write between
    them. Each record is then read on its own instead of one overwriting the other's fields.
    """
    cuts = [match.start() for match in start.finditer(line) if match.start() > 0]
    return [line[a:b] for a, b in zip([0, *cuts], [*cuts, len(line)], strict=True)]


@dataclass
class Step:
    """One logged training step (or one log interval, when a trainer averages several).

    ``index`` is the step number the trainer printed (1-based), or the order of appearance
    when it prints none. Every figure is optional: each format gives a different subset.
    """

    index: int
    step_time_s: float | None = None
    tokens_per_s: float | None = None
    tokens_per_s_per_device: float | None = None
    samples_per_s: float | None = None
    steps_per_s: float | None = None
    global_batch: int | None = None
    seq_length: int | None = None
    reported_tflops_per_device: float | None = None
    reported_mfu: float | None = None
    loss: float | None = None


@dataclass
class LogScan:
    """Everything one log said: its steps, peak memory, and a trainer's own summary."""

    steps: list[Step] = field(default_factory=list)
    peak_mem_bytes: float | None = None
    peak_reserved_bytes: float | None = None
    summary: dict[str, Any] | None = None
    # What the program says it was launched as: "world_size", "global_batch" -> values seen.
    launch: dict[str, set[float]] = field(default_factory=dict)

    def add_launch(self, name: str, value: float) -> None:
        """Record a reported world size or global batch (checked against the layout)."""
        self.launch.setdefault(name, set()).add(value)

    def add_memory(self, allocated: float | None = None, reserved: float | None = None) -> None:
        """Keep the largest peak seen (a log may report several ranks and several times)."""
        if allocated is not None:
            self.peak_mem_bytes = max(self.peak_mem_bytes or 0.0, allocated)
        if reserved is not None:
            self.peak_reserved_bytes = max(self.peak_reserved_bytes or 0.0, reserved)

    @property
    def has_metrics(self) -> bool:
        return bool(self.steps) or self.summary is not None


class LineParser(Protocol):
    """Reads a log one line at a time (ANSI codes already stripped) into a :class:`LogScan`."""

    def feed(self, line: str, scan: LogScan) -> None: ...
