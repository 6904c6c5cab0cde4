"""Nothing a trial starts outlives it: not workers in sessions of their own (torchrun's), not
daemons (double fork), not after ``kill -9`` of the driver.

tests/daemonizing_launcher.py hides its workers those ways; every check counts the live
processes whose command line names the test's own directory, which only the trial's
processes (guard, launcher, workers) have.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from process_census import child_pids_alive, survivors

from parsearch.launch import guard

ROOT = Path(__file__).resolve().parent.parent
LAUNCHER = str(Path(__file__).with_name("daemonizing_launcher.py"))


def wait_until_gone(marker: Path, timeout_s: float = 10.0, zombies: bool = False) -> None:
    deadline = time.monotonic() + timeout_s
    while left := survivors(marker, zombies):
        assert time.monotonic() < deadline, f"{len(left)} processes of the trial survive: {left}"
        time.sleep(0.1)


def wait_for_workers(pid_dir: Path, count: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(list(pid_dir.glob("worker*"))) < count:
        assert time.monotonic() < deadline, "the launcher's workers did not start"
        time.sleep(0.05)


def guarded_launcher(pid_dir: Path, *extra: str) -> subprocess.Popen:
    command = [sys.executable, "-S", guard.__file__, str(os.getpid()), sys.executable, LAUNCHER]
    return subprocess.Popen(
        [*command, "--pid-dir", str(pid_dir), "--workers", "2", *extra],
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )


@pytest.mark.parametrize("double_fork", [False, True], ids=["setsid", "daemon"])
def test_what_a_command_leaves_behind_dies_with_it_and_its_exit_code_stays(tmp_path, double_fork):
    extra = ["--exit-code", "3"] + (["--double-fork"] if double_fork else [])
    process = guarded_launcher(tmp_path / "pids", *extra)
    assert process.wait(timeout=30) == 3
    assert len(list((tmp_path / "pids").glob("worker*"))) == 2
    wait_until_gone(tmp_path, timeout_s=2.0, zombies=True)


def test_the_agents_sigterm_reaches_workers_in_other_sessions(tmp_path):
    process = guarded_launcher(tmp_path / "pids", "--hang", "--double-fork")
    wait_for_workers(tmp_path / "pids", 2)
    assert len(survivors(tmp_path)) == 4  # guard, launcher, two workers
    os.killpg(process.pid, signal.SIGTERM)  # what the agent sends a rank's group
    assert process.wait(timeout=5) == -signal.SIGTERM
    wait_until_gone(tmp_path, timeout_s=2.0, zombies=True)


def test_a_command_killed_by_a_signal_is_reported_so(tmp_path):
    command = [sys.executable, "-S", guard.__file__, str(os.getpid()), sys.executable, "-c"]
    script = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    assert subprocess.run([*command, script], timeout=30).returncode == -signal.SIGSEGV


def test_a_missing_program_is_exit_127_with_the_reason(tmp_path):
    command = [sys.executable, "-S", guard.__file__, str(os.getpid()), str(tmp_path / "nope")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert done.returncode == 127
    assert "cannot run" in done.stderr and "nope" in done.stderr


@pytest.mark.e2e
@pytest.mark.parametrize("launch", ["per_node", "per_rank"])
def test_kill_9_of_the_driver_leaves_no_process_of_the_trial(tmp_path, launch):
    """A campaign whose trial hides daemonised workers; the driver is killed with SIGKILL
    once they run, and within seconds nothing of the trial is left."""
    pid_dir = tmp_path / "pids"
    space = {
        "name": "cleanup",
        "model": {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "vocab_size": 128,
                  "seq_length": 32},
        "allocation": {"nodes": 1, "devices_per_node": 2, "device": "cpu",
                       "device_memory": "1GiB", "peak_tflops": 0.05},
        "search": {"tp": [1], "pp": [1], "mbs": [1], "gas": [1]},
        "trainer": {"kind": "command", "parser": "json", "launch": launch, "timeout": 600,
                    "command": ["{python}", LAUNCHER, "--pid-dir", "{pids}/{node_rank}",
                                "--workers", "2", "--double-fork", "--hang"],
                    "vars": {"python": sys.executable, "pids": str(pid_dir)}},
    }  # fmt: skip
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    driver = subprocess.Popen(
        [sys.executable, "-m", "parsearch", "run", "space.yaml", "--store", "c.db",
         "--budget", "1", "--quiet"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        ranks = 1 if launch == "per_node" else 2
        deadline = time.monotonic() + 60
        while len(list(pid_dir.glob("*/worker*"))) < 2 * ranks:
            assert driver.poll() is None and time.monotonic() < deadline, "no trial started"
            time.sleep(0.1)
        assert len(survivors(pid_dir)) == 4 * ranks
    finally:
        driver.kill()
        driver.wait()
    wait_until_gone(pid_dir)


@pytest.mark.e2e
@pytest.mark.slow
def test_kill_9_of_the_driver_ends_the_builtin_trainers_ranks_within_a_second_or_two(tmp_path):
    """The built-in trainer's ranks are forks of the driver's fork server, which the kernel
    kills when the driver dies (``PR_SET_PDEATHSIG``; start-up included, see
    test_start_up_kill.py); it used to wait for the driver's end of its pipe to close, and
    before that to finalise its interpreter first (torch: 9-11 s on a loaded 2-core machine,
    all the while its ranks ran on)."""
    tiny = ROOT / "search_spaces" / "tiny-cpu.yaml"
    driver = subprocess.Popen(
        [sys.executable, "-m", "parsearch", "run", str(tiny), "--store", "c.db",
         "--budget", "1", "--quiet"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while len(victims := guard.descendants(driver.pid)) < 5:  # the server and 4 ranks
            assert driver.poll() is None and time.monotonic() < deadline, "no trial started"
            time.sleep(0.02)
        time.sleep(0.3)  # into the trial
    finally:
        driver.kill()
        killed = time.monotonic()
        driver.wait()
    while left := child_pids_alive(victims):
        assert time.monotonic() - killed < 3.0, f"the trial's processes {left} outlive it"
        time.sleep(0.01)
