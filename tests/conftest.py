"""How the suite is spread over pytest-xdist workers (``scripts/test.sh`` runs ``-n 2
--dist loadgroup``): most tests wait (on sleeps, timeouts, process start-up), so two workers
on two cores finish far sooner than one.

``loadgroup`` sends tests with the same ``xdist_group`` to one worker. Groups are added here,
before xdist reads them, so that nothing is run twice or concurrently that must not be:

* the tests of a module that share a module-scoped fixture (a campaign, a launch) run on one
  worker, which sets the fixture up once; a test's own ``xdist_group`` (a finer one) wins;
* every test that starts a local Ray cluster (marker ``ray``) runs on one worker, one
  cluster at a time; so does every test of the Slurm cluster (marker ``slurm``).

Under xdist the ``slow`` tests are also handed out first (after the groups of several tests,
which xdist sends first), so that the longest ones start early and the last minutes are not
one worker finishing a long test while the other idles. A run without ``-n`` keeps the
files' order.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from postgres_server import PostgresServer, PostgresUnavailable
from process_census import SHM, orphaned_segments
from trials_seen import stores_seen

_STARTED = pytest.StashKey[float]()


def _group(item: pytest.Item) -> str | None:
    """The worker group ``item`` must share, if any."""
    if item.get_closest_marker("xdist_group"):
        return None  # the test chose its own
    if item.get_closest_marker("ray"):
        return "ray"
    if item.get_closest_marker("slurm"):
        return "slurm"  # one namespaced cluster at a time: its names and addresses are fixed
    fixtures = getattr(item, "_fixtureinfo", None)
    definitions = fixtures.name2fixturedefs.values() if fixtures else ()
    if any(d.scope == "module" for defs in definitions for d in defs):
        return item.module.__name__
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist appends the groups to the test ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = _group(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
    if hasattr(config, "workerinput"):  # an xdist worker: every worker sorts alike
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A failing test's report shows every trial of the stores it worked on (its
    ``tmp_path`` and any path a fixture handed it): layout, state and error, whatever its
    assertion printed."""
    report = yield
    if report.when == "call" and report.failed:
        funcargs = getattr(item, "funcargs", {})
        paths = [value for value in funcargs.values() if isinstance(value, Path)]
        seen = stores_seen(paths)
        if seen:
            report.sections.append(("trials in the test's stores", seen))
    return report


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """This worker's PostgreSQL server (see :mod:`postgres_server`), started on first use.

    Without one the ``postgres`` tier skips and says why, except on CI (``CI`` set), where
    it must run: there a server that cannot start fails the tests.
    """
    try:
        server = PostgresServer()
    except (PostgresUnavailable, ImportError, OSError, subprocess.SubprocessError) as error:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set and the PostgreSQL server cannot start: {error}")
        pytest.skip(f"no PostgreSQL server: {error}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """A ``postgresql://`` store URL of its own (a fresh schema) for one test."""
    return postgres_server.url()


# mpich keeps its shared-memory segments in /dev/shm and unlinks them at MPI_Finalize; the
# MPI tests that kill workers or the driver on purpose leave theirs behind (1 MB each, a few
# per run). On a long-lived runner with a small /dev/shm (Docker's default is 64 MB) they
# would fill it after a few dozen runs, so the controller removes, when the run ends, those
# created during it that no process still maps. A segment is attached by name, so one that
# is mapped (an MPI job outside the suite, or starting) is never touched.


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_STARTED] = time.time()


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput") or not os.path.isdir(SHM):
        return
    started = session.config.stash.get(_STARTED, time.time())
    for path in orphaned_segments(started):
        with contextlib.suppress(OSError):
            os.unlink(path)
