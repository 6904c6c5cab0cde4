"""The store's schema, as an ordered list of migrations.

A campaign lives for days and its store outlives the parsearch release that made it, so the
schema is never written in one piece: each :class:`Migration` takes version ``n - 1`` to ``n``,
and opening a store read-write applies the missing ones in order, in one transaction (SQLite's
DDL is transactional, so a failed upgrade leaves the old store as it was). A fresh store runs
every migration from the first: the upgrade path is the only path, and every test exercises it.

The ``schema_version`` table keeps one row per applied migration, so a store says which
release upgraded it and when. A store newer than the code is refused rather than guessed at.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass

from parsearch.errors import StoreError
from parsearch.result import TrialState


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    apply: Callable[[sqlite3.Connection], None]


def _v1_tables(conn: sqlite3.Connection) -> None:
    statements = (
        """CREATE TABLE schema_version (
            version INTEGER PRIMARY KEY,
            applied_at REAL NOT NULL
        )""",
        """CREATE TABLE campaigns (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL UNIQUE,
            space TEXT NOT NULL,
            space_path TEXT,
            seed INTEGER NOT NULL,
            budget INTEGER,
            backend TEXT NOT NULL,
            settings TEXT NOT NULL,
            versions TEXT NOT NULL,
            created_at REAL NOT NULL,
            finished_at REAL,
            status TEXT NOT NULL
        )""",
        """CREATE TABLE trials (
            id INTEGER PRIMARY KEY,
            campaign_id INTEGER NOT NULL REFERENCES campaigns (id) ON DELETE CASCADE,
            number INTEGER NOT NULL,
            key TEXT NOT NULL,
            config TEXT NOT NULL,
            state TEXT NOT NULL,
            attempt INTEGER NOT NULL DEFAULT 0,
            origin TEXT NOT NULL,
            created_at REAL NOT NULL,
            started_at REAL,
            finished_at REAL,
            duration_s REAL,
            hosts TEXT NOT NULL DEFAULT '[]',
            metrics TEXT NOT NULL DEFAULT '{}',
            predicted TEXT,
            error TEXT,
            log_tail TEXT NOT NULL DEFAULT '',
            UNIQUE (campaign_id, key),
            UNIQUE (campaign_id, number)
        )""",
        "CREATE INDEX trials_by_state ON trials (campaign_id, state)",
        """CREATE TABLE leases (
            campaign_id INTEGER PRIMARY KEY REFERENCES campaigns (id) ON DELETE CASCADE,
            owner TEXT NOT NULL,
            host TEXT NOT NULL,
            pid INTEGER NOT NULL,
            acquired_at REAL NOT NULL,
            heartbeat_at REAL NOT NULL
        )""",
    )
    for statement in statements:
        conn.execute(statement)


def _v2_query_columns(conn: sqlite3.Connection) -> None:
    """Copy the figures queries sort and filter on out of JSON into indexed columns.

    Version 1 kept them in ``metrics`` (and the objective's name in ``settings``) only, so
    best / top / Pareto had to decode every trial; at 100 000 trials that is seconds, not
    milliseconds. Existing rows are back-filled in Python, which reads the same JSON the
    store wrote (SQLite's JSON functions reject the NaN Python may have written).
    """
    for statement in (
        "ALTER TABLE campaigns ADD COLUMN objective_metric TEXT NOT NULL DEFAULT 'tokens_per_s'",
        "ALTER TABLE trials ADD COLUMN objective REAL",
        "ALTER TABLE trials ADD COLUMN tokens_per_s REAL",
        "ALTER TABLE trials ADD COLUMN peak_mem_bytes REAL",
    ):
        conn.execute(statement)

    metric_of: dict[int, str] = {}
    for campaign_id, settings in conn.execute("SELECT id, settings FROM campaigns").fetchall():
        metric_of[campaign_id] = json.loads(settings).get("objective_metric", "tokens_per_s")
        conn.execute(
            "UPDATE campaigns SET objective_metric = ? WHERE id = ?",
            (metric_of[campaign_id], campaign_id),
        )

    def number(value: object) -> float | None:
        return float(value) if isinstance(value, (int, float)) else None

    updates = []
    for trial_id, campaign_id, state, metrics_text in conn.execute(
        "SELECT id, campaign_id, state, metrics FROM trials"
    ):
        metrics = json.loads(metrics_text)
        objective = metrics.get(metric_of[campaign_id]) if state == TrialState.OK.value else None
        updates.append(
            (
                number(objective),
                number(metrics.get("tokens_per_s")),
                number(metrics.get("peak_mem_bytes")),
                trial_id,
            )
        )
    conn.executemany(
        "UPDATE trials SET objective = ?, tokens_per_s = ?, peak_mem_bytes = ? WHERE id = ?",
        updates,
    )

    # best / top walk the first index in objective order and stop after k rows; the Pareto
    # sweep walks the second in memory order. Both cover (campaign_id, state), which makes
    # version 1's index redundant.
    for statement in (
        "DROP INDEX trials_by_state",
        "CREATE INDEX trials_by_objective "
        "ON trials (campaign_id, state, objective DESC, peak_mem_bytes)",
        "CREATE INDEX trials_by_memory "
        "ON trials (campaign_id, state, peak_mem_bytes, objective DESC)",
    ):
        conn.execute(statement)


def _v3_lease_fencing(conn: sqlite3.Connection) -> None:
    """Fence drivers by lease generation, and record what takeover needs of the holder.

    ``campaigns.lease_generation`` counts every acquisition of the campaign's lease (it
    survives the lease row, which a release deletes); a driver writes only while the lease row
    still carries its owner and generation, checked inside each write's transaction, so a
    driver that was paused past its lease (SIGSTOP, a partitioned node) and wakes after a
    takeover is refused instead of overwriting its successor's trials. ``stale_after_s`` is
    the holder's own takeover threshold, which newcomers must respect; ``process`` identifies
    the holder's process beyond its pid, so a holder on the same host that has exited is
    taken over at once (see :mod:`parsearch.store.liveness`).
    """
    for statement in (
        "ALTER TABLE campaigns ADD COLUMN lease_generation INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE leases ADD COLUMN generation INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE leases ADD COLUMN stale_after_s REAL",
        "ALTER TABLE leases ADD COLUMN process TEXT",
    ):
        conn.execute(statement)


def _v4_stop_reason(conn: sqlite3.Connection) -> None:
    """Record why a campaign stopped short of its budget, and when.

    A driver that fails (a full disk, a backend that broke) used to leave its campaign marked
    ``running`` with nothing to say why; ``status`` and the next driver now read the reason
    (the error, or the signal or timeout that stopped it) from the campaign row. Both are
    NULL while a driver runs it and once it finished.
    """
    for statement in (
        "ALTER TABLE campaigns ADD COLUMN stop_reason TEXT",
        "ALTER TABLE campaigns ADD COLUMN stopped_at REAL",
    ):
        conn.execute(statement)


def _v5_trial_fidelity(conn: sqlite3.Connection) -> None:
    """Record which trials ran as proxies: ``proxy_dp`` is the data-parallel size a proxy
    trial ran at (``NULL``: the trial ran at full scale, as every trial before version 5).

    A proxy's row holds the full-scale layout in ``config`` and the full-scale figures
    predicted from its measurement in ``metrics`` (its own in ``metrics["fidelity"]``), and
    is keyed by the layout it ran (dp'), so a later full-scale confirmation of the same
    layout is a trial of its own under ``UNIQUE (campaign_id, key)``.
    """
    conn.execute("ALTER TABLE trials ADD COLUMN proxy_dp INTEGER")


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "campaigns, trials and leases", _v1_tables),
    Migration(2, "indexed objective, tokens_per_s and peak_mem_bytes columns", _v2_query_columns),
    Migration(3, "lease generation (fencing), holder's threshold and process", _v3_lease_fencing),
    Migration(4, "why and when a campaign stopped short of its budget", _v4_stop_reason),
    Migration(5, "trial fidelity: the dp a proxy trial ran at", _v5_trial_fidelity),
)
SCHEMA_VERSION = MIGRATIONS[-1].version


def schema_version(conn: sqlite3.Connection, where: str) -> int:
    """The version of the store behind ``conn``: 0 for an empty database.

    A database with tables but no ``schema_version`` belongs to some other program; writing
    our tables into it would damage it, so it is refused.
    """
    tables = {
        name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
    }
    if "schema_version" in tables:
        (version,) = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
        return int(version or 0)
    if tables:
        raise StoreError(
            f"{where} is an SQLite database but not a parsearch store "
            f"(its tables are {sorted(tables)}); give parsearch a new file"
        )
    return 0


def check_version(version: int, where: str) -> None:
    """Refuse a store written by a newer parsearch: its meaning is unknown to this code."""
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"store {where} has schema version {version}, but this parsearch knows versions up "
            f"to {SCHEMA_VERSION}: upgrade parsearch (pip install --upgrade parsearch) to open it"
        )


def migrate(conn: sqlite3.Connection, where: str) -> None:
    """Bring the store up to :data:`SCHEMA_VERSION`; call inside a write transaction."""
    current = schema_version(conn, where)
    check_version(current, where)
    for migration in MIGRATIONS[current:]:
        migration.apply(conn)
        conn.execute(
            "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)",
            (migration.version, time.time()),
        )
