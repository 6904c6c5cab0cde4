"""A throw-away PostgreSQL server for the ``postgres`` test tier.

Started once per pytest (xdist worker) session from Debian's ``postgresql`` package
(``scripts/system-packages.sh`` installs it) in a directory of its own under /tmp: initdb
and the postmaster run as an unprivileged user (PostgreSQL refuses root, and the tests may
run as root: then as ``nobody``, through ``setpriv``, which execs so the child's PID is the
postmaster's), listen only on a Unix socket in that directory (no TCP port to collide with
another worker or a server of the host), and are stopped by that PID when the session ends,
whatever happened. A session killed outright (``kill -9`` of pytest) cannot stop it, so
the postmaster also gets a parent-death signal: it shuts down when the worker that started it
dies. Each test gets a schema of its own in the one database, which is far cheaper than a
database per test. :meth:`PostgresServer.restart` stops and starts it as ``pg_ctl restart
-m fast`` does (SIGINT to the postmaster, then the same command line), keeping it this
worker's child so that the parent-death signal and :meth:`~PostgresServer.stop` still hold.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

START_DEADLINE_S = 60.0
STOP_DEADLINE_S = 20.0
PORT = 5432  # names the socket file only: the server has no TCP listener
USER = "parsearch"  # the server's superuser (initdb -U), trusted on the socket


class PostgresUnavailable(RuntimeError):
    """The server could not be started here; the message says why."""


def _binaries() -> Path:
    """The newest installed server's bin directory (Debian keeps them off PATH)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_major)
    if not found:
        raise PostgresUnavailable(
            "no PostgreSQL server installed (/usr/lib/postgresql/*/bin/initdb); "
            "scripts/system-packages.sh installs Debian's postgresql package"
        )
    return Path(found[-1]).parent


def _major(initdb: str) -> int:
    version = Path(initdb).parent.parent.name
    return int(version) if version.isdigit() else 0


def _as_user() -> tuple[list[str], int | None, int | None]:
    """The command prefix that drops root (when root), with its uid and gid."""
    if os.geteuid() != 0:
        return [], None, None
    nobody = pwd.getpwnam("nobody")
    prefix = ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"]
    return prefix, nobody.pw_uid, nobody.pw_gid


def _dies_with_parent(prefix: list[str]) -> list[str]:
    """``prefix`` with a parent-death signal of SIGINT (a fast shutdown) set just before the
    exec: setpriv sets it after changing user, where the kernel would otherwise clear it."""
    return [*(prefix or ["setpriv"]), "--pdeathsig", "INT"]


class PostgresServer:
    """One running server; :meth:`url` gives each test a fresh schema of it."""

    def __init__(self) -> None:
        binaries = _binaries()
        prefix, uid, gid = _as_user()
        # Short, so the socket path stays under the 107-byte limit of a Unix socket name.
        self.directory = Path(tempfile.mkdtemp(prefix="pg", dir="/tmp"))
        self._process: subprocess.Popen[bytes] | None = None
        self._schemas = itertools.count()
        try:
            if uid is not None:
                os.chown(self.directory, uid, gid or -1)
            data = self.directory / "data"
            log = self.directory / "server.log"
            run = {"cwd": self.directory, "env": {"PATH": os.environ.get("PATH", ""), "LANG": "C"}}
            initdb_args = ["-D", str(data), "-U", USER, "-A", "trust", "-E", "UTF8"]
            initdb_args += ["--locale=C", "--no-sync", "--no-instructions"]
            initdb = subprocess.run(
                [*prefix, str(binaries / "initdb"), *initdb_args],
                capture_output=True,
                timeout=START_DEADLINE_S,
                **run,
            )
            if initdb.returncode:
                raise PostgresUnavailable(f"initdb failed: {initdb.stderr.decode()[-2000:]}")
            # A Unix socket in the directory only; durability is not what these tests test.
            settings = {
                "listen_addresses": "",
                "unix_socket_directories": str(self.directory),
                "fsync": "off",
                "synchronous_commit": "off",
                "full_page_writes": "off",
                "max_connections": "40",
                "port": str(PORT),
            }
            options = [arg for item in settings.items() for arg in ("-c", "=".join(item))]
            self._command = [
                *_dies_with_parent(prefix),
                str(binaries / "postgres"),
                *("-D", str(data), "-p", str(PORT), *options),
            ]
            self._run = run
            self._log = log
            self.start()
        except BaseException:
            self.stop()
            raise

    def start(self) -> None:
        """Start the postmaster (again) and wait until it accepts connections."""
        with open(self._log, "ab") as log_file:
            self._process = subprocess.Popen(
                self._command,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **self._run,
            )
        self._wait_ready(self._log)

    def shut_down(self) -> None:
        """A fast shutdown by the postmaster's PID (sessions rolled back), else a kill."""
        process = self._process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(STOP_DEADLINE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(STOP_DEADLINE_S)

    def restart(self, down_s: float = 0.0) -> None:
        """Stop the server (every client's connection drops), stay down ``down_s``, start it
        again on the same data and socket."""
        self.shut_down()
        time.sleep(down_s)
        self.start()

    def _wait_ready(self, log: Path) -> None:
        """Wait until the server accepts a connection, or fail saying why, by a deadline."""
        import psycopg

        deadline = time.monotonic() + START_DEADLINE_S
        while True:
            assert self._process is not None
            if self._process.poll() is not None:
                raise PostgresUnavailable(
                    f"postgres exited with {self._process.returncode}: "
                    f"{log.read_text(errors='replace')[-2000:]}"
                )
            try:
                with psycopg.connect(self._base_url("postgres"), connect_timeout=2):
                    return
            except psycopg.OperationalError as error:
                if time.monotonic() > deadline:
                    raise PostgresUnavailable(
                        f"postgres did not accept connections within {START_DEADLINE_S:g} s "
                        f"({error}); its log: {log.read_text(errors='replace')[-2000:]}"
                    ) from None
            time.sleep(0.05)

    def _base_url(self, database: str, options: str = "") -> str:
        query = f"host={quote(str(self.directory))}&port={PORT}{options}"
        return f"postgresql://{USER}@/{database}?{query}"

    def url(self) -> str:
        """A ``postgresql://`` URL whose search path is a new, empty schema of the server."""
        import psycopg

        schema = f"test_{os.getpid()}_{next(self._schemas)}"
        with psycopg.connect(self._base_url("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        return self._base_url("postgres", f"&options=-csearch_path%3D{schema}")

    def stop(self) -> None:
        """Stop the server by its own PID (a fast shutdown, then a kill) and remove its files."""
        self.shut_down()
        shutil.rmtree(self.directory, ignore_errors=True)
