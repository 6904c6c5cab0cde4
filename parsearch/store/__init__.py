"""The results store: campaigns and trials in one SQLite file (see :mod:`.sqlite` for why so).

``open_store(path)`` for the driver, the single writer; ``open_store(path, readonly=True)``
for everything that only reads (status, best, top, export, notebooks).
"""

from __future__ import annotations

import os

from parsearch.store.protocol import Store
from parsearch.store.records import (
    Campaign,
    CampaignStatus,
    LeaseHolder,
    TrialRecord,
    fidelity_note,
)
from parsearch.store.schema import SCHEMA_VERSION
from parsearch.store.sqlite import CampaignExistsError, SQLiteStore


def open_store(path: str | os.PathLike[str], readonly: bool = False) -> Store:
    """Open (read-write: create or upgrade) the store at ``path``; ``":memory:"`` for tests."""
    return SQLiteStore(path, readonly=readonly)


__all__ = [
    "SCHEMA_VERSION",
    "Campaign",
    "CampaignExistsError",
    "CampaignStatus",
    "LeaseHolder",
    "SQLiteStore",
    "Store",
    "TrialRecord",
    "fidelity_note",
    "open_store",
]
