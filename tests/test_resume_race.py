"""Two ``run --resume`` started together on a new store (issue 29): the one that finds the
campaign created an instant before continues it (or exits 75 while the other runs it), never
exits 1 with "already exists"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from parsearch.cli import main
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
    for _ in range(3):
        db.unlink(missing_ok=True)
        runs = [subprocess.Popen(argv, stderr=subprocess.PIPE, text=True) for _ in range(2)]
        codes = sorted(run.wait(120) for run in runs)
        errors = [run.stderr.read() for run in runs]
        assert codes in ([0, 0], [0, 75]), (codes, errors)
        assert not any("already exists" in err for err in errors), errors
