"""The single-driver lease of a campaign, kept alive by a background thread.

The store refuses a second driver while the holder's heartbeat is younger than
``stale_after_s``. The heartbeat runs on its own thread so that a long DeepHyper call or a
slow store write in the driver loop never makes a live driver look dead; a driver that
really died (kill -9, node failure) stops beating and is taken over once the heartbeat is
stale.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid

from parsearch.errors import CampaignLockedError, StoreError
from parsearch.store import Store

log = logging.getLogger(__name__)

DEFAULT_STALE_AFTER_S = 60.0


class Lease:
    """Hold a campaign's lease for the duration of a ``with`` block."""

    def __init__(
        self, store: Store, campaign_id: int, *, stale_after_s: float = DEFAULT_STALE_AFTER_S
    ):
        if stale_after_s <= 0:
            raise StoreError(f"the lease timeout must be > 0 s, got {stale_after_s:g}")
        self.store = store
        self.campaign_id = campaign_id
        self.stale_after_s = stale_after_s
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="parsearch-lease", daemon=True)

    def __enter__(self) -> Lease:
        self.store.acquire_lease(self.campaign_id, self.owner, stale_after_s=self.stale_after_s)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        if self._lost is None:
            self.store.release_lease(self.campaign_id, self.owner)

    def check(self) -> None:
        """Raise :class:`CampaignLockedError` if another driver took the campaign over."""
        if self._lost is not None:
            raise CampaignLockedError(self._lost)

    def _beat(self) -> None:
        # Four beats per stale period: one late beat (a busy store) never loses the lease.
        while not self._stop.wait(self.stale_after_s / 4):
            try:
                self.store.heartbeat(self.campaign_id, self.owner)
            except CampaignLockedError as error:
                self._lost = f"{error}; this driver stops without writing anything more"
                return
            except StoreError as error:
                log.warning("lease heartbeat failed, will retry: %s", error)
