"""A tracker's calls on a worker thread: the campaign never waits for a tracking server.

The driver hands each finished trial to :class:`BackgroundTracker`, which queues it (bounded)
and returns at once; one worker thread per tracker logs the queue in order. A tracker that
is slow or down (MLflow retries each call with backoff) delays only its own queue: when the
queue is full, further trials are dropped and counted, and when the campaign ends the worker
is given a few seconds to catch up (none when its last call failed) before the rest is
counted as dropped. Nothing is lost for good: the store holds every trial, and
``parsearch export --to`` logs the missing ones later.
"""

from __future__ import annotations

import collections
import dataclasses
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, TextIO

from parsearch.store import Campaign, TrialRecord

# Trials waiting for a slow tracker; one more is dropped (and counted), not waited for.
QUEUE_SIZE = 1000
# How long the end of a campaign waits for a tracker that is keeping up to log its queue.
DRAIN_S = 10.0
# ... and for one whose last call failed, or whose call in flight has taken longer than
# SLOW_CALL_S (retrying a server that does not answer): only briefly.
DRAIN_DOWN_S = 1.0
SLOW_CALL_S = 2.0


class Tracker(Protocol):
    name: str

    def trial_finished(self, campaign: Campaign, record: TrialRecord) -> None: ...

    def close(self) -> None: ...


@dataclass
class TrackerCounts:
    """What became of the trials handed to a tracker."""

    told: int = 0
    logged: int = 0
    failed: int = 0  # the tracker raised (server down, refused the run)
    dropped_full: int = 0  # the queue was full
    dropped_at_close: int = 0  # still queued (or in flight) when the campaign ended
    errors: list[str] = field(default_factory=list)  # the first few, for the report

    @property
    def not_logged(self) -> int:
        return self.failed + self.dropped_full + self.dropped_at_close


_STOP = object()


class BackgroundTracker:
    """``tracker`` (a driver observer) run on its own thread with a bounded queue."""

    def __init__(
        self,
        tracker: Tracker,
        *,
        queue_size: int = QUEUE_SIZE,
        drain_s: float = DRAIN_S,
        drain_down_s: float = DRAIN_DOWN_S,
        stream: TextIO | None = None,
    ) -> None:
        self.tracker = tracker
        self.name = tracker.name
        self.queue_size = queue_size
        self.drain_s = drain_s
        self.drain_down_s = drain_down_s
        self.stream = stream
        self.counts = TrackerCounts()
        self._pending: collections.deque[Any] = collections.deque()
        self._lock = threading.Condition()
        self._last_failed = False
        self._call_started: float | None = None  # monotonic time of the call in flight
        self._closed = False
        self._thread = threading.Thread(
            target=self._work, name=f"parsearch-tracker-{self.name}", daemon=True
        )
        self._thread.start()

    def trial_finished(self, campaign: Campaign, record: TrialRecord) -> None:
        """Queue the trial; never blocks on the tracker."""
        with self._lock:
            self.counts.told += 1
            if self._closed or len(self._pending) >= self.queue_size:
                self.counts.dropped_full += 1
                first = self.counts.dropped_full == 1
            else:
                self._pending.append((campaign, record))
                self._lock.notify()
                return
        if first:
            self._say(
                f"warning: {self.name} is behind by {self.queue_size} trials; further trials "
                "are not sent to it (the store has them; counted)"
            )

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._pending:
                    self._lock.wait()
                item = self._pending[0]
                if item is not _STOP:
                    self._call_started = time.monotonic()
            if item is _STOP:
                break
            campaign, record = item
            try:
                self.tracker.trial_finished(campaign, record)
            except Exception as error:  # the store has the trial; keep going
                with self._lock:
                    self._call_started = None
                    self._pending.popleft()
                    self.counts.failed += 1
                    self._last_failed = True
                    first = self.counts.failed == 1
                    if len(self.counts.errors) < 3:
                        self.counts.errors.append(f"trial #{record.number}: {error}")
                if first:
                    self._say(
                        f"warning: {self.name} could not record trial #{record.number}: "
                        f"{error} (the store has it; the campaign goes on; further {self.name} "
                        "failures are counted)"
                    )
            else:
                with self._lock:
                    self._call_started = None
                    self._pending.popleft()
                    self.counts.logged += 1
                    self._last_failed = False
        try:
            self.tracker.close()
        except Exception as error:
            self._say(f"warning: {self.name} failed to close: {error}")

    def close(self) -> TrackerCounts:
        """Give the worker a few seconds to log what is queued (``drain_s``; ``drain_down_s``
        when the tracker looks down), then count what is left as dropped and say so."""
        with self._lock:
            self._closed = True
            self._pending.append(_STOP)
            self._lock.notify()
        deadline = time.monotonic() + self.drain_s
        while self._thread.is_alive():
            now = time.monotonic()
            with self._lock:  # checked again and again: a tracker may fail or hang now
                if self._looks_down(now):
                    deadline = min(deadline, now + self.drain_down_s)
            if now >= deadline:
                break
            self._thread.join(min(deadline - now, 0.1))
        with self._lock:  # a snapshot: a worker still in a call may finish it later
            counts = dataclasses.replace(self.counts, errors=list(self.counts.errors))
        counts.dropped_at_close = counts.told - counts.logged - counts.failed - counts.dropped_full
        if counts.not_logged:
            self._say(self.summary(counts))
        return counts

    def _looks_down(self, now: float) -> bool:
        """Its last call failed, or the one in flight has run past :data:`SLOW_CALL_S`."""
        started = self._call_started
        return self._last_failed or (started is not None and now - started > SLOW_CALL_S)

    def summary(self, counts: TrackerCounts) -> str:
        parts = [
            f"{n} {what}"
            for n, what in (
                (counts.failed, "failed"),
                (counts.dropped_full, "dropped while it was behind"),
                (counts.dropped_at_close, "still queued when the campaign ended"),
            )
            if n
        ]
        uri = getattr(self.tracker, "uri", None)
        target = f"{self.name}:{uri}" if uri else self.name
        return (
            f"{self.name}: logged {counts.logged} of {counts.told} finished trials "
            f"({', '.join(parts)}). The store has every trial: `parsearch export --store "
            f"STORE --to {target}` logs the missing ones"
        )

    def _say(self, text: str) -> None:
        print(text, file=self.stream or sys.stderr, flush=True)
