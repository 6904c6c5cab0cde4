"""What the tests of real trainers share: a shipped example space made runnable here, a
campaign through the CLI, the trial logs it left, and the processes still alive."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import yaml
from process_census import survivors

from parsearch.result import TrialState
from parsearch.store import open_store

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "search_spaces" / "examples"


def example_space(relative: str, tmp_path: Path, **trainer) -> Path:
    """The example space with this interpreter as ``python`` and ``trainer`` keys replaced,
    written into ``tmp_path``."""
    data = yaml.safe_load((EXAMPLES / relative).read_text())
    data["trainer"]["vars"]["python"] = sys.executable
    data["trainer"].update(trainer)
    path = tmp_path / Path(relative).name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def parsearch(*args: str, timeout: float = 900) -> str:
    """Run the CLI from the repository root (the examples' ``{launch_dir}``)."""
    done = subprocess.run(
        [sys.executable, "-m", "parsearch", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def failed_trials(store: str) -> str:
    """Each failed trial's error and log tail: an assertion's message, so that a CI log
    says why an external trainer failed, not only that it did."""
    with open_store(store, readonly=True) as opened:
        return "\n".join(
            f"trial {trial.number} ({trial.state.value}): {trial.error}\n{trial.log_tail}"
            for trial in opened.trials(opened.get_campaign().id)
            if trial.state is not TrialState.OK
        )


def start_campaign(space: Path, tmp_path: Path, budget: int = 1) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "parsearch", "run", str(space), "--store",
         str(tmp_path / "killed.db"), "--budget", str(budget), "--quiet",
         "--backend-opt", f"workdir={tmp_path / 'killed'}"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def kill_9_leaves_nothing(space: Path, tmp_path: Path, processes: int) -> None:
    """Start a campaign, kill its driver with SIGKILL once its trial runs ``processes``
    processes (guard, launcher, workers: every one names the trial directory), and wait
    until none of them is left."""
    driver = start_campaign(space, tmp_path)
    trials = tmp_path / "killed"

    def started() -> bool:
        assert driver.poll() is None, "the driver ended before its trial started"
        return len(survivors(trials)) >= processes

    try:
        wait_for(started, 600, f"{processes} processes of the trial")
    finally:
        driver.kill()
        driver.wait()
    wait_for(lambda: not survivors(trials), 15, "the trial's processes to end")
