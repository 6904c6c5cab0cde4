"""The mpi backend for real: ``mpiexec`` from the virtual environment, mpi4py workers, and
built-in-trainer trials written end to end into a store (as deephyper's MPI tests do, each
test launches a program under ``mpiexec`` with a timeout).

Hydra runs every rank of one host under one proxy, and that proxy SIGKILLs all of them when
one dies by a signal; the tests that kill a rank give each rank its own proxy (``-launcher
fork -hosts n0,n1,...``), as on a real cluster with one rank per node.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from process_census import child_pids_alive

pytest.importorskip("mpi4py")

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

BIN = Path(sys.executable).parent
MPIEXEC = BIN / "mpiexec"
SCRIPT = Path(__file__).with_name("mpi_scripts") / "driver.py"
SPACE = """
name: mpi-test
model: {num_layers: 2, hidden_size: 64, num_heads: 4, vocab_size: 128, seq_length: 32}
allocation: {nodes: NODES, devices_per_node: 1, device: cpu, device_memory: 1GiB,
             peak_tflops: 0.05}
search: {tp: [1], pp: [1], mbs: [1, 2, 4, 8], recompute: [none, full]}
global_batch: 8
trainer: {kind: builtin, steps: STEPS, warmup_steps: 1, timeout: 120}
"""

if not MPIEXEC.exists():
    pytest.skip("no mpiexec next to the interpreter", allow_module_level=True)


def own_proxies(n: int) -> list[str]:
    """mpiexec options giving each of ``n`` ranks its own hydra proxy, as separate nodes."""
    hosts = ",".join(f"n{i}" for i in range(n))
    return ["-disable-auto-cleanup", "-launcher", "fork", "-hosts", hosts, "-ppn", "1"]


def launch(n: int, args: list[str], cwd: Path, options: Sequence[str] = ()) -> subprocess.Popen:
    """Start ``args`` on ``n`` ranks (in a session of its own, to kill it all on timeout)."""
    return subprocess.Popen(
        [str(MPIEXEC), *options, "-n", str(n), *args], cwd=cwd, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip


def finish(proc: subprocess.Popen, timeout: float) -> subprocess.CompletedProcess:
    """Wait for a launch; one that outlives ``timeout`` is killed and fails the test."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"mpiexec did not end within {timeout} s:\n{out[-4000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out)


def mpiexec(
    n: int, args: list[str], cwd: Path, timeout: float, options: Sequence[str] = ()
) -> subprocess.CompletedProcess:
    return finish(launch(n, args, cwd, options), timeout)


def run_campaign(
    tmp_path: Path, n: int, nodes: int, budget: int, *opts: str, steps: int = 2, **kw
) -> subprocess.CompletedProcess:
    space = SPACE.replace("NODES", str(nodes)).replace("STEPS", str(steps))
    (tmp_path / "space.yaml").write_text(space)
    args = [str(BIN / "parsearch"), "run", "space.yaml", "--store", "x.db", "--backend", "mpi"]
    args += ["--budget", str(budget), "--backend-opt", f"workdir={tmp_path / 'work'}"]
    for opt in opts:
        args += ["--backend-opt", opt]
    return mpiexec(n, args, tmp_path, **kw)


def trials(db: Path) -> list[dict]:
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        rows = conn.execute("SELECT * FROM trials ORDER BY number").fetchall()
    return [dict(row) for row in rows]


def node_files(trial_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(trial_dir.glob("node*.json"))]


def first_started_node(work: Path) -> dict:
    """The node file of the first trial node to start under ``work`` (its worker's pid,
    its ranks' pids), once there is one."""
    deadline = time.monotonic() + 120
    while not (started := list(work.glob("*/node0.json"))) and time.monotonic() < deadline:
        time.sleep(0.02)
    return json.loads(started[0].read_text())


def in_background(action: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=action)
    thread.start()
    return thread


def pause_first_worker(work: Path, seconds: float, paused: dict) -> threading.Thread:
    """SIGSTOP the worker of the first trial for ``seconds``; ``paused`` gets its node file
    and the wall-clock time it resumed."""

    def pause() -> None:
        paused.update(first_started_node(work))
        os.kill(paused["pid"], signal.SIGSTOP)
        time.sleep(seconds)
        paused["resumed_at"] = time.time()
        os.kill(paused["pid"], signal.SIGCONT)

    return in_background(pause)


def test_driver_and_two_nodes_run_a_campaign(tmp_path):
    """``mpiexec -n 3``: rank 0 drives (it shares its host), ranks 1 and 2 are the nodes."""
    done = run_campaign(tmp_path, 3, nodes=1, budget=4, timeout=240)
    assert done.returncode == 0, done.stdout
    assert "budget reached; 4/4 trials finished (ok 4)" in done.stdout
    rows = trials(tmp_path / "x.db")
    assert [row["state"] for row in rows] == ["ok"] * 4
    assert all(row["tokens_per_s"] > 0 for row in rows)
    workers = {node["pid"] for p in (tmp_path / "work").iterdir() for node in node_files(p)}
    assert len(workers) == 2  # both nodes worked, the driver did not
    ports = [node["port"] for p in (tmp_path / "work").iterdir() for node in node_files(p)]
    assert len(set(ports)) == len(ports)


def test_resume_under_mpiexec_reads_the_backend_from_the_store(tmp_path):
    """``parsearch resume`` without ``--backend``: every rank reads the stored backend
    read-only, so ranks >= 1 become workers instead of a second and third driver."""
    first = run_campaign(tmp_path, 3, nodes=1, budget=2, timeout=240)
    assert first.returncode == 0, first.stdout
    args = [str(BIN / "parsearch"), "resume", "--store", "x.db", "--budget", "4"]
    done = mpiexec(3, args, tmp_path, 240)
    assert done.returncode == 0, done.stdout
    assert "budget reached; 4/4 trials finished (ok 4)" in done.stdout
    assert [row["state"] for row in trials(tmp_path / "x.db")] == ["ok"] * 4


def test_driver_works_its_own_node_in_a_two_node_trial(tmp_path):
    """One rank per node (forced here): rank 0 is node 0 of each trial, rank 1 node 1."""
    done = run_campaign(tmp_path, 2, 2, 2, "driver_worker=yes", timeout=240)
    assert done.returncode == 0, done.stdout
    rows = trials(tmp_path / "x.db")
    assert [row["state"] for row in rows] == ["ok", "ok"]
    assert all(json.loads(row["hosts"]) == [os.uname().nodename] * 2 for row in rows)
    for trial_dir in (tmp_path / "work").iterdir():
        nodes = node_files(trial_dir)
        assert [n["node"] for n in nodes] == [0, 1]
        assert nodes[0]["port"] == nodes[1]["port"]  # one rendezvous
        assert json.loads((trial_dir / "result.json").read_text())["metrics"]["world_size"] == 2


def test_trials_of_one_two_and_four_nodes_pack_the_allocation(tmp_path):
    done = mpiexec(5, [sys.executable, str(SCRIPT), "mixed", "x.db", "work"], tmp_path, 420)
    assert done.returncode == 0, done.stdout
    rows = trials(tmp_path / "x.db")
    sizes = [json.loads(row["config"])["dp"] * json.loads(row["config"])["tp"] *
             json.loads(row["config"])["pp"] for row in rows]  # fmt: skip
    assert sizes == [2, 1, 1, 4, 1, 2, 1]
    assert [row["state"] for row in rows] == ["ok"] * 7, [row["error"] for row in rows]
    assert [len(json.loads(row["hosts"])) for row in rows] == sizes
    nodes = {row["number"]: node_files(tmp_path / "work" / f"trial-{row['number']:05d}")
             for row in rows}  # fmt: skip
    # The first wave (2 + 1 + 1 nodes) used all four workers at once, and so did the last.
    for wave in ([0, 1, 2], [3], [4, 5, 6]):
        pids = [node["pid"] for number in wave for node in nodes[number]]
        assert len(set(pids)) == 4
        assert max(r["started_at"] for r in rows if r["number"] in wave) < min(
            r["finished_at"] for r in rows if r["number"] in wave
        )


def test_a_worker_killed_mid_trial_is_an_error_and_the_campaign_goes_on(tmp_path):
    work = tmp_path / "work"
    killed: dict = {}

    def kill_first_worker() -> None:
        killed.update(first_started_node(work))  # its rank has just started
        os.kill(killed["pid"], signal.SIGKILL)

    killer = in_background(kill_first_worker)
    done = run_campaign(
        tmp_path, 3, 1, 4, "lost_after=10", steps=200, timeout=300, options=own_proxies(3)
    )
    killer.join()
    assert "budget reached; 4/4 trials finished (ok 3, error 1)" in done.stdout, done.stdout
    rows = trials(tmp_path / "x.db")
    (lost,) = [row for row in rows if row["state"] == "error"]
    assert lost["error"].startswith("node lost: worker rank ")
    assert f"(pid {killed['pid']}) lost" in lost["error"]
    assert [row["state"] for row in rows if row is not lost] == ["ok"] * 3
    assert child_pids_alive(killed["pids"]) == []  # the trial's rank died with its worker


def test_a_worker_that_stops_answering_is_lost_and_released_at_the_end(tmp_path):
    """SIGSTOP (not a death: hydra sees nothing): the driver's heartbeat check loses it;
    once it runs again it obeys the cancel and the exit, so the job ends at once. The pause
    outlasts the campaign: the driver, having dropped the beats it never read, finalizes
    cleanly and exits first, and hydra (cleanup not disabled) waits for the worker."""
    stopped: dict = {}
    pauser = pause_first_worker(tmp_path / "work", 12.0, stopped)
    done = run_campaign(
        tmp_path, 3, 1, 4, "lost_after=3", "heartbeat=0.5", steps=200, timeout=300,
    )  # fmt: skip
    pauser.join()
    assert done.returncode == 0, done.stdout
    assert "budget reached; 4/4 trials finished (ok 3, error 1)" in done.stdout, done.stdout
    (lost,) = [row for row in trials(tmp_path / "x.db") if row["state"] == "error"]
    assert f"(pid {stopped['pid']}) lost: it sent nothing for " in lost["error"]
    assert child_pids_alive([stopped["pid"], *stopped["pids"]]) == []


def test_workers_exit_when_the_driver_vanishes(tmp_path):
    began = time.monotonic()
    done = mpiexec(
        3, [sys.executable, str(SCRIPT), "vanish", "x.db", str(tmp_path)], tmp_path, 60,
        options=own_proxies(3),
    )  # fmt: skip
    assert time.monotonic() - began < 30
    assert done.stdout.count("the driver is gone") == 2, done.stdout


def test_workers_are_released_when_the_driver_fails_early(tmp_path):
    """The space file does not exist: rank 0 fails before making a backend."""
    args = [str(BIN / "parsearch"), "run", "missing.yaml", "--store", "x.db", "--backend", "mpi"]
    done = mpiexec(3, args, tmp_path, 60)
    assert done.returncode == 2, done.stdout
    assert "missing.yaml" in done.stdout


def test_a_job_of_workers_on_proxies_of_their_own_ends_with_the_drivers_exit_code(tmp_path):
    """Hydra, ``-disable-auto-cleanup``: 4 workers released at once made ``mpiexec`` die of
    SIGPIPE (exit code -13) in 3 of 12 such jobs idle, 10 of 12 beside 2 busy processes; they
    leave one at a time now (``release_workers``), so every job ends with rank 0's code."""
    args = [str(BIN / "parsearch"), "run", "missing.yaml", "--store", "x.db", "--backend", "mpi"]
    codes = [mpiexec(5, args, tmp_path, 60, options=own_proxies(5)) for _ in range(6)]
    assert [done.returncode for done in codes] == [2] * 6, [done.stdout for done in codes]


def test_an_idle_worker_does_not_spin(tmp_path):
    """MPICH's blocking receive would use ~65% of a core here; the worker's wait, ~0."""
    proc = launch(2, [sys.executable, str(SCRIPT), "idle", "x.db", str(tmp_path)], tmp_path)
    pids_file = tmp_path / "workers.json"
    deadline = time.monotonic() + 60
    while not pids_file.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    (pid,) = json.loads(pids_file.read_text())
    before, began = cpu_seconds(pid), time.monotonic()
    time.sleep(2.0)
    share = (cpu_seconds(pid) - before) / (time.monotonic() - began)
    done = finish(proc, 60)
    assert done.returncode == 0, done.stdout
    assert share < 0.05


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


COMMAND_SPACE = """
name: mpi-command
model: {num_layers: 4, hidden_size: 64, num_heads: 4, vocab_size: 128, seq_length: 32}
allocation: {nodes: 2, devices_per_node: 1, device: cpu, device_memory: 1GiB, peak_tflops: 0.05}
search: {tp: [1, 2], pp: [1, 2], mbs: [1, 2, 4]}
global_batch: 8
trainer:
  kind: command
  parser: megatron
  steps: 4
  warmup_steps: 1
  timeout: 60
  vars: {python: PYTHON, fake: FAKE}
  command: ["{python}", "{fake}", "--format", "megatron", "--tp", "{tp}", "--pp", "{pp}",
            "--dp", "{dp}", "--mbs", "{mbs}", "--gas", "{gas}",
            "--global-batch", "{global_batch}", "--seq-length", "{seq_length}",
            "--steps", "{steps}", "--print-rank", "last", "--oom-above", "2",
            "--step-ms", "20"]
"""


def test_command_trainer_over_mpi_workers(tmp_path):
    """A command trainer (tests/fake_trainer.py printing Megatron-LM's lines from the last
    rank only, out of memory when mbs/tp > 2) on two mpi worker nodes: every trial spans
    both nodes, metrics come from the last rank's log, OOM is recognised."""
    fake = Path(__file__).with_name("fake_trainer.py")
    space = COMMAND_SPACE.replace("PYTHON", sys.executable).replace("FAKE", str(fake))
    (tmp_path / "space.yaml").write_text(space)
    args = [str(BIN / "parsearch"), "run", "space.yaml", "--store", "x.db", "--backend", "mpi"]
    args += ["--budget", "5", "--keep-predicted-oom"]
    done = mpiexec(3, args, tmp_path, 240)
    assert done.returncode == 0, done.stdout
    assert "budget reached; 5/5 trials finished" in done.stdout
    rows = trials(tmp_path / "x.db")
    states = {row["state"] for row in rows}
    assert states <= {"ok", "oom"}, [row["error"] for row in rows]
    assert "ok" in states
    for row in rows:
        config = json.loads(row["config"])
        if row["state"] == "ok":
            assert json.loads(row["metrics"])["tokens_per_s"] > 0
            assert len(json.loads(row["hosts"])) == 2
        else:
            assert config["mbs"] / config["tp"] > 2


def test_losing_the_last_worker_stops_the_campaign_at_once_with_a_clear_error(tmp_path):
    """Nothing can run any more: the driver says so (no waiting for room), keeps what
    finished, and the campaign can be resumed on a new allocation."""
    work = tmp_path / "work"
    killer = in_background(lambda: os.kill(first_started_node(work)["pid"], signal.SIGKILL))
    began = time.monotonic()
    done = run_campaign(
        tmp_path, 2, 1, 4, "lost_after=10", "driver_worker=no", steps=200, timeout=300,
        options=own_proxies(2),
    )  # fmt: skip
    killer.join()
    assert time.monotonic() - began < 100  # well before the driver's 120 s wait for room
    assert "backend 'mpi' has no room left for a trial (3 of the budget to go)" in done.stdout
    assert done.returncode != 0
    (lost,) = trials(tmp_path / "x.db")  # the lost trial counts: 3 to go
    assert lost["state"] == "error" and lost["error"].startswith("node lost: ")


def test_heartbeats_nobody_received_do_not_fail_the_job_at_exit(tmp_path):
    """MPICH's MPI_Finalize fails on unreceived messages and then hydra SIGKILLs the job
    (exit 9 after a campaign that completed): every rank drops them before it ends.
    ``MPI4PY_RC_ERRORS=fatal`` makes such a failure print MPICH's error and abort."""
    args = [sys.executable, str(SCRIPT), "unheard", "x.db", str(tmp_path)]
    proc = subprocess.Popen(
        [str(MPIEXEC), "-n", "3", *args], cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env={**os.environ, "MPI4PY_RC_ERRORS": "fatal"},
    )  # fmt: skip
    done = finish(proc, 60)
    assert done.returncode == 0, done.stdout
    assert "unmatched message" not in done.stdout


def test_a_worker_lost_for_silence_comes_back_when_it_answers_again(tmp_path):
    """A node paused for a few seconds (SIGSTOP here; a hung file system in real life) is
    lost, its trial an error; once it runs again it acknowledges the cancel and gets more
    trials, instead of idling for the rest of the allocation."""
    work = tmp_path / "work"
    paused: dict = {}
    pauser = pause_first_worker(work, 6.0, paused)
    # Trials the other worker alone needs well over the pause for: at 100 steps (about a
    # second a trial) an idle machine finished the budget before the paused worker answered
    # again (7 s campaigns), so the premise (trials left to give it) failed, on the code
    # of 4c77633 as on today's. lost_after 3 (not 2) under a 6 s pause: with two 400-step
    # trials on 2 cores beside another test worker, the resumed worker's heartbeats once
    # stopped for 2 s and it was lost a second time (error 2 of 8; a fresh-clone run).
    done = run_campaign(
        tmp_path, 3, 1, 8, "lost_after=3", "heartbeat=0.5", steps=400, timeout=300,
        options=["-disable-auto-cleanup"],
    )  # fmt: skip
    pauser.join()
    assert done.returncode == 0, done.stdout
    assert f"(pid {paused['pid']}) lost: it sent nothing for " in done.stdout
    assert f"(pid {paused['pid']}) answers again; back in the campaign, 2 workers" in done.stdout
    assert "budget reached; 8/8 trials finished (ok 7, error 1)" in done.stdout, done.stdout
    later = [
        node for trial_dir in work.iterdir() for node in node_files(trial_dir)
        if node["started_at"] > paused["resumed_at"]
    ]  # fmt: skip
    assert any(node["pid"] == paused["pid"] for node in later), done.stdout


def test_the_last_worker_lost_for_silence_is_waited_for_and_comes_back(tmp_path):
    """Every node silent at once (a hung file system; seen on a fresh clone at load average
    10, both workers lost at 2 s): the campaign does not end while a node lost for silence
    may still answer (``lost_after`` after it was lost); it answers, and the budget is run."""
    work = tmp_path / "work"
    paused: dict = {}
    pauser = pause_first_worker(work, 5.0, paused)
    done = run_campaign(
        tmp_path, 2, 1, 3, "lost_after=4", "heartbeat=0.5", "driver_worker=no", steps=100,
        timeout=300, options=["-disable-auto-cleanup"],
    )  # fmt: skip
    pauser.join()
    assert done.returncode == 0, done.stdout
    assert f"(pid {paused['pid']}) lost: it sent nothing for " in done.stdout
    assert "0 workers left" in done.stdout, done.stdout
    assert f"(pid {paused['pid']}) answers again; back in the campaign, 1 workers" in done.stdout
    assert "budget reached; 3/3 trials finished (ok 2, error 1)" in done.stdout, done.stdout


def test_proxies_run_two_at_once_on_four_nodes_then_one_confirms_at_full_scale(tmp_path):
    """``mpiexec -n 5``: the driver and four one-device nodes. Under ZeRO-1 a proxy keeps
    two replicas (two nodes), so two proxies fill the allocation; the budget's last trial
    confirms the better one on all four."""
    space = SPACE.replace("NODES", "4").replace("STEPS", "2")
    space = space.replace("recompute: [none, full]}", "recompute: [none, full], zero_stage: 1}")
    (tmp_path / "space.yaml").write_text(space)
    args = [str(BIN / "parsearch"), "run", "space.yaml", "--store", "x.db", "--backend", "mpi"]
    args += ["--budget", "3", "--proxy", "--backend-opt", f"workdir={tmp_path / 'work'}"]
    done = mpiexec(5, args, tmp_path, 240)
    assert done.returncode == 0, done.stdout
    assert "budget reached; 3/3 trials finished (ok 3)" in done.stdout
    first, second, confirm = trials(tmp_path / "x.db")
    assert first["proxy_dp"] == second["proxy_dp"] == 2
    assert len(json.loads(first["hosts"])) == len(json.loads(second["hosts"])) == 2
    assert (
        first["started_at"] < second["finished_at"] and second["started_at"] < first["finished_at"]
    )
    assert confirm["proxy_dp"] is None and confirm["origin"] == "confirm"
    assert len(json.loads(confirm["hosts"])) == 4
    assert confirm["config"] in (first["config"], second["config"])
    workers = {node["pid"] for p in (tmp_path / "work").iterdir() for node in node_files(p)}
    assert len(workers) == 4  # both proxies' nodes were distinct workers
    measured = json.loads(first["metrics"])["fidelity"]["measured"]
    assert measured["world_size"] == 2 and json.loads(confirm["metrics"])["world_size"] == 4
