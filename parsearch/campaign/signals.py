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
# What arrived before the session could listen (hold_early_stops), for it to replay.
_early: list[str] = []


@contextlib.contextmanager
def early_stops_held() -> Iterator[None]:
    """Record SIGTERM and SIGUSR1 that arrive while a driver starts, for the session to act
    on once it listens (:meth:`StopRequest.on_signals`); the handlers before are restored
    after the block where nobody replaced ours meanwhile.

    Importing torch and DeepHyper takes seconds, and a scheduler does not wait: Slurm's
    warning before the time limit, a ``scancel`` or a requeue may come meanwhile. Left to
    their default action they kill the process before it can drain, or (SIGUSR1 ignored
    under MPI) the warning is lost and the job runs into its limit. SIGINT keeps its
    KeyboardInterrupt.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = (signal.SIGTERM, signal.SIGUSR1)
    previous = {sig: signal.getsignal(sig) for sig in held}

    def early(signum: int, frame: object) -> None:
        _early.append(signal.Signals(signum).name)

    for sig in held:
        signal.signal(sig, early)
    try:
        yield
    finally:
        for sig, old in previous.items():
            # Only where ours is still in place: an MPI worker ignores SIGUSR1 to its very
            # end (srun passes a late warning to every task; the default would kill it).
            if signal.getsignal(sig) is early:
                signal.signal(sig, old)
        _early.clear()


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
        while _early:
            self.request(_early.pop(0))
        try:
            yield self
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)
