"""Stopping a campaign cleanly: SIGTERM, SIGINT and SIGUSR1 ask the driver to drain.

Slurm sends SIGUSR1 ahead of the time limit (``--signal=B:USR1@120``) and SIGTERM at it,
then SIGKILL after ``KillWait``. On the first signal the driver starts nothing new, lets
running trials finish for up to a grace period, marks the rest interrupted and exits 0, so
``parsearch resume`` continues where it stopped. A second signal cuts the grace short.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


class StopRequest:
    """Whether, why and since when the driver was asked to stop."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.since: float | None = None
        self.urgent = False

    @property
    def requested(self) -> bool:
        return self.reason is not None

    def request(self, reason: str) -> None:
        """The first request starts the drain; a later one makes it urgent."""
        if self.reason is None:
            self.reason = reason
            self.since = time.monotonic()
        else:
            self.urgent = True

    @contextlib.contextmanager
    def on_signals(self) -> Iterator[StopRequest]:
        """Turn the stop signals into requests for the duration of the block.

        Outside the main thread (where Python cannot install handlers) this does nothing:
        the caller stops the driver by calling :meth:`request` itself.
        """
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}

        def handler(signum: int, frame: object) -> None:
            self.request(signal.Signals(signum).name)

        for sig in STOP_SIGNALS:
            signal.signal(sig, handler)
        try:
            yield self
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)
