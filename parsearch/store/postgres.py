"""The results store on a PostgreSQL server: one database a whole centre's drivers share.

SQLite is the embedded default (one file beside a campaign); a server is what many drivers,
dashboards and query commands on different hosts write and read at once without trusting a
network filesystem's locks. :class:`PostgreSQLStore` is :class:`~.sqlite.SQLiteStore`'s
logic over another connection: every method, its checks and its fencing are the same code
(so the two cannot drift apart), and only the connection, the schema's DDL and two
statements whose SQL differs are this module's.

How the same guarantees hold here:

* **One writer at a time, per campaign.** SQLite's ``BEGIN IMMEDIATE`` serialises writers,
  which the store's read-then-write sequences (the next trial number, the lease check before
  a takeover, the fence before a write) rely on. Those sequences never span two campaigns,
  so a write transaction here first takes a transaction-scoped advisory lock keyed by its
  schema and its campaign (the campaign list's own key for creating a campaign, the tables
  or a copy): writers of one campaign are serialised as on SQLite, and writers of different
  campaigns, or of different schemas, never wait for each other. Waiting is bounded by
  ``lock_timeout``, and a timeout names the session that holds the lock.
* **No session holds what others need for long.** The store's sessions set
  ``idle_in_transaction_session_timeout`` (a stopped or swapping client's open transaction
  is ended by the server), ``statement_timeout`` and ``lock_timeout``, and connect with TCP
  keepalives (a crashed client's session ends when its host stops answering); each unless
  the URL, ``PGOPTIONS``, or the role or database's own settings chose a value.
* **Readers see one snapshot.** A read runs in a ``REPEATABLE READ READ ONLY``
  transaction, and a read-only store's session refuses every write.
* **Lossless values.** Floats are ``DOUBLE PRECISION`` (SQLite's ``REAL``) and JSON stays
  ``TEXT`` as the store wrote it (``jsonb`` would reorder keys and refuse NaN), so
  ``parsearch store copy`` moves rows between the two byte for byte.

psycopg is imported only when a ``postgresql://`` store is opened: ``import parsearch``
stays light, and SQLite users need not install it (``pip install parsearch[postgres]``).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import parsearch.store.schema as schema
from parsearch.errors import StoreError, StoreUnavailableError
from parsearch.store.connection import Database
from parsearch.store.sqlite import SQLiteStore

if TYPE_CHECKING:
    import psycopg

URL_SCHEMES = ("postgresql://", "postgres://")
# The advisory locks of write transactions: (this schema's key, campaign id), or
# (this schema's key, 0) for the campaign list, the tables and a copy (ids start at 1).
_SCHEMA_KEY = "hashtext('parsearch:' || current_schema())"
_CAMPAIGN_KEY = "mod(%s, 2147483647)::integer"
_STORE_KEY = 0
# Server settings the store's sessions take unless the URL, PGOPTIONS or the role or
# database set them (pg_settings.source says which): a transaction left open by a stopped
# client ends within seconds, and no statement of the store runs for ever.
_SESSION_SETTINGS = {
    "idle_in_transaction_session_timeout": "15s",
    "statement_timeout": "300s",
}
_CHOSEN_SOURCES = ("client", "user", "database", "database user", "session")
# libpq's TCP keepalives (a crashed client host's session ends within about a minute instead
# of the kernel's two hours), unless the URL or the environment sets them.
_KEEPALIVES = {
    "keepalives": "1",
    "keepalives_idle": "30",
    "keepalives_interval": "10",
    "keepalives_count": "3",
}
# Seconds to wait for the server when neither the URL's connect_timeout nor PGCONNECT_TIMEOUT
# says: a query command answers quickly or says why; a driver rides out a slow server start.
READER_CONNECT_TIMEOUT_S = 5
WRITER_CONNECT_TIMEOUT_S = 30
# Who holds a lock another write waits for, as pg_stat_activity shows each session.
_HOLDER_COLUMNS = (
    "a.pid, a.application_name, COALESCE(a.client_hostname, host(a.client_addr)), a.state, "
    "extract(epoch FROM now() - a.state_change), extract(epoch FROM now() - a.xact_start)"
)
_ADVISORY_HOLDERS = (
    f"SELECT DISTINCT {_HOLDER_COLUMNS} FROM pg_locks l JOIN pg_stat_activity a "
    "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "AND l.classid = ({schema_key})::oid AND l.objid = ({key})::oid"
)
_TABLE_HOLDERS = (
    f"SELECT DISTINCT {_HOLDER_COLUMNS} FROM pg_locks l JOIN pg_stat_activity a "
    "ON a.pid = l.pid JOIN pg_class c ON c.oid = l.relation "
    "WHERE l.granted AND l.pid <> pg_backend_pid() AND l.mode <> 'AccessShareLock' "
    "AND c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())"
)
_PLACEHOLDER = re.compile(r"\?")
# Tables whose rows have an ``id`` a caller reads back after INSERT (SQLite's lastrowid).
_RETURNING_ID = re.compile(r"^\s*INSERT INTO (campaigns|trials)\b", re.IGNORECASE)

# The schema at SCHEMA_VERSION, in PostgreSQL's types: the SQLite store reaches the same
# tables through its migrations (same columns, same order, same constraints and indexes).
_TABLES = (
    """CREATE TABLE schema_version (
        version INTEGER PRIMARY KEY,
        applied_at DOUBLE PRECISION NOT NULL
    )""",
    """CREATE TABLE campaigns (
        id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        space TEXT NOT NULL,
        space_path TEXT,
        seed BIGINT NOT NULL,
        budget BIGINT,
        backend TEXT NOT NULL,
        settings TEXT NOT NULL,
        versions TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        finished_at DOUBLE PRECISION,
        status TEXT NOT NULL,
        objective_metric TEXT NOT NULL DEFAULT 'tokens_per_s',
        lease_generation BIGINT NOT NULL DEFAULT 0,
        stop_reason TEXT,
        stopped_at DOUBLE PRECISION
    )""",
    """CREATE TABLE trials (
        id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
        campaign_id BIGINT NOT NULL REFERENCES campaigns (id) ON DELETE CASCADE,
        number BIGINT NOT NULL,
        key TEXT NOT NULL,
        config TEXT NOT NULL,
        state TEXT NOT NULL,
        attempt BIGINT NOT NULL DEFAULT 0,
        origin TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        started_at DOUBLE PRECISION,
        finished_at DOUBLE PRECISION,
        duration_s DOUBLE PRECISION,
        hosts TEXT NOT NULL DEFAULT '[]',
        metrics TEXT NOT NULL DEFAULT '{}',
        predicted TEXT,
        error TEXT,
        log_tail TEXT NOT NULL DEFAULT '',
        objective DOUBLE PRECISION,
        tokens_per_s DOUBLE PRECISION,
        peak_mem_bytes DOUBLE PRECISION,
        proxy_dp BIGINT,
        UNIQUE (campaign_id, key),
        UNIQUE (campaign_id, number)
    )""",
    "CREATE INDEX trials_by_objective "
    "ON trials (campaign_id, state, objective DESC, peak_mem_bytes)",
    "CREATE INDEX trials_by_memory ON trials (campaign_id, state, peak_mem_bytes, objective DESC)",
    """CREATE TABLE leases (
        campaign_id BIGINT PRIMARY KEY REFERENCES campaigns (id) ON DELETE CASCADE,
        owner TEXT NOT NULL,
        host TEXT NOT NULL,
        pid BIGINT NOT NULL,
        acquired_at DOUBLE PRECISION NOT NULL,
        heartbeat_at DOUBLE PRECISION NOT NULL,
        generation BIGINT NOT NULL DEFAULT 0,
        stale_after_s DOUBLE PRECISION,
        process TEXT
    )""",
)


def is_postgres_url(store: object) -> bool:
    """Whether ``--store`` names a PostgreSQL server rather than an SQLite file."""
    return str(store).startswith(URL_SCHEMES)


def shown_url(url: str) -> str:
    """The URL without its password: what error messages and ``store.path`` say."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


class _Cursor:
    """A psycopg cursor as the store's SQL reads it: ``lastrowid`` like sqlite3's."""

    def __init__(self, cursor: psycopg.Cursor[Any], lastrowid: int | None) -> None:
        self._cursor = cursor
        self.lastrowid = lastrowid

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    def fetchone(self) -> tuple[Any, ...] | None:
        return self._cursor.fetchone()

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self._cursor.fetchall()

    @property
    def description(self) -> Any:
        return self._cursor.description

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self._cursor)


class _Connection:
    """The statements of :class:`~.sqlite.SQLiteStore`, run on PostgreSQL.

    The store's SQL is written once, in the subset both databases speak; this translates the
    one thing that differs in every statement, sqlite3's ``?`` placeholders (psycopg's are
    ``%s``; the store's SQL holds no ``?`` or ``%`` of its own), and reads back the id an
    INSERT made, which sqlite3 offers as ``lastrowid``.
    """

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> _Cursor:
        returning = _RETURNING_ID.match(sql) is not None
        if returning:
            sql += " RETURNING id"
        cursor = self._conn.execute(_PLACEHOLDER.sub("%s", sql), tuple(params))
        if not returning:
            return _Cursor(cursor, None)
        row = cursor.fetchone()
        return _Cursor(cursor, None if row is None else int(row[0]))


class PostgresDatabase(Database):
    """One psycopg connection under :class:`~.connection.Database`'s transaction helper
    (it says how a transaction begins; the helper commits, rolls back and maps errors).

    Like :class:`~.connection.Database`: statements are serialised on a lock (a heartbeat
    thread beside the driver loop), and every database error leaves as a
    :class:`StoreError` that names the server and what to do.
    """

    def __init__(self, url: str, *, readonly: bool = False, timeout_s: float = 30.0) -> None:
        try:
            import psycopg
        except ImportError:
            raise StoreError(
                f"store {shown_url(url)} is a PostgreSQL server, which needs psycopg: "
                "pip install 'parsearch[postgres]'"
            ) from None
        self._psycopg = psycopg
        self.driver_error = psycopg.Error
        self.readonly = readonly
        self.timeout_s = timeout_s
        self.path = shown_url(url)
        self._lock = threading.RLock()
        self._url = url
        # The lock a write transaction is waiting for: ("campaign" | "trial", id) or
        # ("store", None); None once it holds it (see serialise).
        self._awaited: tuple[str, int | None] | None = None
        try:
            self._conn = self._server_connection()
        except psycopg.Error as exc:
            raise StoreError(
                f"cannot connect to store {self.path}: {str(exc).strip()}; check that the "
                "server runs and the URL's user, host and database"
            ) from None
        try:
            self.settings = self._configure_session()
        except psycopg.Error as exc:
            raise self.error(exc, "opening it") from exc

    def _server_connection(self) -> psycopg.Connection[Any]:
        return self._psycopg.connect(
            self._url, autocommit=True, **self._connect_defaults(self._url)
        )

    def _reconnect(self) -> None:
        """A new session with the store's settings after the server dropped the last (a
        restart, a failover)."""
        self._conn = self._server_connection()
        try:
            self.settings = self._configure_session()
        except BaseException:
            self._conn.close()  # the next transaction tries again
            raise

    def _connect_defaults(self, url: str) -> dict[str, str]:
        """libpq parameters the store chooses where neither the URL nor the environment
        (``PGCONNECT_TIMEOUT``, ``PGAPPNAME``) did: the connect timeout (short for a query
        command), TCP keepalives, and an application_name that names this process and host
        in ``pg_stat_activity`` (and in another driver's lock-timeout message)."""
        from psycopg.conninfo import conninfo_to_dict

        try:
            given = conninfo_to_dict(url)
        except self._psycopg.Error:
            return {}  # psycopg.connect says what is wrong with the URL
        connect_s = READER_CONNECT_TIMEOUT_S if self.readonly else WRITER_CONNECT_TIMEOUT_S
        defaults = {
            "connect_timeout": str(connect_s),
            "application_name": f"parsearch {os.getpid()}@{socket.gethostname()}"[:63],
            **_KEEPALIVES,
        }
        environment = {"connect_timeout": "PGCONNECT_TIMEOUT", "application_name": "PGAPPNAME"}
        return {
            name: value
            for name, value in defaults.items()
            if name not in given and environment.get(name, "") not in os.environ
        }

    def _configure_session(self) -> dict[str, str]:
        """Set the store's server-side timeouts where the URL's ``options``, ``PGOPTIONS``
        or the role or database did not; return each one's value in force."""
        wanted = {**_SESSION_SETTINGS, "lock_timeout": f"{int(self.timeout_s * 1000)}ms"}
        sources = dict(
            self._conn.execute(
                "SELECT name, source FROM pg_settings WHERE name = ANY(%s)", (list(wanted),)
            ).fetchall()
        )
        for name, value in wanted.items():
            if sources.get(name) not in _CHOSEN_SOURCES:
                self._conn.execute(f"SET {name} = '{value}'")
        if self.readonly:
            self._conn.execute("SET default_transaction_read_only = on")
        return {name: str(self._conn.execute(f"SHOW {name}").fetchone()[0]) for name in wanted}

    def _begin(self, write: bool) -> None:
        """Begin on a live connection: a lost one is opened again (once more if it breaks at
        ``BEGIN``: the server restarted while it was idle); a failure to reconnect is an
        :class:`~parsearch.errors.StoreUnavailableError` that the driver retries."""
        if self._conn.closed:
            self._reconnect()
        try:
            self._begin_on_connection(write)
        except self._psycopg.OperationalError:
            if not self._conn.closed:
                raise
            self._reconnect()
            self._begin_on_connection(write)

    def _begin_on_connection(self, write: bool) -> None:
        """A write is READ COMMITTED, and takes its campaign's lock first
        (:meth:`serialise`); a read sees one snapshot."""
        if write:
            self._conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
        else:
            self._conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")

    def serialise(self, *, campaign: int | None = None, trial: int | None = None) -> None:
        """Take the advisory lock of the campaign (or of ``trial``'s campaign, or of the
        campaign list), waiting up to ``lock_timeout``; it is held until the transaction
        ends. Keyed by the schema too: stores in other schemas of the database never wait."""
        if trial is not None:
            self._awaited = ("trial", trial)
            self._conn.execute(
                f"SELECT pg_advisory_xact_lock({_SCHEMA_KEY}, "
                f"{_CAMPAIGN_KEY % 'campaign_id'}) FROM trials WHERE id = %s",
                (trial,),
            )
        elif campaign is not None:
            self._awaited = ("campaign", campaign)
            self._conn.execute(
                f"SELECT pg_advisory_xact_lock({_SCHEMA_KEY}, {_CAMPAIGN_KEY})", (campaign,)
            )
        else:
            self._awaited = ("store", None)
            self._conn.execute(f"SELECT pg_advisory_xact_lock({_SCHEMA_KEY}, {_STORE_KEY})")
        self._awaited = None

    def _statements(self) -> _Connection:
        return _Connection(self._conn)

    def _rollback(self) -> None:
        # A broken connection cannot roll back; the caller's error is the one to report.
        with contextlib.suppress(self._psycopg.Error):
            self._conn.execute("ROLLBACK")

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def error(self, exc: Exception, action: str) -> StoreError:
        """A :class:`StoreError` that says what failed on which server, and what to do."""
        errors = self._psycopg.errors
        where = self.path
        if isinstance(exc, errors.LockNotAvailable):
            awaited, self._awaited = self._awaited, None
            waited = self.settings.get("lock_timeout", f"{self.timeout_s:g}s")
            return StoreError(
                f"store {where} stayed locked for more than {waited} (lock_timeout) while "
                f"{action}: {self._holders(awaited)}"
            )
        if isinstance(exc, errors.IdleInTransactionSessionTimeout):
            idle = self.settings.get("idle_in_transaction_session_timeout", "its limit")
            return StoreError(
                f"store {where}: the server ended this session while {action}: it sat inside "
                f"a transaction for more than {idle} (idle_in_transaction_session_timeout; "
                "was this process stopped?); nothing of it was written; run the command again"
            )
        if isinstance(exc, errors.QueryCanceled):
            limit = self.settings.get("statement_timeout", "its limit")
            return StoreError(
                f"store {where}: {action} ran for more than {limit} (statement_timeout) and "
                "was cancelled; nothing of it was written. Set a longer one in the URL "
                "(options=-c statement_timeout=...) if the server is this slow"
            )
        if isinstance(exc, errors.ReadOnlySqlTransaction):
            return StoreError(f"store {where} is open read-only; {action} needs a writer")
        if isinstance(exc, errors.UniqueViolation):
            return StoreError(f"store {where}: {action} would record a row twice ({exc})")
        if isinstance(exc, self._psycopg.OperationalError):
            return StoreUnavailableError(
                f"lost the connection to store {where} while {action} ({str(exc).strip()}); "
                "nothing of it was written; check the server and run the command again"
            )
        return StoreError(f"store {where}: {action} failed: {str(exc).strip()}")

    def _holders(self, awaited: tuple[str, int | None] | None) -> str:
        """Who holds the lock a write waited for: each session's server pid, its
        application_name (the store's own say which process on which host), its state and
        for how long, and what ends it; or as much as the server still shows."""
        if awaited is None:
            what = "a row or table of the store"
            query = _TABLE_HOLDERS
            params: tuple[Any, ...] = ()
        else:
            kind, number = awaited
            what = {
                "campaign": f"campaign {number}",
                "trial": f"the campaign of trial {number}",
                "store": "the campaign list",
            }[kind]
            campaign = "(SELECT campaign_id FROM trials WHERE id = %s)" if kind == "trial" else "%s"
            key = _CAMPAIGN_KEY % campaign if number is not None else str(_STORE_KEY)
            query = _ADVISORY_HOLDERS.format(schema_key=_SCHEMA_KEY, key=key)
            params = () if number is None else (number,)
        try:
            rows = self._conn.execute(query, params).fetchall()
        except self._psycopg.Error:
            rows = []
        if not rows:
            return (
                f"the lock of {what} was held by another session, which has let it go since "
                "(pg_stat_activity shows the server's sessions); run the command again"
            )
        idle = self.settings.get("idle_in_transaction_session_timeout", "0")
        holders = "; ".join(
            f"server pid {pid} (application_name {app!r}{f', from {host}' if host else ''}) "
            f"is {state} for {float(state_s):.0f} s, in a transaction begun "
            f"{float(xact_s):.0f} s ago"
            for pid, app, host, state, state_s, xact_s in rows
        )
        ended = (
            ""
            if idle in ("0", "0ms")
            else (f"; the server ends a session idle in its transaction after {idle}")
        )
        return (
            f"the lock of {what} is held by {holders}. If that process is stopped (Ctrl-Z, a "
            f"paused VM) or hung, continue or end it, or end its session with SELECT "
            f"pg_terminate_backend(pid){ended}"
        )


class PostgreSQLStore(SQLiteStore):
    """Campaigns and their trials in a PostgreSQL database: the contract of
    :class:`~.protocol.Store`, by :class:`~.sqlite.SQLiteStore`'s code (see the module
    docstring for how each guarantee holds on a server)."""

    _DEVICES_SQL = (
        "(config::json ->> 'tp')::bigint * COALESCE((config::json ->> 'cp')::bigint, 1) * "
        "(config::json ->> 'pp')::bigint * COALESCE(proxy_dp, (config::json ->> 'dp')::bigint)"
    )
    _JSON_IDS_SQL = "SELECT value::bigint FROM json_array_elements_text(?::json)"

    def _open_database(  # type: ignore[override]
        self, path: Any, *, readonly: bool, timeout_s: float
    ) -> PostgresDatabase:
        return PostgresDatabase(str(path), readonly=readonly, timeout_s=timeout_s)

    def _prepare_schema(self) -> None:
        """Create the tables in an empty database (or schema); refuse a foreign or newer one,
        a search_path that names no usable schema, and a role without the grants it needs.

        PostgreSQL stores start at :data:`~.schema.SCHEMA_VERSION`, so there is no older
        version to upgrade yet; the ``schema_version`` rows record every version as SQLite
        stores do, so a later migration finds the same table on both.
        """
        where = str(self.path)
        with self._transaction("opening it", write=False) as conn:
            name = self._schema(conn, where)
            version = self._version(conn, where, name)
        schema.check_version(version, where)
        if version == schema.SCHEMA_VERSION:
            return
        if self.readonly:
            raise StoreError(
                f"{where} holds no parsearch store yet (a `parsearch run` creates it); a "
                "read-only command cannot"
            )
        with self._transaction("creating its tables") as conn:
            self._db.serialise()
            if self._version(conn, where, name) == schema.SCHEMA_VERSION:
                return  # another driver created them while this one waited for the lock
            for statement in _TABLES:
                conn.execute(statement)
            now = time.time()
            for migration in schema.MIGRATIONS:
                conn.execute(
                    "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)",
                    (migration.version, now),
                )

    @staticmethod
    def continue_ids(conn: _Connection) -> None:
        """After rows were written with their own ids (a copy), make new rows' ids follow
        them: an identity column's sequence does not see ids given explicitly."""
        for table in ("campaigns", "trials"):
            conn.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                f"COALESCE(MAX(id), 0) + 1, false) FROM {table}"
            )

    @staticmethod
    def _schema(conn: _Connection, where: str) -> str:
        """The schema the store lives in: the first of the search_path that exists and the
        role may use; refused, naming each listed schema and what it lacks, when none."""
        found, path, user = conn.execute(
            "SELECT current_schema(), current_setting('search_path'), current_user"
        ).fetchone() or (None, "", "")
        if found is not None:
            return str(found)
        problems = []
        for listed in (part.strip() for part in path.split(",")):
            name = user if listed == '"$user"' or listed == "$user" else listed.strip('"')
            row = conn.execute(
                "SELECT has_schema_privilege(oid, 'USAGE') FROM pg_namespace WHERE nspname = ?",
                (name,),
            ).fetchone()
            if row is None and name != user:
                problems.append(f"schema {name!r} does not exist (CREATE SCHEMA {name})")
            elif row is not None:
                problems.append(
                    f"role {user} may not use schema {name!r} (GRANT USAGE ON SCHEMA {name} "
                    f"TO {user})"
                )
        missing = "; ".join(problems) or "it lists no schema"
        raise StoreError(
            f"{where}: the search_path ({path or 'empty'}) names no schema the store can live "
            f"in: {missing}; or set another one in the URL (options=-csearch_path=NAME)"
        )

    def _version(self, conn: _Connection, where: str, name: str) -> int:
        """The store's schema version in schema ``name``: 0 when it holds nothing. Tables
        are looked up in the catalogue, which shows them whatever the role's grants are."""
        tables = {
            table
            for (table,) in conn.execute(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = ? AND c.relkind IN ('r', 'p', 'v', 'm', 'f')",
                (name,),
            ).fetchall()
        }
        if "schema_version" in tables:
            self._check_grants(conn, where, name)
            row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
            return int(row[0] or 0) if row else 0
        if tables:
            raise StoreError(
                f"{where} is a PostgreSQL database but not a parsearch store (its tables "
                f"are {sorted(tables)}); give parsearch an empty database or schema"
            )
        return 0

    def _check_grants(self, conn: _Connection, where: str, name: str) -> None:
        """Refuse a role that lacks a privilege this store needs on one of its tables,
        naming each: SELECT for a query command; SELECT, INSERT, UPDATE and DELETE for a
        driver (or a copy)."""
        needed = "SELECT" if self.readonly else "SELECT, INSERT, UPDATE, DELETE"
        lacking = conn.execute(
            "SELECT p.privilege, c.relname FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace, "
            "unnest(string_to_array(?, ', ')) AS p (privilege) "
            "WHERE n.nspname = ? AND c.relname IN ('schema_version', 'campaigns', 'trials', "
            "'leases') AND NOT has_table_privilege(c.oid, p.privilege) ORDER BY 2, 1",
            (needed, name),
        ).fetchall()
        if not lacking:
            return
        user = conn.execute("SELECT current_user").fetchone()
        role = user[0] if user else "this role"
        missing = ", ".join(f"{privilege} on {name}.{table}" for privilege, table in lacking)
        who = "a query command" if self.readonly else "a driver"
        raise StoreError(
            f"role {role} lacks {missing} in store {where}: {who} needs {needed} on the "
            f"store's tables; their owner grants it with: GRANT {needed} ON ALL TABLES IN "
            f"SCHEMA {name} TO {role}"
        )

    def __enter__(self) -> PostgreSQLStore:
        return self

    def __repr__(self) -> str:
        mode = "readonly" if self.readonly else "readwrite"
        return f"PostgreSQLStore({str(self.path)!r}, {mode})"
