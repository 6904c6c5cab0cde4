"""The crash streak: a campaign stops spending its budget once its trainer crashes the same
way trial after trial and has never run, and never for a crash one layout meets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from parsearch import results
from parsearch.campaign.crash_streak import CrashStreak
from parsearch.result import TrialState
from parsearch.store import TrialRecord

MISSING = "rank 0 exited with code 2: python: can't open file '/work/trian.py'"


def record(number: int, state: TrialState, error: str | None = None) -> TrialRecord:
    fields = dict.fromkeys(TrialRecord.__dataclass_fields__)
    fields.update(number=number, state=state, error=error, log_tail="")
    return TrialRecord(**fields)


def streak_of(limit: int, *trials: tuple[TrialState, str | None]) -> CrashStreak:
    streak = CrashStreak(limit)
    for number, (state, error) in enumerate(trials):
        streak.add(record(number, state, error))
    return streak


def test_alike_crashes_of_a_trainer_that_never_ran_stop_the_campaign_at_the_limit():
    crash = (TrialState.ERROR, MISSING)
    assert streak_of(3, crash, crash).verdict is None
    # Differing only in a number (the rank) still reads alike.
    verdict = streak_of(3, crash, (TrialState.ERROR, MISSING.replace("rank 0", "rank 1")), crash)
    assert verdict.verdict is not None
    assert "3 trials in a row (#0, #1, #2)" in verdict.verdict
    assert "can't open file '/work/trian.py'" in verdict.verdict
    assert "parsearch resume" in verdict.verdict and "--crash-limit 0" in verdict.verdict


@pytest.mark.parametrize(
    "worked", [TrialState.OK, TrialState.OOM, TrialState.TIMEOUT], ids=lambda s: s.value
)
def test_a_trainer_that_ran_once_is_never_stopped_for_crashes(worked):
    crash = (TrialState.ERROR, MISSING)
    assert streak_of(2, (worked, None), crash, crash, crash, crash).verdict is None
    assert streak_of(2, crash, (worked, None), crash, crash).verdict is None


def test_a_different_crash_starts_the_count_again_and_refused_layouts_do_not_count():
    crash = (TrialState.ERROR, MISSING)
    other = (TrialState.ERROR, "rank 0 exited with code 1: ValueError: tp must divide heads")
    assert streak_of(3, crash, crash, other, crash).verdict is None
    infeasible = (TrialState.INFEASIBLE, "needs 9 nodes")
    assert streak_of(3, crash, infeasible, crash, crash).verdict is not None


def test_limit_zero_never_stops_and_a_negative_limit_is_refused():
    crash = (TrialState.ERROR, MISSING)
    assert streak_of(0, *[crash] * 20).verdict is None
    with pytest.raises(ValueError, match="crash limit must be >= 0"):
        CrashStreak(-1)


# --- a campaign on a real store ------------------------------------------------------------


def crashing_space(tmp_path: Path) -> Path:
    space = {
        "name": "broken-trainer",
        "model": {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "vocab_size": 100,
                  "seq_length": 32},
        "allocation": {"nodes": 1, "devices_per_node": 2, "device": "cpu",
                       "device_memory": "1GiB", "peak_tflops": 0.05},
        "search": {"tp": 1, "pp": 1, "mbs": [1, 2, 4, 8], "gas": [1, 2, 4]},
        "trainer": {"kind": "command", "launch": "single", "parser": "json",
                    "command": [sys.executable, str(tmp_path / "trian.py")]},
    }  # fmt: skip
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(space))
    return path


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "parsearch", *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.e2e
def test_a_campaign_whose_trainer_cannot_start_stops_at_the_limit_and_resumes(tmp_path):
    store = str(tmp_path / "s.db")
    first = cli("run", str(crashing_space(tmp_path)), "--store", store, "--budget", "10",
                "--slots", "1", "--quiet")  # fmt: skip
    assert first.returncode == 3, first.stderr
    assert "4 trials in a row (#0, #1, #2, #3) crashed the same way" in first.stdout
    assert "trian.py" in first.stdout
    frame = results(store)
    assert list(frame["state"]) == ["error"] * 4
    # A resume gives the (perhaps fixed) trainer a fresh streak, here of its own limit.
    again = cli("resume", "--store", store, "--crash-limit", "2", "--quiet")
    assert again.returncode == 3, again.stderr
    assert len(results(store)) == 6
