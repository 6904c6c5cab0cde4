"""Two ``run --resume`` started together on a new store (issue 29): the one that finds the
campaign created an instant before continues it (or exits 75 while the other runs it), never
exits 1 with "already exists"."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from parsearch.cli import main
from parsearch.errors import CampaignLockedError
from parsearch.store import SQLiteStore, open_store

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "search_spaces" / "tiny-cpu.yaml")


@pytest.mark.e2e
def test_the_loser_of_the_race_continues_the_campaign(tmp_path, monkeypatch, capsys):
    db = tmp_path / "s.db"
    argv = ["run", TINY, "--store", str(db), "--backend", "simulate", "--quiet"]
    assert main([*argv, "--budget", "2"]) == 0  # the winner's campaign
    capsys.readouterr()
    calls = []
    original = SQLiteStore.list_campaigns

    def first_look_finds_none(store):
        calls.append(1)
        return [] if len(calls) == 1 else original(store)

    monkeypatch.setattr(SQLiteStore, "list_campaigns", first_look_finds_none)
    assert main([*argv, "--resume", "--budget", "3"]) == 0
    with open_store(db, readonly=True) as store:
        assert len(store.trials(store.get_campaign().id)) == 3
    calls.clear()
    code = main([*argv, "--budget", "4"])  # without --resume: refused, as before
    assert code == 1 and "already exists" in capsys.readouterr().err


@pytest.mark.e2e
@pytest.mark.slow
def test_two_resumes_started_together_end_0_or_75(tmp_path):
    db = tmp_path / "s.db"
    argv = [
        sys.executable,
        "-m",
        "parsearch",
        "run",
        TINY,
        "--store",
        str(db),
        "--resume",
        "--backend",
        "simulate",
        "--backend-opt",
        "delay=0.3",
        "--budget",
        "4",
        "--quiet",
    ]
    runs = [subprocess.Popen(argv, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    codes = sorted(run.wait(120) for run in runs)
    errors = [run.stderr.read() for run in runs]
    assert codes in ([0, 0], [0, 75]), (codes, errors)
    assert not any("already exists" in err for err in errors), errors


def _shift_heartbeat(db: Path, seconds: float) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE leases SET heartbeat_at = ?", (time.time() + seconds,))


def test_a_heartbeat_dated_in_the_future_does_not_block_the_campaign(tmp_path, capsys):
    """A holder whose clock runs ahead: within its lease timeout it is waited for (the
    message says the date is ahead); further ahead, the date proves nothing and the lease is
    taken over (a holder alive after all is fenced at its next write)."""
    db = tmp_path / "c.db"
    with open_store(db) as holder, open_store(db) as newcomer:
        campaign = holder.create_campaign("c", {})
        holder.acquire_lease(campaign.id, "a", stale_after_s=5.0)
        _shift_heartbeat(db, 3.0)
        with pytest.raises(CampaignLockedError, match=r"dated 3 s ahead of this host's clock"):
            newcomer.acquire_lease(campaign.id, "b", stale_after_s=5.0)
        _shift_heartbeat(db, 3600.0)  # an hour ahead: blocked until then + 5 s before
        holder.update_campaign(campaign.id, status="running")
        assert main(["status", "--store", str(db)]) == 0
        assert "last heartbeat dated 1h00m ahead of this host's clock" in capsys.readouterr().out
        assert newcomer.acquire_lease(campaign.id, "b", stale_after_s=5.0) == 2
        with pytest.raises(CampaignLockedError, match="lost the lease"):
            holder.update_campaign(campaign.id, status="stopped")
