"""The results store's API: campaigns, the lease, trials and the queries over them.

How the file is opened and locked, and why, is in :mod:`parsearch.store.connection`; the
schema and its upgrades in :mod:`parsearch.store.schema`.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import math
import numbers
import os
import platform
import socket
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import parsearch.store.schema as schema
from parsearch.config import ParallelLayout
from parsearch.errors import CampaignLockedError, StoreError
from parsearch.result import TrialResult, TrialState
from parsearch.store.connection import Database, NoSuchCampaignError
from parsearch.store.liveness import process_identity, provably_dead
from parsearch.store.records import (
    CAMPAIGN_COLUMNS,
    TRIAL_COLUMNS,
    Campaign,
    CampaignStatus,
    DamagedRowError,
    LeaseHolder,
    TrialRecord,
    campaign_from_row,
    to_json,
    trials_from_rows,
)
from parsearch.store.urls import resume_command
from parsearch.version import __version__

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)

_UNSET: Any = object()
# Outcomes finish_trial accepts: the terminal states, and interrupted (the trial was stopped
# by a drain and will be re-queued on resume).
_OUTCOMES = frozenset({*(s for s in TrialState if s.finished), TrialState.INTERRUPTED})
_VERSIONED_PACKAGES = ("deephyper", "torch", "numpy", "pandas", "mpi4py", "ray")


def _proxy_words(proxy_dp: int | None) -> str:
    return "" if proxy_dp is None else f" (proxy at dp{proxy_dp})"


def _when(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp).astimezone().isoformat(timespec="seconds")


def _finite(value: Any) -> float | None:
    """A metric as a float column value; missing, non-numeric or NaN figures are NULL.

    ``numbers.Real`` admits numpy's scalars, which trainers report more often than not.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    return float(value) if math.isfinite(value) else None


def _software_versions() -> dict[str, str]:
    """What produced a campaign's numbers; read from package metadata, importing nothing."""
    versions = {
        "parsearch": __version__,
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "store_schema": str(schema.SCHEMA_VERSION),
    }
    for package in _VERSIONED_PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[package] = importlib.metadata.version(package)
    return versions


_STATE_VALUES = frozenset(state.value for state in TrialState)


class CampaignExistsError(StoreError):
    """:meth:`SQLiteStore.create_campaign` of a name the store holds (another driver may
    have created it an instant before: ``run --resume`` then continues it)."""

    @classmethod
    def of(cls, name: str, where: str, created_at: float) -> CampaignExistsError:
        """The one text for a name taken, whoever finds it (``run``'s look before it
        creates, or the store's own check inside the creating transaction)."""
        return cls(
            f"campaign '{name}' already exists in {where} (created {_when(created_at)}); "
            f"continue it with `{resume_command(where, name)}` (or `run --resume`), or pass "
            "another --name"
        )


class SQLiteStore:
    """Campaigns and their trials in one SQLite file (or in memory, for tests).

    Contract:

    * A layout is recorded at most once per campaign, identified by
      :meth:`ParallelLayout.key`; :meth:`add_trial` refuses a second one.
    * A trial moves ``queued -> running -> ok | oom | timeout | error | infeasible``, or to
      ``interrupted`` from queued or running, and ``interrupted -> queued`` via
      :meth:`requeue`. A finished trial is never changed again. Other moves raise
      :class:`StoreError`.
    * Each method is one transaction: it is committed (and fsynced) when the method returns,
      or it had no effect. Every failure is a :class:`StoreError`.
    * Only the lease holder writes a campaign's trials; the store records the lease but the
      driver is the one that asks for it (:meth:`acquire_lease`) and keeps it alive
      (:meth:`heartbeat`). Once a store object has acquired a campaign's lease, each of its
      writes to that campaign checks, in the write's own transaction, that the lease still
      carries its owner and generation, and raises :class:`CampaignLockedError` otherwise:
      a driver that lost its lease cannot change a trial, however late it wakes up.
    * A read-only store can run every query and no write; it sees what writers committed.
    * Methods may be called from several threads (say a heartbeat thread beside the driver
      loop); they are serialised on one connection.
    * Every statement runs in :meth:`Database.transaction`, which maps SQLite's errors to
      :class:`StoreError` naming the file and what to do.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, readonly: bool = False, timeout_s: float = 30.0
    ) -> None:
        self._db = self._open_database(path, readonly=readonly, timeout_s=timeout_s)
        self.path = self._db.path
        self.readonly = readonly
        self._transaction = self._db.transaction
        # campaign id -> (owner, generation) of each lease this store object acquired
        self._fences: dict[int, tuple[str, int]] = {}
        try:
            self._prepare_schema()
        except BaseException:
            self._db.close()
            raise

    # The two statements whose SQL differs between SQLite and PostgreSQL (a subclass for
    # another database overrides them, and :meth:`_open_database`): the devices a trial's
    # layout ran on, from its JSON ``config``; and the ids of a JSON array parameter.
    _DEVICES_SQL = (
        "json_extract(config, '$.tp') * COALESCE(json_extract(config, '$.cp'), 1) * "
        "json_extract(config, '$.pp') * COALESCE(proxy_dp, json_extract(config, '$.dp'))"
    )
    _JSON_IDS_SQL = "SELECT value FROM json_each(?)"

    def _open_database(
        self, path: str | os.PathLike[str], *, readonly: bool, timeout_s: float
    ) -> Database:
        """The connection and its transaction helper (see :mod:`.connection`)."""
        return Database(path, readonly=readonly, timeout_s=timeout_s)

    def _prepare_schema(self) -> None:
        """Upgrade an old schema (read-write) or refuse it (read-only); refuse a newer one.

        The version is read first, so that opening an up-to-date store takes no write lock.
        """
        where = str(self.path)
        with self._transaction("opening it", write=False) as conn:
            version = schema.schema_version(conn, where)
        schema.check_version(version, where)
        if version == schema.SCHEMA_VERSION:
            return
        if not self.readonly:
            with self._transaction("upgrading its schema") as conn:
                schema.migrate(conn, where)  # reads the version again, under the write lock
            return
        if version == 0:
            raise StoreError(
                f"{where} is an empty database, not a parsearch store (yet: a `parsearch "
                f"run` that is creating it writes its tables within a second; try again)"
            )
        raise StoreError(
            f"store {where} has schema version {version} and this parsearch needs "
            f"{schema.SCHEMA_VERSION}; a command that writes (parsearch resume) upgrades it, "
            f"a read-only one cannot"
        )

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "readonly" if self.readonly else "readwrite"
        return f"SQLiteStore({str(self.path)!r}, {mode})"

    # -- campaigns ----------------------------------------------------------------------------

    def create_campaign(
        self,
        name: str,
        space: dict[str, Any],
        *,
        space_path: str | None = None,
        seed: int = 0,
        budget: int | None = None,
        backend: str = "local",
        settings: dict[str, Any] | None = None,
        objective_metric: str = "tokens_per_s",
        versions: dict[str, str] | None = None,
    ) -> Campaign:
        """Record a new campaign; ``versions`` defaults to the software running now."""
        if not name:
            raise StoreError("a campaign needs a non-empty name")
        row = (
            name,
            to_json(space, "the search space"),
            space_path,
            seed,
            budget,
            backend,
            to_json(settings or {}, "the campaign settings"),
            to_json(_software_versions() if versions is None else versions, "versions"),
            objective_metric,
            time.time(),
            CampaignStatus.CREATED.value,
        )
        with self._transaction(f"creating campaign '{name}'") as conn:
            self._db.serialise()
            existing = conn.execute(
                "SELECT created_at FROM campaigns WHERE name = ?", (name,)
            ).fetchone()
            if existing:
                raise CampaignExistsError.of(name, self.path, existing[0])
            cursor = conn.execute(
                "INSERT INTO campaigns (name, space, space_path, seed, budget, backend, "
                "settings, versions, objective_metric, created_at, status) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                row,
            )
            return self._campaign(conn, cursor.lastrowid)

    def get_campaign(self, name: str | None = None) -> Campaign:
        """The campaign called ``name``; without a name, the most recently created one."""
        with self._transaction("reading campaigns", write=False) as conn:
            if name is None:
                row = conn.execute(
                    f"SELECT {CAMPAIGN_COLUMNS} FROM campaigns "
                    "ORDER BY created_at DESC, id DESC LIMIT 1"
                ).fetchone()
                if row is None:
                    raise StoreError(
                        f"store {self.path} has no campaign yet (a driver killed while "
                        f"starting one leaves it so); start it with `parsearch run SPACE "
                        f"--store {self.path}` (or `run --resume`, which also continues one)"
                    )
                return campaign_from_row(row)
            row = conn.execute(
                f"SELECT {CAMPAIGN_COLUMNS} FROM campaigns WHERE name = ?", (name,)
            ).fetchone()
            if row is None:
                names = [n for (n,) in conn.execute("SELECT name FROM campaigns ORDER BY id")]
                raise NoSuchCampaignError(
                    f"no campaign '{name}' in store {self.path}; "
                    + (f"it has {names}" if names else "it has none yet")
                )
            return campaign_from_row(row)

    def list_campaigns(self) -> list[Campaign]:
        """Every campaign, oldest first."""
        with self._transaction("reading campaigns", write=False) as conn:
            rows = conn.execute(
                f"SELECT {CAMPAIGN_COLUMNS} FROM campaigns ORDER BY created_at, id"
            ).fetchall()
        return [campaign_from_row(row) for row in rows]

    def update_campaign(
        self,
        campaign_id: int,
        *,
        budget: int | None = _UNSET,
        finished_at: float | None = _UNSET,
        status: CampaignStatus | str = _UNSET,
        stop_reason: str | None = _UNSET,
        stopped_at: float | None = _UNSET,
    ) -> Campaign:
        """Change the given fields (``None`` clears any but status) and return the result."""
        changes: dict[str, Any] = {}
        for column, value in (
            ("budget", budget),
            ("finished_at", finished_at),
            ("stop_reason", stop_reason),
            ("stopped_at", stopped_at),
        ):
            if value is not _UNSET:
                changes[column] = value
        if status is not _UNSET:
            try:
                changes["status"] = CampaignStatus(status).value
            except ValueError:
                valid = [s.value for s in CampaignStatus]
                raise StoreError(f"campaign status {status!r} is not one of {valid}") from None
        with self._transaction(f"updating campaign {campaign_id}") as conn:
            self._db.serialise(campaign=campaign_id)
            self._campaign(conn, campaign_id)
            self._fence(conn, campaign_id)
            if changes:
                assignments = ", ".join(f"{column} = ?" for column in changes)
                conn.execute(
                    f"UPDATE campaigns SET {assignments} WHERE id = ?",
                    (*changes.values(), campaign_id),
                )
            return self._campaign(conn, campaign_id)

    def _campaign(self, conn: sqlite3.Connection, campaign_id: int | None) -> Campaign:
        row = conn.execute(
            f"SELECT {CAMPAIGN_COLUMNS} FROM campaigns WHERE id = ?", (campaign_id,)
        ).fetchone()
        if row is None:
            raise StoreError(f"no campaign with id {campaign_id} in store {self.path}")
        return campaign_from_row(row)

    # -- lease --------------------------------------------------------------------------------

    def acquire_lease(self, campaign_id: int, owner: str, *, stale_after_s: float) -> int:
        """Make ``owner`` the campaign's only driver; return its lease generation.

        Refused with :class:`CampaignLockedError` while another owner holds the lease and
        is alive: its heartbeat is younger than *its own* ``stale_after_s`` (a newcomer's
        wish never shortens it), and it is not provably dead (an exited process on this
        host, see :mod:`.liveness`). Otherwise the lease is taken over. Acquiring again as
        the holder renews the heartbeat. From then on every write of this store object to
        the campaign is fenced: it is refused, inside its own transaction, once another
        driver holds the lease.
        """
        with self._transaction(f"taking the lease of campaign {campaign_id}") as conn:
            self._db.serialise(campaign=campaign_id)
            now = time.time()  # after BEGIN, which may have waited for another writer
            campaign = self._campaign(conn, campaign_id)
            held = conn.execute(
                "SELECT owner, host, pid, acquired_at, heartbeat_at, generation, "
                "stale_after_s, process FROM leases WHERE campaign_id = ?",
                (campaign_id,),
            ).fetchone()
            acquired_at = now
            if held is not None and held[0] == owner:
                acquired_at, generation = held[3], held[5]
            else:
                if held is not None:
                    self._refuse_or_take_over(campaign.name, held, now, stale_after_s)
                conn.execute(
                    "UPDATE campaigns SET lease_generation = lease_generation + 1 WHERE id = ?",
                    (campaign_id,),
                )
                (generation,) = conn.execute(
                    "SELECT lease_generation FROM campaigns WHERE id = ?", (campaign_id,)
                ).fetchone()
            conn.execute(
                # An upsert both SQLite and PostgreSQL speak (SQLite's INSERT OR REPLACE
                # is its own dialect).
                "INSERT INTO leases (campaign_id, owner, host, pid, acquired_at, "
                "heartbeat_at, generation, stale_after_s, process) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (campaign_id) DO UPDATE SET "
                "owner = excluded.owner, host = excluded.host, pid = excluded.pid, "
                "acquired_at = excluded.acquired_at, heartbeat_at = excluded.heartbeat_at, "
                "generation = excluded.generation, stale_after_s = excluded.stale_after_s, "
                "process = excluded.process",
                (
                    campaign_id,
                    owner,
                    socket.gethostname(),
                    os.getpid(),
                    acquired_at,
                    now,
                    generation,
                    stale_after_s,
                    process_identity(),
                ),
            )
        self._fences[campaign_id] = (owner, generation)
        return generation

    def _refuse_or_take_over(
        self, name: str, held: tuple[Any, ...], now: float, stale_after_s: float
    ) -> None:
        holder, host, pid, since, heartbeat_at, _, holder_stale_s, process = held
        silent_s = now - heartbeat_at
        # The holder's threshold, which its heartbeat interval was chosen for; a lease row
        # from before version 3 (or a nonsense figure) falls back to the newcomer's.
        threshold = stale_after_s
        if isinstance(holder_stale_s, float) and math.isfinite(holder_stale_s):
            threshold = holder_stale_s
        if host == socket.gethostname() and provably_dead(pid, process):
            why = f"its process (pid {pid} on this host) has exited"
        elif silent_s >= threshold:
            why = f"silent for {silent_s:.0f} s"
        elif -silent_s > threshold:
            # Dated further ahead than a lease timeout: the holder's clock runs ahead, and a
            # date in the future proves nothing about it being alive (waiting would block
            # the campaign until then plus the timeout). Taking over is safe: the fence
            # stops a holder that is alive after all at its next write.
            why = (
                f"its heartbeat is dated {-silent_s:.0f} s ahead of this host's clock "
                f"(more than its {threshold:g} s lease timeout: the clocks disagree)"
            )
        else:
            when = (
                f"was {silent_s:.0f} s ago"
                if silent_s >= 0
                else f"is dated {-silent_s:.0f} s ahead of this host's clock"
            )
            raise CampaignLockedError(
                f"campaign '{name}' is being run by another parsearch driver "
                f"on {host} (pid {pid}, owner {holder}) since {_when(since)}; its last "
                f"heartbeat {when}. Stop that driver or "
                f"wait for it; a driver that died is taken over once its heartbeat "
                f"is {threshold:g} s old (the holder's lease timeout)"
            )
        log.warning("taking over campaign '%s' from driver %s on %s: %s", name, holder, host, why)

    def _fence(self, conn: sqlite3.Connection, campaign_id: int) -> None:
        """Refuse a write to a campaign whose lease this store held and has lost since.

        Runs inside the write's own transaction (which holds SQLite's write lock), so no
        takeover can slip in between the check and the write.
        """
        fence = self._fences.get(campaign_id)
        if fence is None:
            return
        owner, generation = fence
        row = conn.execute(
            "SELECT owner, generation, host, pid, acquired_at FROM leases WHERE campaign_id = ?",
            (campaign_id,),
        ).fetchone()
        if row is not None and (row[0], row[1]) == (owner, generation):
            return
        holder = (
            f"driver {row[0]} on {row[2]} (pid {row[3]}, lease generation {row[1]}) took it "
            f"over at {_when(row[4])}"
            if row
            else "nobody holds it now"
        )
        raise CampaignLockedError(
            f"driver {owner} lost the lease of campaign {campaign_id} (its generation "
            f"{generation}): {holder}. This driver was paused or silent past its lease "
            f"timeout; it stops without writing anything more"
        )

    def heartbeat(self, campaign_id: int, owner: str) -> None:
        """Prove ``owner`` is alive; raises :class:`CampaignLockedError` if it lost the lease.

        A driver whose lease was taken over (it was silent too long) must stop writing: a
        newer driver now owns the campaign.
        """
        with self._transaction(f"renewing the lease of campaign {campaign_id}") as conn:
            self._db.serialise(campaign=campaign_id)
            updated = conn.execute(
                "UPDATE leases SET heartbeat_at = ? WHERE campaign_id = ? AND owner = ?",
                (time.time(), campaign_id, owner),
            ).rowcount
            if updated:
                return
            held = conn.execute(
                "SELECT owner, host, pid, acquired_at FROM leases WHERE campaign_id = ?",
                (campaign_id,),
            ).fetchone()
        holder = (
            f"driver {held[0]} on {held[1]} (pid {held[2]}) took it over at {_when(held[3])}"
            if held
            else "nobody holds it"
        )
        raise CampaignLockedError(
            f"owner {owner} no longer holds the lease of campaign {campaign_id}: {holder}"
        )

    def lease_holder(self, campaign_id: int) -> LeaseHolder | None:
        """The driver holding the campaign's lease (alive or not: see its heartbeat)."""
        with self._transaction(f"reading the lease of campaign {campaign_id}", write=False) as c:
            row = c.execute(
                "SELECT owner, host, pid, acquired_at, heartbeat_at, generation, stale_after_s "
                "FROM leases WHERE campaign_id = ?",
                (campaign_id,),
            ).fetchone()
        return None if row is None else LeaseHolder(*row)

    def release_lease(self, campaign_id: int, owner: str) -> None:
        """Give the lease up if ``owner`` holds it; safe to call twice, or after losing it."""
        with self._transaction(f"releasing the lease of campaign {campaign_id}") as conn:
            self._db.serialise(campaign=campaign_id)
            conn.execute(
                "DELETE FROM leases WHERE campaign_id = ? AND owner = ?", (campaign_id, owner)
            )
        if self._fences.get(campaign_id, (None,))[0] == owner:
            del self._fences[campaign_id]

    # -- trials -------------------------------------------------------------------------------

    def add_trial(
        self,
        campaign_id: int,
        layout: ParallelLayout,
        *,
        state: TrialState = TrialState.QUEUED,
        predicted: dict[str, Any] | None = None,
        origin: str = "optimizer",
        proxy_dp: int | None = None,
    ) -> TrialRecord:
        """Record ``layout`` as the campaign's next trial (numbered from 0).

        ``state`` may be a terminal one for layouts judged without running (say predicted
        out of memory: ``infeasible``). ``origin`` says who proposed it: ``initial``,
        ``optimizer``, ``user``... ``proxy_dp`` makes it a proxy trial of ``layout`` at that
        many replicas, keyed by the layout it runs (so its full-scale confirmation is a trial
        of its own). Raises :class:`StoreError` if the layout is already there.
        """
        state = TrialState(state)
        if not (state is TrialState.QUEUED or state.finished):
            raise StoreError(
                f"a new trial is queued or already finished, not {state.value} ({layout.short()})"
            )
        if proxy_dp is not None and not 1 <= proxy_dp < layout.dp:
            raise StoreError(
                f"a proxy of {layout.short()} runs on 1 to {layout.dp - 1} replicas, not {proxy_dp}"
            )
        key = layout.key() if proxy_dp is None else replace(layout, dp=proxy_dp).key()
        config = to_json(layout.to_dict(), "the layout")
        predicted_json = None if predicted is None else to_json(predicted, "the prediction")
        with self._transaction(f"adding trial {layout.short()}") as conn:
            self._db.serialise(campaign=campaign_id)
            self._campaign(conn, campaign_id)
            self._fence(conn, campaign_id)
            existing = conn.execute(
                "SELECT number, state FROM trials WHERE campaign_id = ? AND key = ?",
                (campaign_id, key),
            ).fetchone()
            if existing:
                raise StoreError(
                    f"layout {layout.short()}{_proxy_words(proxy_dp)} is already trial "
                    f"#{existing[0]} ({existing[1]}) of campaign {campaign_id}; a layout runs once"
                )
            now = time.time()
            cursor = conn.execute(
                "INSERT INTO trials (campaign_id, number, key, config, state, origin, "
                "created_at, finished_at, predicted, proxy_dp) VALUES (?, "
                "(SELECT COALESCE(MAX(number) + 1, 0) FROM trials WHERE campaign_id = ?), "
                "?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    campaign_id,
                    campaign_id,
                    key,
                    config,
                    state.value,
                    origin,
                    now,
                    now if state.finished else None,
                    predicted_json,
                    proxy_dp,
                ),
            )
            return self._trial(conn, cursor.lastrowid)

    def has_key(self, campaign_id: int, key: str) -> bool:
        """Whether a layout with this :meth:`ParallelLayout.key` is in the campaign."""
        with self._transaction("looking up a layout", write=False) as conn:
            row = conn.execute(
                "SELECT 1 FROM trials WHERE campaign_id = ? AND key = ?", (campaign_id, key)
            ).fetchone()
        return row is not None

    def get_trial(self, trial_id: int) -> TrialRecord:
        with self._transaction(f"reading trial {trial_id}", write=False) as conn:
            return self._trial(conn, trial_id)

    def mark_running(self, trial_id: int, hosts: Iterable[str], attempt: int) -> TrialRecord:
        """A queued trial was dispatched to ``hosts``; ``attempt`` counts its starts from 1."""
        with self._transaction(f"starting trial {trial_id}") as conn:
            self._move(conn, trial_id, {TrialState.QUEUED}, "start")
            conn.execute(
                "UPDATE trials SET state = ?, hosts = ?, attempt = ?, started_at = ? WHERE id = ?",
                (
                    TrialState.RUNNING.value,
                    to_json(list(hosts), "hosts"),
                    attempt,
                    time.time(),
                    trial_id,
                ),
            )
            return self._trial(conn, trial_id)

    def finish_trial(
        self, trial_id: int, result: TrialResult, objective: float | None
    ) -> TrialRecord:
        """Record a queued or running trial's outcome.

        ``objective`` is the campaign's objective metric; only an ok trial has one (a failed
        trial passes ``None``), and ``best`` / ``top`` / ``pareto`` rank ok trials by it.
        """
        if result.status not in _OUTCOMES:
            valid = sorted(s.value for s in _OUTCOMES)
            raise StoreError(
                f"trial {trial_id} cannot finish as {result.status.value!r}; an outcome is "
                f"one of {valid}"
            )
        if objective is not None and not result.ok:
            raise StoreError(
                f"trial {trial_id} finished {result.status.value}, so it has no objective "
                f"(got {objective})"
            )
        changes: dict[str, Any] = {
            "state": result.status.value,
            "finished_at": time.time(),
            "duration_s": result.duration_s,
            "metrics": to_json(result.metrics, f"the metrics of trial {trial_id}"),
            "objective": _finite(objective),
            "tokens_per_s": _finite(result.metrics.get("tokens_per_s")),
            "peak_mem_bytes": _finite(result.metrics.get("peak_mem_bytes")),
            "error": result.error,
            "log_tail": result.log_tail,
        }
        if result.hosts:  # otherwise keep the hosts mark_running recorded
            changes["hosts"] = to_json(list(result.hosts), "hosts")
        assignments = ", ".join(f"{column} = ?" for column in changes)
        with self._transaction(f"recording the result of trial {trial_id}") as conn:
            self._move(conn, trial_id, {TrialState.QUEUED, TrialState.RUNNING}, "finish")
            conn.execute(
                f"UPDATE trials SET {assignments} WHERE id = ?", (*changes.values(), trial_id)
            )
            return self._trial(conn, trial_id)

    def mark_interrupted(self, campaign_id: int) -> int:
        """Mark every queued or running trial interrupted (after a drain or a crash).

        Returns how many; resume re-queues them with :meth:`requeue`.
        """
        with self._transaction(f"interrupting the trials of campaign {campaign_id}") as conn:
            self._db.serialise(campaign=campaign_id)
            self._fence(conn, campaign_id)
            return conn.execute(
                "UPDATE trials SET state = ? WHERE campaign_id = ? AND state IN (?, ?)",
                (
                    TrialState.INTERRUPTED.value,
                    campaign_id,
                    TrialState.QUEUED.value,
                    TrialState.RUNNING.value,
                ),
            ).rowcount

    def requeue(self, trial_id: int) -> TrialRecord:
        """Queue an interrupted trial again, clearing its partial outcome; attempt is kept."""
        with self._transaction(f"re-queuing trial {trial_id}") as conn:
            self._move(conn, trial_id, {TrialState.INTERRUPTED}, "re-queue")
            conn.execute(
                "UPDATE trials SET state = ?, started_at = NULL, finished_at = NULL, "
                "duration_s = NULL, metrics = '{}', objective = NULL, tokens_per_s = NULL, "
                "peak_mem_bytes = NULL, error = NULL, log_tail = '' WHERE id = ?",
                (TrialState.QUEUED.value, trial_id),
            )
            return self._trial(conn, trial_id)

    def _trial(self, conn: sqlite3.Connection, trial_id: int | None) -> TrialRecord:
        row = conn.execute(f"SELECT {TRIAL_COLUMNS} FROM trials WHERE id = ?", (trial_id,))
        found = row.fetchone()
        if found is None:
            raise StoreError(f"no trial with id {trial_id} in store {self.path}")
        return trials_from_rows([found])[0]

    def _move(
        self, conn: sqlite3.Connection, trial_id: int, allowed: set[TrialState], verb: str
    ) -> None:
        """Refuse a state change that the contract does not allow from the trial's state,
        or that a driver which lost the campaign's lease attempts."""
        self._db.serialise(trial=trial_id)
        trial = self._trial(conn, trial_id)
        self._fence(conn, trial.campaign_id)
        if trial.state not in allowed:
            need = " or ".join(sorted(s.value for s in allowed))
            raise StoreError(
                f"cannot {verb} trial #{trial.number} ({trial.layout.short()}) of campaign "
                f"{trial.campaign_id}: it is {trial.state.value}, and must be {need}"
            )

    def trials(
        self, campaign_id: int, states: Iterable[TrialState] | None = None
    ) -> list[TrialRecord]:
        """The campaign's trials in order of number, optionally only those in ``states``."""
        query = f"SELECT {TRIAL_COLUMNS} FROM trials WHERE campaign_id = ?"
        params: list[Any] = [campaign_id]
        if states is not None:
            wanted = [TrialState(s).value for s in states]
            if not wanted:  # no state asked for (PostgreSQL refuses an empty IN list)
                return []
            query += f" AND state IN ({', '.join('?' * len(wanted))})"
            params += wanted
        with self._transaction(f"reading the trials of campaign {campaign_id}", write=False) as c:
            rows = c.execute(query + " ORDER BY number", params).fetchall()
        return trials_from_rows(rows)

    def recent_finish_times(self, campaign_id: int, n: int) -> list[float]:
        """When the ``n`` newest finished trials finished, oldest first: what an ETA needs,
        read backwards along the (campaign, number) index instead of loading every trial
        (trials finish close to the order they were numbered in)."""
        with self._transaction(f"reading the recent trials of {campaign_id}", write=False) as c:
            rows = c.execute(
                "SELECT finished_at FROM trials WHERE campaign_id = ? "
                "AND finished_at IS NOT NULL ORDER BY number DESC LIMIT ?",
                (campaign_id, n),
            ).fetchall()
        return sorted(at for (at,) in rows)

    def counts(self, campaign_id: int) -> dict[TrialState, int]:
        """How many trials are in each state (every state present, zeros included)."""
        with self._transaction(f"counting the trials of campaign {campaign_id}", write=False) as c:
            rows = c.execute(
                "SELECT state, COUNT(*) FROM trials WHERE campaign_id = ? GROUP BY state",
                (campaign_id,),
            ).fetchall()
        counts = dict.fromkeys(TrialState, 0)
        for state, n in rows:
            if state not in _STATE_VALUES:  # a hand edit: the checked read names the trial
                self.trials(campaign_id)
                raise DamagedRowError(f"a trial of campaign {campaign_id} has state {state!r}")
            counts[TrialState(state)] = n
        return counts

    def device_seconds(self, campaign_id: int) -> dict[str, float]:
        """Device-seconds the campaign's trials ran (their duration times the devices of the
        layout they ran), by fidelity: ``full`` and ``proxy``; one aggregate query."""
        with self._transaction(f"adding up the trials of {campaign_id}", write=False) as c:
            rows = c.execute(
                f"SELECT proxy_dp IS NULL, SUM(duration_s * {self._DEVICES_SQL}) FROM trials "
                "WHERE campaign_id = ? AND duration_s IS NOT NULL GROUP BY 1",
                (campaign_id,),
            ).fetchall()
        totals = {"full": 0.0, "proxy": 0.0}
        for full, total in rows:
            totals["full" if full else "proxy"] = float(total or 0.0)
        return totals

    # -- queries ------------------------------------------------------------------------------

    def best(self, campaign_id: int, *, max_mem_bytes: float | None = None) -> TrialRecord | None:
        """The ok trial with the highest objective, optionally within a peak-memory cap.

        A campaign's answer is measured at full scale: a proxy trial (whose figures are
        predictions) is the best only while no full-scale trial succeeded (a budget that
        ended before any confirmation); its ``fidelity`` then says so.
        """
        found = self.top(campaign_id, 1, max_mem_bytes=max_mem_bytes, full_scale=True)
        found = found or self.top(campaign_id, 1, max_mem_bytes=max_mem_bytes)
        return found[0] if found else None

    def top(
        self,
        campaign_id: int,
        k: int,
        *,
        max_mem_bytes: float | None = None,
        full_scale: bool = False,
    ) -> list[TrialRecord]:
        """The ``k`` ok trials with the highest objective, best first; only those measured
        at full scale with ``full_scale`` (proxies' objectives are predictions).

        Under a cap, a trial whose peak memory was not measured is left out: it cannot be
        shown to fit. Ties go to the lower peak memory, then the earlier trial.
        """
        query = (
            f"SELECT {TRIAL_COLUMNS} FROM trials "
            "WHERE campaign_id = ? AND state = ? AND objective IS NOT NULL"
        )
        if full_scale:
            query += " AND proxy_dp IS NULL"
        params: list[Any] = [campaign_id, TrialState.OK.value]
        if max_mem_bytes is not None:
            query += " AND peak_mem_bytes <= ?"
            params.append(max_mem_bytes)
        # This order is the trials_by_objective index's, so SQLite stops after k entries.
        query += " ORDER BY objective DESC, peak_mem_bytes, id LIMIT ?"
        params.append(k)
        with self._transaction(f"ranking the trials of campaign {campaign_id}", write=False) as c:
            rows = c.execute(query, params).fetchall()
        return trials_from_rows(rows)

    def pareto(self, campaign_id: int) -> list[TrialRecord]:
        """Ok trials that no other ok trial beats on both objective (max) and peak memory (min).

        Trials without a measured peak memory are left out. Ordered by memory; trials with
        identical figures are all kept, since neither dominates the other.
        """
        measured = (
            "FROM trials WHERE campaign_id = ? AND state = ? "
            "AND objective IS NOT NULL AND peak_mem_bytes IS NOT NULL"
        )
        ok = (campaign_id, TrialState.OK.value)
        with self._transaction(f"the Pareto front of campaign {campaign_id}", write=False) as c:
            # The front's two ends, one index seek each: the fastest trial (least memory among
            # equals) and the leanest (fastest among equals). Every other front trial lies in
            # the box between them, so the sweep below reads only that box.
            most_mem, least_objective = c.execute(
                f"SELECT (SELECT peak_mem_bytes {measured} "
                "ORDER BY objective DESC, peak_mem_bytes LIMIT 1), "
                f"(SELECT objective {measured} ORDER BY peak_mem_bytes, objective DESC LIMIT 1)",
                ok + ok,
            ).fetchone()
            # One sweep up the trials_by_memory index: a trial is on the front if it beats
            # every trial using less memory and ties the best using the same memory.
            points = c.execute(
                f"SELECT id, peak_mem_bytes, objective {measured} "
                "AND peak_mem_bytes <= ? AND objective >= ? "
                "ORDER BY peak_mem_bytes, objective DESC",
                (*ok, most_mem, least_objective),
            ).fetchall()
            front: list[int] = []
            best_below = -math.inf
            memory = best_here = None
            for trial_id, mem, objective in points:
                if mem != memory:
                    if best_here is not None:
                        best_below = max(best_below, best_here)
                    memory, best_here = mem, objective
                if objective == best_here and objective > best_below:
                    front.append(trial_id)
            rows = c.execute(
                f"SELECT {TRIAL_COLUMNS} FROM trials WHERE id IN "
                f"({self._JSON_IDS_SQL}) ORDER BY peak_mem_bytes, id",
                (to_json(front, "the Pareto front"),),
            ).fetchall()
        return trials_from_rows(rows)

    def dataframe(self, campaign_id: int) -> pd.DataFrame:
        """One row per trial, layout fields and metrics as columns (see :func:`.trials_frame`)."""
        from parsearch.store.frames import FRAME_COLUMNS, trials_frame

        with self._transaction(f"reading the trials of campaign {campaign_id}", write=False) as c:
            rows = c.execute(
                f"SELECT {FRAME_COLUMNS} FROM trials WHERE campaign_id = ? ORDER BY number",
                (campaign_id,),
            ).fetchall()
        try:
            return trials_frame(rows)
        except (TypeError, ValueError, AttributeError, OverflowError, KeyError) as error:
            # A row no store writes (pandas' own errors derive from these): the checked
            # read names it; failing that, say what the table could not hold.
            self.trials(campaign_id)
            raise DamagedRowError(
                f"the trials of campaign {campaign_id} cannot form a table ({error}); a row "
                "was changed by hand or by another program"
            ) from None

    def export(self, campaign_id: int, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`dataframe` to ``path``: ``.csv`` or ``.parquet``, by suffix."""
        from parsearch.store.frames import check_export_path, write_frame

        target = check_export_path(Path(path))
        return write_frame(self.dataframe(campaign_id), target)
