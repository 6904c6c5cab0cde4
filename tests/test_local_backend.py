"""The local backend with the real built-in trainer: concurrent trials, failures, cancel, e2e."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from parsearch.backends import create_backend
from parsearch.errors import BackendError
from parsearch.result import TrialState
from parsearch.space import load_space
from parsearch.trial import TrialSpec

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

ROOT = Path(__file__).parent.parent
TINY_SPACE = {
    "name": "two-ranks",
    "model": {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "vocab_size": 128,
              "seq_length": 32},
    "allocation": {"nodes": 1, "devices_per_node": 2, "device": "cpu", "device_memory": "256MiB",
                   "peak_tflops": 0.05},
    "search": {"tp": [1, 2], "pp": [1, 2], "mbs": [1, 2]},
    "global_batch": 4,
    "trainer": {"kind": "builtin", "steps": 2, "warmup_steps": 1, "timeout": 120},
    "estimate": {"precision": "fp32"},
}  # fmt: skip


@pytest.fixture(scope="module")
def space_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("local") / "two-ranks.yaml"
    path.write_text(yaml.safe_dump(TINY_SPACE))
    return path


def _spec(space, layout, trial_id, timeout_s=120.0, steps=None):
    trainer = dict(space.trainer, **({"steps": steps} if steps else {}))
    return TrialSpec(trial_id, space.model, layout, space.allocation, trainer, timeout_s=timeout_s)


def _wait(backend, count, timeout_s=180):
    done, deadline = [], time.monotonic() + timeout_s
    while len(done) < count:
        assert time.monotonic() < deadline, "trials did not finish"
        done += backend.poll(1.0)
    return {f.trial_id: f.result for f in done}


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"


def test_concurrent_trials_failures_and_cancel(space_file, tmp_path):
    space = load_space(space_file)
    layouts = [layout for layout, _ in space.plan().feasible if layout.pp == 1]
    backend = create_backend("local", space, slots=2, options={"workdir": str(tmp_path)})
    try:
        assert backend.capacity == backend.free_slots() == 2
        assert backend.submit(_spec(space, layouts[0], "a")) == [os.uname().nodename]
        backend.submit(_spec(space, layouts[1], "b", timeout_s=2.0, steps=100_000))
        assert backend.free_slots() == 0
        with pytest.raises(BackendError, match="busy"):
            backend.submit(_spec(space, layouts[2], "c"))
        results = _wait(backend, 2)
        assert results["a"].status is TrialState.OK, results["a"].error
        assert results["a"].metrics["tokens_per_s"] > 0 and results["a"].metrics["peak_mem_bytes"]
        assert results["b"].status is TrialState.TIMEOUT
        assert (tmp_path / "a" / "rank1.log").exists(), "workdir keeps the logs"

        backend.submit(_spec(space, layouts[2], "c", steps=100_000))
        time.sleep(0.5)
        pids = [rank.pid for rank in backend._running["c"].runs[0].ranks]
        backend.cancel("c")
        assert backend.free_slots() == 2 and backend.poll(0.1) == []
        assert not any(_alive(pid) for pid in pids), "cancel kills the trial's ranks"
    finally:
        backend.close()


def _descendants(pid):
    """Every live process started, directly or not, by ``pid``."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                parents[int(entry.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


@pytest.mark.e2e
def test_a_killed_driver_takes_its_trial_ranks_with_it(tmp_path):
    """A trial that would train for a minute; the driver is killed once its ranks train."""
    long_trial = {**TINY_SPACE, "trainer": {**TINY_SPACE["trainer"], "steps": 5000}}
    space_file = tmp_path / "long.yaml"
    space_file.write_text(yaml.safe_dump(long_trial))
    db = tmp_path / "c.db"
    driver = subprocess.Popen(
        [sys.executable, "-m", "parsearch", "run", str(space_file), "--store", str(db),
         "--budget", "1", "--quiet", "--backend-opt", f"workdir={tmp_path / 'trials'}"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    logs = tmp_path / "trials"
    while len(list(logs.glob("*/rank*.log"))) < 2:
        assert driver.poll() is None and time.monotonic() < deadline, "no trial started"
        time.sleep(0.2)
    time.sleep(2.0)  # into the trial's training steps
    started = _descendants(driver.pid)
    assert started, "the trial's processes descend from the driver"
    driver.kill()
    driver.wait()
    deadline = time.monotonic() + 10  # the trial would train for far longer than this
    while alive := [pid for pid in started if _alive(pid)]:
        assert time.monotonic() < deadline, f"processes {alive} outlived their driver"
        time.sleep(0.2)


@pytest.mark.e2e
def test_run_and_best_with_the_built_in_trainer(space_file, tmp_path):
    db = tmp_path / "demo.db"
    run = subprocess.run(
        [sys.executable, "-m", "parsearch", "run", str(space_file), "--store", str(db),
         "--budget", "3"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "budget reached; 3/3 trials finished" in run.stdout
    best = subprocess.run(
        [sys.executable, "-m", "parsearch", "best", "--store", str(db)],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert best.returncode == 0, best.stderr
    assert "best of campaign 'two-ranks'" in best.stdout and "tokens_per_s" in best.stdout


@pytest.mark.e2e
def test_command_trainer_campaign_on_the_local_backend(tmp_path):
    """``parsearch run`` with a command trainer (tests/fake_trainer.py printing Megatron-LM's
    lines from the last rank, out of memory when mbs/tp > 2) on this machine."""
    fake = Path(__file__).with_name("fake_trainer.py")
    command = [
        "{python}", "{fake}", "--format", "megatron", "--tp", "{tp}", "--pp", "{pp}",
        "--dp", "{dp}", "--mbs", "{mbs}", "--gas", "{gas}", "--global-batch", "{global_batch}",
        "--seq-length", "{seq_length}", "--steps", "{steps}", "--print-rank", "last",
        "--oom-above", "2", "--step-ms", "20",
    ]  # fmt: skip
    space = {
        "name": "local-command",
        "model": {"num_layers": 4, "hidden_size": 64, "num_heads": 4, "vocab_size": 128,
                  "seq_length": 32},
        "allocation": {"nodes": 1, "devices_per_node": 2, "device": "cpu",
                       "device_memory": "1GiB", "peak_tflops": 0.05},
        "search": {"tp": [1, 2], "pp": [1, 2], "mbs": [1, 2, 4]},
        "global_batch": 8,
        "trainer": {"kind": "command", "parser": "megatron", "steps": 4, "warmup_steps": 1,
                    "timeout": 60, "command": command,
                    "vars": {"python": sys.executable, "fake": str(fake)}},
    }  # fmt: skip
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    # The fake trainer's out-of-memory rule ignores memory, so the calibration must not
    # prune by it (it may, from that one trial, rule out every layout left).
    done = subprocess.run(
        [sys.executable, "-m", "parsearch", "run", "space.yaml", "--store", "x.db",
         "--budget", "3", "--quiet", "--keep-predicted-oom"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3/3 trials finished" in done.stdout
    frame = __import__("parsearch").results(tmp_path / "x.db")
    assert set(frame["state"]) == {"ok", "oom"}
    ok = frame[frame["state"] == "ok"]
    assert (ok["tokens_per_s"] > 0).all()
    oom = frame[frame["state"] == "oom"]
    assert (oom["mbs"] / oom["tp"] > 2).all()


@pytest.mark.parametrize("grace", ["-1", "0", "soon", "inf"])
def test_a_grace_that_is_not_a_positive_number_is_refused(space_file, grace):
    with pytest.raises(BackendError, match="local option grace must be a positive number of sec"):
        create_backend("local", load_space(space_file), options={"grace": grace})
