"""What a running campaign shows on the terminal.

On a TTY: one line, rewritten in place at most a few times a second — trials done / budget,
running, failures, best so far with its layout, ETA. Not on a TTY (a Slurm log): a line when
the campaign starts, one per new best, and nothing else, so logs stay readable for
thousand-trial campaigns. The driver's final summary is the command's own output.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import TextIO

from parsearch.config import ParallelLayout


@dataclass(frozen=True)
class Snapshot:
    """The driver's counters at one moment."""

    finished: int
    budget: int
    running: int
    failed: int
    best_value: float | None
    best_layout: ParallelLayout | None
    metric: str
    eta_s: float | None


def format_duration(seconds: float | None) -> str:
    """``95`` → ``1m35s``; unknown → ``?``."""
    if seconds is None:
        return "?"
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def describe_best(value: float | None, layout: ParallelLayout | None, metric: str) -> str:
    if value is None or layout is None:
        return "best: none yet"
    return f"best {metric} {value:.4g} ({layout.short()})"


class Progress:
    """Shows :class:`Snapshot` s on ``stream``; ``enabled=False`` shows nothing."""

    def __init__(self, stream: TextIO | None = None, *, enabled: bool = True):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = enabled and self.stream.isatty()
        self._last_draw = 0.0
        self._width = 0
        self._best_shown: float | None = None

    def message(self, text: str) -> None:
        """A line that stays (campaign started, stopping...)."""
        if self.enabled:
            self._clear()
            print(text, file=self.stream, flush=True)

    def update(self, snapshot: Snapshot, *, force: bool = False) -> None:
        if not self.enabled:
            return
        if self.tty:
            now = time.monotonic()
            if force or now - self._last_draw >= 0.2:
                self._last_draw = now
                self._draw(self._line(snapshot))
        elif snapshot.best_value is not None and snapshot.best_value != self._best_shown:
            self._best_shown = snapshot.best_value
            self.message(
                f"[{snapshot.finished}/{snapshot.budget}] new "
                + describe_best(snapshot.best_value, snapshot.best_layout, snapshot.metric)
            )

    def close(self) -> None:
        self._clear()

    def _line(self, s: Snapshot) -> str:
        return (
            f"{s.finished}/{s.budget} done, {s.running} running, {s.failed} failed | "
            f"{describe_best(s.best_value, s.best_layout, s.metric)} | "
            f"ETA {format_duration(s.eta_s)}"
        )

    def _draw(self, line: str) -> None:
        padding = max(0, self._width - len(line))
        self.stream.write("\r" + line + " " * padding)
        self.stream.flush()
        self._width = len(line)

    def _clear(self) -> None:
        if self.tty and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0
