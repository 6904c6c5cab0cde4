"""A trial whose ranks are stopped by a signal parsearch did not send (the scheduler ending the
job signals every process of its step: ``scancel``, a requeue, the time limit) is
``interrupted``, not an ``error`` of its layout: it is not counted against the budget and runs
again. Found on the real Slurm cluster (tests/test_slurm_cluster.py), where a requeue left two
trials stored as errors that were never run again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from test_agent import make_spec, start

from parsearch.result import TrialState

FAKE = Path(__file__).with_name("fake_trainer.py")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_ranks_stopped_from_outside_end_the_trial_as_interrupted(tmp_path, sig):
    run = start(make_spec(world=2, timeout_s=60), tmp_path, "import time; time.sleep(600)")
    time.sleep(1.0)
    for pid in run.pids:
        os.kill(pid, sig)
    result = run.wait()
    assert result.status is TrialState.INTERRUPTED, result.error
    assert f"killed by {sig.name}, a signal parsearch did not send" in result.error


def test_a_rank_killed_by_sigkill_from_outside_is_still_an_error(tmp_path):
    """SIGKILL is the kernel's OOM killer as often as anyone's: not taken for the job ending."""
    run = start(make_spec(world=1, timeout_s=60), tmp_path, "import time; time.sleep(600)")
    time.sleep(1.0)
    os.kill(run.pids[0], signal.SIGKILL)
    assert run.wait().status is TrialState.ERROR


@pytest.mark.e2e
def test_a_trial_stopped_from_outside_runs_again_and_the_budget_is_kept(tmp_path):
    """The first trial's rank is stopped by SIGTERM from outside, mid-campaign: it is run
    again, and the campaign ends with its budget of finished trials, every one ok."""
    wrapper = tmp_path / "train.py"
    wrapper.write_text(
        "import os, signal, sys\n"
        "marker = os.path.join(os.path.dirname(__file__), 'stopped-once')\n"
        "if not os.path.exists(marker):\n"
        "    open(marker, 'w').close()\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        f"os.execv(sys.executable, [sys.executable, {str(FAKE)!r}, *sys.argv[1:]])\n"
    )
    command = [
        "{python}", str(wrapper), "--format", "megatron", "--tp", "{tp}", "--pp", "{pp}",
        "--dp", "{dp}", "--mbs", "{mbs}", "--gas", "{gas}", "--global-batch", "{global_batch}",
        "--seq-length", "{seq_length}", "--steps", "{steps}", "--print-rank", "last",
        "--step-ms", "20",
    ]  # fmt: skip
    space = {
        "name": "outside-stop",
        "model": {"num_layers": 4, "hidden_size": 64, "num_heads": 4, "vocab_size": 128,
                  "seq_length": 32},
        "allocation": {"nodes": 1, "devices_per_node": 1, "device": "cpu",
                       "device_memory": "1GiB", "peak_tflops": 0.05},
        "search": {"tp": [1], "pp": [1], "mbs": [1, 2, 4]},
        "global_batch": 8,
        "trainer": {"kind": "command", "parser": "megatron", "steps": 3, "warmup_steps": 1,
                    "timeout": 60, "command": command, "vars": {"python": sys.executable}},
    }  # fmt: skip
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    done = subprocess.run(
        [sys.executable, "-m", "parsearch", "run", "space.yaml", "--store", "x.db",
         "--budget", "2", "--quiet", "--keep-predicted-oom"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    frame = __import__("parsearch").results(tmp_path / "x.db")
    assert len(frame) == 2 and set(frame["state"]) == {"ok"}, frame
    assert sorted(frame["attempt"]) == [1, 2]
