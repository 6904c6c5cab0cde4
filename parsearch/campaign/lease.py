"""The single-driver lease of a campaign, kept alive by a background thread.

The store refuses a second driver while the holder's heartbeat is younger than
``stale_after_s``. The heartbeat runs on its own thread so that a long DeepHyper call or a
slow store write in the driver loop never makes a live driver look dead; a driver that
really died (kill -9, node failure) stops beating and is taken over once the heartbeat is
stale by the holder's own timeout, or at once when its process on this host has exited.

The lease is a fence, not only a lock: each acquisition gets a new generation, and every
write the store makes for this driver checks it in the same transaction, so a driver that
was paused past its timeout (SIGSTOP, a partitioned node) and wakes after a takeover is
refused its first write and stops, leaving its successor's trials alone.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid

from parsearch.errors import CampaignLockedError, StoreError, StoreUnavailableError, UsageError
from parsearch.store import Store

log = logging.getLogger(__name__)

DEFAULT_STALE_AFTER_S = 60.0
# The heartbeat beats four times per lease timeout; below a quarter of a second a beat may
# wait longer than that for the store (an fsync, another thread's transaction) and a live
# driver would look dead.
BEATS_PER_TIMEOUT = 4
MIN_STALE_AFTER_S = 1.0
MAX_STALE_AFTER_S = 86400.0


def check_lease_timeout(seconds: float) -> float:
    """``seconds`` if it is a usable lease timeout, else :class:`UsageError` saying what is."""
    if not MIN_STALE_AFTER_S <= seconds <= MAX_STALE_AFTER_S:  # False for NaN too
        raise UsageError(
            f"the lease timeout must lie in [{MIN_STALE_AFTER_S:g}, {MAX_STALE_AFTER_S:g}] "
            f"seconds ({BEATS_PER_TIMEOUT} heartbeats of at least "
            f"{MIN_STALE_AFTER_S / BEATS_PER_TIMEOUT:g} s), got {seconds:g}"
        )
    return seconds


class Lease:
    """Hold a campaign's lease for the duration of a ``with`` block."""

    def __init__(
        self, store: Store, campaign_id: int, *, stale_after_s: float = DEFAULT_STALE_AFTER_S
    ):
        check_lease_timeout(stale_after_s)
        self.store = store
        self.campaign_id = campaign_id
        self.stale_after_s = stale_after_s
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.generation: int | None = None
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="parsearch-lease", daemon=True)

    def __enter__(self) -> Lease:
        self.generation = self.store.acquire_lease(
            self.campaign_id, self.owner, stale_after_s=self.stale_after_s
        )
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, *_: object
    ) -> None:
        self._stop.set()
        self._thread.join()
        if self._lost is None:
            try:
                self.store.release_lease(self.campaign_id, self.owner)
            except StoreError as error:
                if exc_type is None and not isinstance(error, StoreUnavailableError):
                    raise
                # The error that ended the session (say a full disk) or the outage it
                # drained for is the one to report; a lease left behind by an exited process
                # is taken over at once. Said after that error, as a note of it, not before.
                said = f"could not release the lease: {error}"
                if exc is not None:
                    exc.add_note(said)
                else:
                    log.warning("warning: %s", said)

    def check(self) -> None:
        """Raise :class:`CampaignLockedError` if another driver took the campaign over."""
        if self._lost is not None:
            raise CampaignLockedError(self._lost)

    def _beat(self) -> None:
        # Four beats per stale period: one late beat (a busy store) never loses the lease.
        while not self._stop.wait(self.stale_after_s / BEATS_PER_TIMEOUT):
            try:
                self.store.heartbeat(self.campaign_id, self.owner)
            except CampaignLockedError as error:
                self._lost = f"{error}; this driver stops without writing anything more"
                return
            except StoreError as error:
                log.warning("lease heartbeat failed, will retry: %s", error)
