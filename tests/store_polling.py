"""Reading a store that a driver in another process is writing, as tests that poll one do."""

from __future__ import annotations

from pathlib import Path

from parsearch.errors import StoreError
from parsearch.store import TrialRecord, open_store


def campaign_trials(db: Path, *, recover: bool = False) -> list[TrialRecord]:
    """The trials of the store's first campaign: none before the driver has created it.

    Read-only, a file the driver is still creating reads as an empty database (its first
    transaction not yet committed): that is "none yet", not an error. ``recover``: open
    read-write, which rolls back a write a killed driver left half done; an error then is
    one.
    """
    if not db.exists():
        return []
    try:
        store = open_store(db, readonly=not recover)
    except StoreError:
        if recover:
            raise
        return []
    with store:
        campaigns = store.list_campaigns()
        return store.trials(campaigns[0].id) if campaigns else []
