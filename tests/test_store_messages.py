"""The small store messages of issue 48: one text for a taken campaign name, resume
commands a user can paste (a URL without its password, never masked), and a lease that
cannot be released said after the error that ended the session, as its note."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from parsearch.campaign.lease import Lease
from parsearch.errors import StoreError
from parsearch.store import CampaignExistsError, SQLiteStore, open_store, resume_command

ROOT = Path(__file__).parent.parent
SPACE = ROOT / "search_spaces" / "gpt-22b-frontier.yaml"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "parsearch", *args], capture_output=True, text=True, timeout=120
    )


def test_a_resume_command_leaves_a_urls_password_out_and_quotes_a_path():
    url = "postgresql://ana:s3cret@db.example:5432/runs?sslmode=require"
    command = resume_command(url, "my run")
    assert "s3cret" not in command and "***" not in command, command
    assert command.startswith(
        "parsearch resume --store 'postgresql://ana@db.example:5432/runs?sslmode=require' "
        "--name 'my run'"
    ), command
    assert "PGPASSWORD" in command, command
    masked = resume_command("postgresql://ana:***@db.example/runs", "x")
    assert "***" not in masked and "ana@db.example" in masked, masked
    assert resume_command("/tmp/a b.db", "x") == "parsearch resume --store '/tmp/a b.db' --name x"


@pytest.mark.e2e
def test_a_taken_name_gets_one_text_from_run_and_from_the_store(tmp_path):
    store = tmp_path / "s.db"
    first = cli("run", str(SPACE), "--store", str(store), "--backend", "simulate",
                "--budget", "1", "--quiet")  # fmt: skip
    assert first.returncode == 0, first.stderr
    again = cli("run", str(SPACE), "--store", str(store), "--backend", "simulate", "--quiet")
    assert again.returncode != 0
    with open_store(store) as opened, pytest.raises(CampaignExistsError) as caught:
        opened.create_campaign("gpt-22b-frontier", {}, seed=0, budget=1, backend="simulate")
    for text in (again.stderr, str(caught.value)):
        assert "campaign 'gpt-22b-frontier' already exists in" in text, text
        assert f"continue it with `parsearch resume --store {store} --name" in text, text
        assert "(or `run --resume`), or pass another --name" in text, text


def test_a_lease_that_cannot_be_released_is_a_note_of_the_error_that_ended_the_session(
    tmp_path, capsys
):
    path = tmp_path / "s.db"
    store = SQLiteStore(path, timeout_s=0.2)
    campaign = store.create_campaign("c", {}, seed=0, budget=1, backend="simulate")
    ended = StoreError("the disk is full")
    neighbour = sqlite3.connect(path)
    with pytest.raises(StoreError) as caught, Lease(store, campaign.id, stale_after_s=60):
        neighbour.execute("BEGIN EXCLUSIVE")  # the release that follows stays locked out
        raise ended
    neighbour.rollback()
    store.close()
    assert caught.value is ended
    notes = getattr(ended, "__notes__", [])
    assert any(note.startswith("could not release the lease: ") for note in notes), notes
    assert "could not release" not in capsys.readouterr().err
