"""How the store opens SQLite, and the one transaction helper every statement goes through.

Journal and locking are chosen for the shared filesystems clusters keep results on (Lustre,
GPFS, NFS), where the driver, ``parsearch status`` and a notebook may run on different hosts:

* ``journal_mode=DELETE`` (the rollback journal), not WAL. WAL coordinates readers and the
  writer through a memory-mapped ``-shm`` file, and memory maps are not coherent across hosts
  on a network filesystem: a reader on another node can see a torn index and SQLite can
  corrupt the file. The rollback journal needs only POSIX byte-range locks on the database.
* ``synchronous=FULL``: a commit is on disk (journal and database fsynced) before a write
  returns, so a node crash or a Slurm kill right after a trial finishes never loses that
  trial, which may have cost an hour of a 128-node allocation.
* One writer. The campaign driver is the only process that writes; it holds a lease row
  (owner, host, pid, heartbeat) so that a second driver started by mistake, possibly on
  another host, is refused by name rather than interleaving with it. The lease does not lean
  on the filesystem's locks alone, which may be weak or node-local (Lustre mounted with
  ``localflock``, NFS without a lock daemon).
* Short write transactions: each write is one small ``BEGIN IMMEDIATE ... COMMIT``.
  IMMEDIATE takes the write lock up front, so a read-then-write sequence (allocating a trial
  number, checking a lease) cannot be overtaken, and a second writer waits in
  ``busy_timeout`` instead of failing with a deadlock error halfway through.
* Readers open the file with ``mode=ro``: they cannot write, cannot create a journal and
  cannot roll one back, so no query command can modify or corrupt a store a driver is
  writing. They see every committed transaction and never a partial one; a reader holds
  its shared lock only for the length of one query.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from parsearch.errors import StoreError, StoreFullError, StoreUnavailableError

MEMORY = ":memory:"
# How long a read waits for a live writer to roll back a killed writer's journal.
UNFINISHED_WRITE_WAIT_S = 2.0


def file_kind(mode: int) -> str | None:
    """What a file that is not a regular one is (``None`` for a regular file); the store's
    own copy of :func:`parsearch.space_file.file_kind` (the store imports no loader)."""
    if stat.S_ISREG(mode):
        return None
    for test, kind in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return kind
    return "not a regular file"


class NoSuchCampaignError(StoreError):
    """``--name`` names no campaign of the store: a usage error (exit 2)."""

    exit_code = 2


class StorePathError(StoreError):
    """The store path names no store: none there for a reader, or not a regular file (a
    directory, a FIFO, a device, a symbolic-link loop). A usage error: exit 2."""

    exit_code = 2


# A write failure with less than this free on the store's filesystem is taken for a full disk.
LOW_SPACE_BYTES = 1 << 20


class Database:
    """One SQLite connection, opened as above, shared safely by the threads of one process.

    Statements are serialised on a lock: the driver may renew its lease from a heartbeat
    thread while its main loop records results.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, readonly: bool = False, timeout_s: float = 30.0
    ) -> None:
        self.readonly = readonly
        self.timeout_s = timeout_s
        self.path = MEMORY if str(path) == MEMORY else Path(path).expanduser().absolute()
        self._lock = threading.RLock()
        self._conn = self._connect()
        if not readonly:
            try:
                for pragma in ("journal_mode = DELETE", "synchronous = FULL", "foreign_keys = ON"):
                    self._conn.execute(f"PRAGMA {pragma}")
            except sqlite3.Error as exc:
                self._conn.close()
                raise self.error(exc, "opening it") from exc

    def _check_path(self) -> None:
        """Refuse, before SQLite opens it, a path that is not a store file: SQLite would
        block forever reading a FIFO and a device, or fail later with a vaguer error."""
        path = Path(self.path)
        try:
            mode = path.stat().st_mode
        except (FileNotFoundError, NotADirectoryError):
            if self.readonly or not path.parent.is_dir():
                raise StorePathError(self._cannot_open()) from None
            return  # a writer creates it (or says why it cannot)
        except OSError as error:  # a symbolic-link loop, a name too long...
            raise StorePathError(f"cannot open store {path}: {error.strerror}") from None
        kind = file_kind(mode)
        if kind == "a directory":
            example = path / "parsearch.db"
            raise StorePathError(
                f"{path} is a directory; give the store a file name such as {example}"
            )
        if kind is not None:
            raise StorePathError(f"store {path} is {kind}, not a store file (a regular file)")

    def _connect(self) -> sqlite3.Connection:
        if self.path != MEMORY:
            self._check_path()
        if self.path == MEMORY:
            if self.readonly:
                raise StoreError("an in-memory store cannot be opened read-only: it is empty")
            target, uri = MEMORY, False
        elif self.readonly:
            target, uri = f"file:{quote(str(self.path))}?mode=ro", True
        else:
            target, uri = str(self.path), False
        try:
            # isolation_level=None: the sqlite3 module issues no implicit BEGIN;
            # transaction() says where each transaction begins and ends.
            return sqlite3.connect(
                target,
                uri=uri,
                timeout=self.timeout_s,
                isolation_level=None,
                check_same_thread=False,
            )
        except sqlite3.Error as exc:
            raise self.error(exc, "opening it") from exc

    # The driver's error type, which the transaction helper maps to a StoreError.
    driver_error: type[Exception] = sqlite3.Error

    @contextlib.contextmanager
    def transaction(self, action: str, *, write: bool = True) -> Iterator[Any]:
        """Run the block as one transaction: committed when it ends, rolled back if it raises.

        ``action`` completes "while ..." in error messages. A write takes the write lock at
        its start (:meth:`_begin`), waiting up to ``timeout_s`` for another writer; a read
        sees one consistent snapshot across its statements. The one helper of every store:
        :class:`~.postgres.PostgresDatabase` says only how it begins.
        """
        if write and self.readonly:
            raise StoreError(
                f"store {self.path} is open read-only; {action} needs a command that writes"
            )
        with self._lock:
            try:
                self._begin(write)
                yield self._statements()
                self._conn.execute("COMMIT")
            except self.driver_error as exc:
                self._rollback()
                raise self.error(exc, action) from exc
            except BaseException:
                self._rollback()
                raise

    def _begin(self, write: bool) -> None:
        self._conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        if not write and self.readonly:
            self._wait_out_unfinished_write()

    def _wait_out_unfinished_write(self) -> None:
        """Take the read's snapshot, waiting a moment for a killed writer's journal to be
        rolled back. A driver killed mid-transaction leaves a journal that only a process
        that writes can roll back; where other drivers share the store the next of them
        does so within milliseconds, but a read-only command landing in between failed
        (the 8-driver test's reader, once in a fresh-clone run). Where no writer comes, the
        error after :data:`UNFINISHED_WRITE_WAIT_S` says what to do."""
        deadline = time.monotonic() + UNFINISHED_WRITE_WAIT_S
        while True:
            try:
                self._conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
                return
            except sqlite3.Error as exc:
                hot = getattr(exc, "sqlite_errorname", "") == "SQLITE_READONLY_ROLLBACK"
                if not hot or time.monotonic() > deadline:
                    raise
            self._rollback()
            time.sleep(0.02)
            self._conn.execute("BEGIN")

    def serialise(self, *, campaign: int | None = None, trial: int | None = None) -> None:
        """Make this write transaction the only writer of a campaign (``campaign``, or the
        one ``trial`` belongs to) or, with neither, of the store's campaign list; called
        first in the transaction. SQLite's ``BEGIN IMMEDIATE`` already made it the only
        writer of the whole file: nothing more to do here."""

    def _statements(self) -> Any:
        """What the block of a transaction executes its statements on."""
        return self._conn

    def _rollback(self) -> None:
        if self._conn.in_transaction:
            # SQLite may have rolled back already (say after SQLITE_FULL); the caller's error
            # is the one worth reporting, not a failed second rollback.
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("ROLLBACK")

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def error(self, exc: sqlite3.Error, action: str) -> StoreError:
        """A :class:`StoreError` that says what failed on which file, and what to do."""
        code = getattr(exc, "sqlite_errorname", "")
        where = self.path
        if code.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
            return StoreUnavailableError(
                f"store {where} stayed locked for more than {self.timeout_s:g} s while "
                f"{action}: another process is writing it. Only one parsearch driver may "
                f"write a store; query commands open it read-only"
            )
        if code in ("SQLITE_NOTADB", "SQLITE_CORRUPT"):
            return StoreError(
                f"{where} is not a parsearch store: the file is not an SQLite database or is "
                f"corrupt ({exc})"
            )
        if code == "SQLITE_READONLY_ROLLBACK":
            return StoreError(
                f"store {where} holds an unfinished write (a driver stopped mid-transaction, "
                f"leaving {where}-journal) that a read-only command cannot roll back; open "
                f"it once with a command that writes (parsearch resume) to recover it"
            )
        if code.startswith("SQLITE_READONLY"):
            return StoreError(
                f"cannot write store {where} while {action}: the file or its directory is "
                f"read-only (the directory must be writable for the journal file)"
            )
        # A directory fails as CANTOPEN read-write but as IOERR read-only.
        if code.startswith("SQLITE_CANTOPEN") or (self.path != MEMORY and self.path.is_dir()):
            return StoreError(self._cannot_open())
        space = self._no_space() if code.startswith(("SQLITE_FULL", "SQLITE_IOERR")) else None
        if code == "SQLITE_FULL" or space:
            return StoreFullError(
                f"no space left to write store {where} while {action}: "
                f"{space or 'the disk is full'}"
            )
        if code.startswith("SQLITE_IOERR"):
            # A network filesystem that stalls fails this way too: a later try may succeed.
            return StoreUnavailableError(
                f"I/O error on store {where} while {action} ({exc}); if it lies on a network "
                f"filesystem without POSIX locks (Lustre needs -o flock), move it to one "
                f"with locks or to a local disk"
            )
        return StoreError(f"store {where}: {action} failed: {exc}")

    def _no_space(self) -> str | None:
        """Why a failed write was for want of space, if it was; else ``None``.

        SQLite says ``SQLITE_FULL`` for ENOSPC only: a write cut short by the file size limit
        (EFBIG) and a full filesystem that reports itself at fsync (some network ones) are
        plain I/O errors, so the space is looked at after the fact.
        """
        if self.path == MEMORY:
            return None
        path = Path(self.path)
        with contextlib.suppress(OSError):
            stat = os.statvfs(path.parent)
            free = stat.f_bavail * stat.f_frsize
            if free < LOW_SPACE_BYTES:
                return f"the disk is full ({free} bytes free on its filesystem)"
        limit, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
        if limit != resource.RLIM_INFINITY:
            size = 0
            for file in (path, Path(f"{path}-journal")):
                with contextlib.suppress(OSError):
                    size = max(size, file.stat().st_size)
            if size + LOW_SPACE_BYTES > limit:
                return f"it reached this process's file size limit (ulimit -f) of {limit} bytes"
        return None

    def _cannot_open(self) -> str:
        """Why SQLite could not open the file, found out after the fact (no race, no cost)."""
        path = Path(self.path)
        if path.is_dir():
            example = path / "parsearch.db"
            return f"{path} is a directory; give the store a file name such as {example}"
        if self.readonly and not path.exists():  # a reader creates nothing: say what is missing
            if not path.parent.exists():
                return f"no store at {path}: directory {path.parent} does not exist"
            if not path.parent.is_dir():
                return f"no store at {path}: {path.parent} is not a directory"
            return f"no store at {path} (has a campaign run there yet?)"
        if not path.parent.exists():
            return f"cannot create store {path}: directory {path.parent} does not exist"
        if not path.parent.is_dir():
            return f"cannot create store {path}: {path.parent} is not a directory"
        return (
            f"cannot open store {path}: permission denied or read-only filesystem "
            f"(the file and its directory must be writable)"
        )
