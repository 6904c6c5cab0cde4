"""The results store: campaigns and trials in one SQLite file (see :mod:`.sqlite` for why so),
or in a PostgreSQL database a centre shares (a ``postgresql://`` URL, see :mod:`.postgres`).

``open_store(path)`` for the driver, the single writer; ``open_store(path, readonly=True)``
for everything that only reads (status, best, top, export, notebooks).
"""

from __future__ import annotations

import os

from parsearch.store.postgres import PostgreSQLStore, is_postgres_url
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
from parsearch.store.urls import resume_command


def open_store(path: str | os.PathLike[str], readonly: bool = False) -> Store:
    """Open (read-write: create or upgrade) the store at ``path``; ``":memory:"`` for tests;
    a ``postgresql://user@host/db`` URL for a server."""
    if is_postgres_url(path):
        return PostgreSQLStore(str(path), readonly=readonly)
    return SQLiteStore(path, readonly=readonly)


__all__ = [
    "SCHEMA_VERSION",
    "Campaign",
    "CampaignExistsError",
    "CampaignStatus",
    "LeaseHolder",
    "PostgreSQLStore",
    "SQLiteStore",
    "Store",
    "TrialRecord",
    "fidelity_note",
    "is_postgres_url",
    "open_store",
    "resume_command",
]
