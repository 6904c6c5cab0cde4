"""How long the driver has gone without its store, and when to try it again.

A store that cannot be reached (a PostgreSQL restart or failover, an SQLite file on a
network filesystem that stalls past its busy timeout) is no reason to end a campaign whose
trials may each have cost an hour of an allocation: the driver keeps its running trials and
their results, tries the store again with a growing pause (so that a hundred drivers do not
hammer a server coming back up), and goes on when a write succeeds. Only past
``limit_s`` does it give up and drain, keeping what it could not write
(:mod:`parsearch.campaign.kept`).
"""

from __future__ import annotations

import time

# Long enough for a server restart or failover, a NFS server's reboot, a Lustre recovery
# window; short enough that a store that is really gone does not hold an allocation idle.
DEFAULT_OUTAGE_LIMIT_S = 300.0
FIRST_PAUSE_S = 0.25
MAX_PAUSE_S = 5.0


class Outage:
    """The store's current outage, if any: since when, the last error, the next try."""

    def __init__(self, limit_s: float = DEFAULT_OUTAGE_LIMIT_S) -> None:
        self.limit_s = limit_s
        self.since: float | None = None
        self.error: str | None = None
        self._pause = FIRST_PAUSE_S
        self._next_try = 0.0

    @property
    def active(self) -> bool:
        return self.since is not None

    @property
    def lasted_s(self) -> float:
        return 0.0 if self.since is None else time.monotonic() - self.since

    @property
    def exceeded(self) -> bool:
        """Whether the store has been unreachable for longer than the limit."""
        return self.since is not None and self.lasted_s >= self.limit_s

    def failed(self, error: Exception) -> bool:
        """Note a failed try; whether it began an outage (the first failure)."""
        now = time.monotonic()
        began = self.since is None
        if began:
            self.since = now
            self._pause = FIRST_PAUSE_S
        else:
            self._pause = min(self._pause * 2, MAX_PAUSE_S)
        self.error = str(error)
        self._next_try = now + self._pause
        return began

    def due_in_s(self) -> float:
        """Seconds until the store should be tried again (0 when there is no outage)."""
        return 0.0 if self.since is None else max(0.0, self._next_try - time.monotonic())

    def ended(self) -> float:
        """Close the outage after a successful write; how long it lasted."""
        lasted = self.lasted_s
        self.since = None
        self.error = None
        return lasted
