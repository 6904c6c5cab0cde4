"""The supervisor of a spawned rank (parsearch/launch/guard.py) cannot be taken for the
driver by a name match (``pkill -f parsearch``), and when it dies anyway (``kill -9``),
torchrun's workers, in sessions of their own, die with it instead of training on unwatched.

Real torchrun with two sleeping CPU workers; processes counted from /proc."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from process_census import survivors

from parsearch.launch.guard import guard_argv
from parsearch.launch.process import free_port
from parsearch.launch.rank_site import SITE_DIR

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]
WORKER = "import time\nwhile True:\n    time.sleep(1)\n"


def rank_env() -> dict[str, str]:
    """What the node agent gives a spawned rank: rank_site first on PYTHONPATH."""
    path = os.pathsep.join(filter(None, [str(SITE_DIR), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


def test_the_guard_command_line_names_no_parsearch_and_still_supervises(tmp_path):
    argv = guard_argv(os.getpid())
    assert not any("parsearch" in arg for arg in argv), argv
    done = subprocess.run(
        [*argv, sys.executable, "-c", "import sys; sys.exit(3)"], timeout=60, env=rank_env()
    )
    assert done.returncode == 3


def test_torchruns_workers_die_with_a_guard_killed_with_sigkill(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
        "--master-port", str(free_port("127.0.0.1")), str(script),
    ]  # fmt: skip
    guard = subprocess.Popen(
        [*guard_argv(os.getpid()), *command],
        env=rank_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while len(survivors(tmp_path)) < 3:  # torchrun and its two workers
            assert time.monotonic() < deadline, "torchrun's workers did not start"
            time.sleep(0.2)
        time.sleep(0.5)  # past the workers' start-up (sitecustomize)
        guard.send_signal(signal.SIGKILL)
        guard.wait()
        deadline = time.monotonic() + 15
        while left := survivors(tmp_path):
            assert time.monotonic() < deadline, f"{len(left)} processes outlived the guard"
            time.sleep(0.2)
    finally:
        for pid in survivors(tmp_path):
            os.kill(pid, signal.SIGKILL)
