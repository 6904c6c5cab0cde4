"""A store that runs out of space mid-campaign, for real: the driver exits with an error that
names the file and says what was kept, the campaign is marked stopped with the reason (so
``status`` and the next driver say why), no finished trial changes, and ``resume`` once there
is room again finishes the budget exactly.

Two ways to run out, both real writes refused by the kernel: the driver's file size limit
(``RLIMIT_FSIZE``, which needs no privilege: SQLite sees EFBIG as an I/O error), and a small
tmpfs (ENOSPC, which SQLite reports as ``SQLITE_FULL``), where the test may mount one.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from parsearch.cli import main
from parsearch.result import TrialState
from parsearch.store import CampaignStatus, open_store

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "search_spaces" / "tiny-cpu.yaml")
BUDGET = 30  # tiny-cpu has 34 layouts; 30 trials take about 64 KiB of store
PAGE = 4096

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _driver(db: Path, *, file_size_limit: int | None = None) -> subprocess.CompletedProcess:
    """``parsearch run`` in its own process, optionally under a file size limit."""

    def limit() -> None:
        # SIGXFSZ would kill the driver outright; ignored, the write fails with EFBIG.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, resource.RLIM_INFINITY))

    command = [sys.executable, "-m", "parsearch", "run", TINY, "--store", str(db)]
    return subprocess.run(
        [*command, "--backend", "simulate", "--budget", str(BUDGET), "--quiet"],
        preexec_fn=limit if file_size_limit is not None else None,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def _finished_rows(db: Path) -> list[tuple]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return conn.execute(
            "SELECT id, number, key, state, metrics, objective, finished_at FROM trials "
            "WHERE state NOT IN ('queued', 'running', 'interrupted') ORDER BY id"
        ).fetchall()


def _check_stopped_then_resumed(db: Path, failed: subprocess.CompletedProcess, why: str, capsys):
    assert failed.returncode == 1, failed.stderr
    error = failed.stderr
    assert "Traceback" not in error
    assert f"no space left to write store {db}" in error and why in error
    assert "is marked stopped" in error and "every finished trial is kept" in error
    assert f"parsearch resume --store {db} --name tiny-cpu" in error

    kept = _finished_rows(db)
    assert 0 < len(kept) < BUDGET  # it failed mid-campaign, after some trials finished
    with open_store(db, readonly=True) as store:
        campaign = store.get_campaign()
        assert campaign.status is CampaignStatus.STOPPED
        assert campaign.stop_reason is not None and why in campaign.stop_reason
        counts = store.counts(campaign.id)
        assert counts[TrialState.RUNNING] == counts[TrialState.QUEUED] == 0

    assert main(["status", "--store", str(db)]) == 0
    status = capsys.readouterr().out
    assert "(stopped;" in status and "stopped  at " in status and why in status
    assert main(["status", "--store", str(db), "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert why in document["stop_reason"] and document["stopped_at"] is not None

    assert main(["resume", "--store", str(db)]) == 0
    out = capsys.readouterr()
    assert "stopped at " in out.err and why in out.err  # the next driver says what happened
    assert f"{BUDGET}/{BUDGET} trials finished" in out.out
    assert _finished_rows(db)[: len(kept)] == kept  # no finished trial changed
    with open_store(db, readonly=True) as store:
        campaign = store.get_campaign()
        assert campaign.status is CampaignStatus.FINISHED and campaign.stop_reason is None
        assert sum(n for s, n in store.counts(campaign.id).items() if s.finished) == BUDGET


def test_a_file_size_limit_stops_the_driver_clearly_and_resume_completes(tmp_path, capsys):
    # Room for a new store and two more pages: the limit strikes a dozen trials in, while
    # recording one (a non-aligned limit cuts a page write short, as a full disk does).
    scratch = tmp_path / "scratch.db"
    assert _driver(scratch).returncode == 0
    empty = tmp_path / "empty.db"
    open_store(empty).close()
    limit = empty.stat().st_size + 2 * PAGE + 100
    db = tmp_path / "s.db"
    failed = _driver(db, file_size_limit=limit)
    _check_stopped_then_resumed(db, failed, "file size limit (ulimit -f)", capsys)


@contextlib.contextmanager
def _tmpfs(where: Path, size: str) -> Iterator[Path]:
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {mounted.stderr}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.skipif(sys.platform != "linux", reason="tmpfs and mount are Linux's")
def test_a_full_filesystem_stops_the_driver_clearly_and_resume_completes(tmp_path, capsys):
    with _tmpfs(tmp_path / "small", "80k") as small:  # a new store (40 KiB), a few trials
        db = small / "s.db"
        failed = _driver(db)
        subprocess.run(["mount", "-o", "remount,size=1m", str(small)], check=True)  # room again
        _check_stopped_then_resumed(db, failed, "the disk is full", capsys)
