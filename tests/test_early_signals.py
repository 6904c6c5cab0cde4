"""A stop signal that reaches ``parsearch run`` while it is still importing (Slurm's
warning, a ``scancel``, a requeue can come in the first seconds of a job) is held and acted on
once the session listens: the driver drains and exits 0 with the campaign resumable, where the
signal's default action used to kill it before it had written anything."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from trials_seen import trials_seen

from parsearch.store import CampaignStatus, open_store

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]


def caught(pid: int, sig: signal.Signals) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (``SigCgt`` in /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_a_stop_signal_during_start_up_drains_instead_of_killing(tmp_path, sig):
    store = tmp_path / "c.db"
    command = [
        sys.executable, "-m", "parsearch", "run", "search_spaces/gpt-175b-frontier.yaml",
        "--store", str(store), "--backend", "simulate", "--budget", "50",
    ]  # fmt: skip
    driver = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)  # fmt: skip
    # Once the command line holds the signal (the kernel lists it as caught), its imports
    # still have seconds to go: that is the window under test.
    deadline = time.monotonic() + 30
    while not caught(driver.pid, sig) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert not (tmp_path / "c.db").exists(), "the signal must come before the session starts"
    driver.send_signal(sig)
    output, _ = driver.communicate(timeout=120)
    assert driver.returncode == 0, output
    assert f"{sig.name}: starting no new trial" in output
    with open_store(store, readonly=True) as opened:
        campaign = opened.get_campaign()
        assert campaign.status is CampaignStatus.STOPPED
        trials = opened.trials(campaign.id)
        assert all(trial.state.finished for trial in trials), trials_seen(trials)
