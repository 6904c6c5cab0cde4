"""The driver as users run it: real ``parsearch`` processes, kill -9, SIGTERM, two drivers.

Every check reads the real SQLite file the processes wrote.
"""

import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from store_polling import campaign_trials

from parsearch.result import TrialState

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).parent.parent
GPT175 = str(ROOT / "search_spaces" / "gpt-175b-frontier.yaml")
LEASE_S = 1.5


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "parsearch", *args, "--quiet", "--lease-timeout", str(LEASE_S)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _snapshot(db: Path, *, recover: bool = False) -> dict[int, tuple]:
    """Every trial by number: (key, state, attempt, objective, metrics, finished_at).

    ``recover``: open read-write, which rolls back the write a killed driver left half done
    (a read-only reader cannot, and says so).
    """
    return {
        t.number: (t.key, t.state, t.attempt, t.objective, t.metrics, t.finished_at)
        for t in campaign_trials(db, recover=recover)
    }


def _finished(snapshot: dict[int, tuple]) -> dict[int, tuple]:
    return {n: t for n, t in snapshot.items() if t[1].finished}


def _progress_by(process: subprocess.Popen, db: Path):
    """A predicate: ``process`` ended, or finished a trial since this call."""
    before = len(_finished(_snapshot(db)))
    return lambda: process.poll() is not None or len(_finished(_snapshot(db))) > before


def _wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _integrity(db: Path) -> str:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]


def test_kill_9_at_random_moments_then_resume_loses_and_repeats_nothing(tmp_path):
    db = tmp_path / "c.db"
    budget = 120
    rng = random.Random(4)
    kept: dict[int, tuple] = {}
    sim = ["--backend-opt", "delay=0.15", "--backend-opt", "jitter=0.5"]
    command = [
        "run",
        GPT175,
        "--store",
        str(db),
        "--backend",
        "simulate",
        "--slots",
        "3",
        "--budget",
        str(budget),
        *sim,
    ]
    kills = 0
    while kills < 10:
        process = _start(*command)
        # Land mid-campaign: once this driver has finished a trial, at a random moment.
        _wait_for(_progress_by(process, db), 60, "the driver to finish a trial")
        time.sleep(rng.uniform(0.0, 0.4))
        if process.poll() is not None:
            break  # finished the budget before we could kill it
        process.send_signal(signal.SIGKILL)
        process.wait()
        kills += 1
        snapshot = _snapshot(db, recover=True)
        for number, trial in _finished(snapshot).items():
            assert kept.setdefault(number, trial) == trial, f"trial {number} changed"
        # No wait for the lease to go stale: its holder is provably dead (same host, pid
        # gone), so resume takes over at once, as a user's would after a kill -9.
        command = ["resume", "--store", str(db)]
    assert kills == 10, "the budget ran out before ten kills; slow the simulation down"

    final = _start(*command)
    out, err = final.communicate(timeout=120)
    assert final.returncode == 0, err
    assert "budget reached" in out

    snapshot = _snapshot(db)
    finished = _finished(snapshot)
    assert len(finished) == len(snapshot) == budget
    assert len({trial[0] for trial in snapshot.values()}) == budget, "no layout twice"
    for number, trial in kept.items():
        assert finished[number] == trial, f"trial {number} finished before a kill changed"
    assert any(trial[2] > 1 for trial in snapshot.values()), "interrupted trials re-ran"
    assert _integrity(db) == "ok"


def _running(db: Path) -> int:
    return sum(1 for t in _snapshot(db).values() if t[1] is TrialState.RUNNING)


@pytest.mark.parametrize("grace", [10.0, 0.5])
def test_sigterm_drains_within_the_grace_period_and_resumes(tmp_path, grace):
    """Trials take 2 s: a long grace lets them finish, a short one interrupts them."""
    db = tmp_path / "c.db"
    process = _start(
        "run",
        GPT175,
        "--store",
        str(db),
        "--backend",
        "simulate",
        "--slots",
        "2",
        "--budget",
        "6",
        "--backend-opt",
        "delay=2",
        "--grace",
        str(grace),
    )
    _wait_for(lambda: _running(db) == 2, 60, "two running trials")
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=30)
    took = time.monotonic() - signalled
    assert process.returncode == 0, err
    # Within the grace period (the trials end 2 s in), plus a process's exit on a loaded
    # 2-core machine when the grace is the shorter.
    assert took < (grace if grace > 2 else grace + 3.0), (took, err)
    states = [t[1] for t in _snapshot(db).values()]
    if grace > 2:
        assert len(states) == 2 and all(state.finished for state in states)
    else:
        assert states.count(TrialState.INTERRUPTED) == 2
        assert "continue with: parsearch resume" in out

    resumed = _start("resume", "--store", str(db), "--backend-opt", "delay=0.05")
    out, err = resumed.communicate(timeout=60)
    assert resumed.returncode == 0, err
    snapshot = _snapshot(db)
    assert len(_finished(snapshot)) == len(snapshot) == 6
    assert _integrity(db) == "ok"


def test_a_second_driver_is_refused_until_the_first_is_dead_and_stale(tmp_path):
    db = tmp_path / "c.db"
    first = _start(
        "run",
        GPT175,
        "--store",
        str(db),
        "--backend",
        "simulate",
        "--budget",
        "30",
        "--backend-opt",
        "delay=0.5",
    )
    _wait_for(lambda: _running(db) == 1, 60, "the first driver to run a trial")
    second = _start("resume", "--store", str(db))
    out, err = second.communicate(timeout=60)
    assert second.returncode != 0
    assert "being run by another parsearch driver" in err and str(first.pid) in err

    first.send_signal(signal.SIGKILL)
    first.wait()
    time.sleep(LEASE_S)
    third = _start("resume", "--store", str(db), "--backend-opt", "delay=0.01")
    out, err = third.communicate(timeout=60)
    assert third.returncode == 0, err
    assert "budget reached; 30/30" in out
    assert _integrity(db) == "ok"
