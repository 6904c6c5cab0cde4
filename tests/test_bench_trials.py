"""Whole trials of the built-in trainer through its command line and the node agent:
results, the memory wall, hung and failing ranks, and no process left behind."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest
from bench_helpers import command_plan, fault_command, one_thread, tiny_spec
from process_census import child_pids_alive
from trials_seen import trials_seen

from parsearch.estimate import EstimateSettings, memory_by_stage
from parsearch.launch.placement import NodePlacement
from parsearch.launch.process import NodeRun, free_port
from parsearch.result import TrialResult, TrialState
from parsearch.trainers.builtin import run_trial
from parsearch.trainers.builtin.plain import plain_training
from parsearch.trial_kinds import node_run

pytestmark = pytest.mark.multiprocess


def node(spec, trial_dir, command=None) -> NodeRun:
    where = NodePlacement(spec, 0, 1, "127.0.0.1", free_port(), trial_dir, grace_s=2.0)
    return NodeRun(where, command_plan(where, command)) if command else node_run(where)


def test_command_line_runs_one_rank_without_a_launcher(tmp_path):
    spec_path, out = tmp_path / "trial.json", tmp_path / "result.json"
    spec_path.write_text(tiny_spec().to_json())
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "parsearch.trainers.builtin",
            "--spec",
            str(spec_path),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=True,
    )
    written = json.loads(out.read_text())
    assert json.loads(done.stdout.strip().splitlines()[-1]) == written
    result = TrialResult.from_dict(written)
    assert result.ok and result.metrics["world_size"] == 1
    assert result.metrics["peak_mem_source"] == "MemTracker"


@pytest.mark.parametrize("prefork", [True, False], ids=["forked", "spawned"])
def test_run_trial_reports_every_figure(tmp_path, prefork):
    result = run_trial(tiny_spec(1, 1, 2, zero_stage=3), tmp_path, prefork=prefork)
    assert result.ok, result.error
    m = result.metrics
    for key in (
        "step_time_s",
        "step_time_spread_s",
        "tokens_per_s",
        "tflops_per_device",
        "mfu",
        "peak_mem_bytes",
        "peak_mem_bytes_per_rank",
        "peak_rss_bytes",
        "losses",
        "warmup_steps",
        "steps",
        "world_size",
        "layout",
    ):
        assert m[key] is not None, key
    assert m["layout"]["zero_stage"] == 3 and m["device"] == "cpu"
    assert sorted(p.name for p in tmp_path.glob("rank*.log")) == ["rank0.log", "rank1.log"]
    assert result.hosts and result.duration_s > 0


def test_memory_cap_below_the_need_is_oom(tmp_path):
    spec = tiny_spec(1, 1, 2, trainer={"memory_cap_bytes": 1_000_000})
    run = node(spec, tmp_path).start()
    result = run.wait()
    assert result.status is TrialState.OOM, trials_seen([result])
    assert result.metrics["peak_mem_bytes"] > 1_000_000
    assert len(result.metrics["losses"]) == spec.trainer["warmup_steps"]
    assert "exceeds the cap of 977 KiB" in result.error  # in binary units, not raw bytes
    assert not re.search(r"\d{4,} ?B\b", result.error), result.error
    assert child_pids_alive(run.pids) == []


def test_hung_rank_is_killed_by_the_timeout(tmp_path):
    spec = tiny_spec(1, 1, 2, timeout_s=15)
    run = node(spec, tmp_path, fault_command("hang", 1, tmp_path)).start()
    result = run.wait()
    assert result.status is TrialState.TIMEOUT, trials_seen([result])
    assert 15 <= result.duration_s < 45
    assert child_pids_alive(run.pids) == []


def test_exception_in_one_rank_is_an_error_with_its_traceback(tmp_path):
    spec = tiny_spec(1, 1, 2)
    run = node(spec, tmp_path, fault_command("raise", 1, tmp_path)).start()
    result = run.wait()
    assert result.status is TrialState.ERROR, trials_seen([result])
    # The rank's own exception, from the error file it left (parsearch.launch.rank_site).
    assert result.error == "rank 1 exited with code 1: RuntimeError: injected failure in rank 1"
    assert "Traceback" in result.log_tail
    assert "RuntimeError: injected failure in rank 1" in result.log_tail
    assert child_pids_alive(run.pids) == []


def test_without_warm_up_every_step_is_measured(tmp_path):
    result = run_trial(tiny_spec(trainer={"warmup_steps": 0, "steps": 2}), tmp_path)
    assert result.ok, result.error
    m = result.metrics
    assert len(m["losses"]) == len(m["step_times_s"]) == 2
    assert m["step_time_s"] == pytest.approx(sum(m["step_times_s"]) / 2)
    assert m["peak_mem_bytes"] > 0


@pytest.mark.parametrize("warmup_steps", [0, 1])
def test_pipelined_trial_with_little_warm_up_traces_memory(tmp_path, warmup_steps):
    """Pipelining infers backward shapes with autograd.grad() on its first step, where the
    memory tracer's hooks cannot run: the trainer must not trace that step (a regression:
    every pp > 1 trial with warmup_steps <= 1 used to crash)."""
    spec = tiny_spec(pp=2, gas=2, trainer={"warmup_steps": warmup_steps, "steps": 2})
    result = run_trial(spec, tmp_path)
    assert result.ok, result.error
    assert result.metrics["peak_mem_bytes"] > 0


def test_forked_ranks_die_with_the_process_that_started_them(tmp_path):
    """A worker killed with SIGKILL cannot clean up: its fork server exits, and the ranks it
    forked are SIGKILLed by the kernel (``PR_SET_PDEATHSIG``)."""
    spec = tiny_spec(1, 1, 2, trainer={"steps": 10**6})
    (tmp_path / "trial.json").write_text(spec.to_json())
    worker = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from parsearch.launch.placement import NodePlacement\n"
        "from parsearch.launch.process import free_port\n"
        "from parsearch.trial_kinds import node_run\n"
        "from parsearch.trial import TrialSpec\n"
        "d = Path(sys.argv[1])\n"
        "spec = TrialSpec.from_json((d / 'trial.json').read_text())\n"
        "where = NodePlacement(spec, 0, 1, '127.0.0.1', free_port(), d / 'trial')\n"
        "run = node_run(where).start()\n"
        "print(*run.pids, flush=True)\n"
        "time.sleep(600)\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", worker, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    pids = [int(pid) for pid in process.stdout.readline().split()]
    assert len(pids) == 2 and child_pids_alive(pids) == pids
    process.kill()
    process.wait()
    deadline = time.monotonic() + 30
    while child_pids_alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert child_pids_alive(pids) == []


@pytest.mark.parametrize(
    "layout",
    [{}, {"pp": 2}, {"tp": 2, "sequence_parallel": True}, {"dp": 2, "zero_stage": 3}],
    ids=["single", "pp2", "tp2-sp", "dp2-z3"],
)
def test_bf16_autocast_trains_and_meets_the_estimate(tmp_path, layout):
    """bf16 autocast (the GPU default) on CPU: fp32 weights with bf16 copies kept for
    backward, or FSDP2 gathering bf16 weights; the estimate for ``precision="bf16"``
    within 15% of the measured peak, the losses near fp32's."""
    spec = tiny_spec(**layout, trainer={"precision": "bf16"})
    result = run_trial(spec, tmp_path)
    assert result.ok, result.error
    assert result.metrics["precision"] == "bf16"
    with one_thread():
        fp32 = plain_training(spec, 5)[0]
    assert result.metrics["losses"] == pytest.approx(fp32, abs=0.02)
    settings = EstimateSettings(precision="bf16", framework="torch")
    stages = memory_by_stage(spec.model, spec.layout, settings)
    for rank, measured in enumerate(result.metrics["peak_mem_bytes_per_rank"]):
        stage = rank // (spec.layout.world_size // spec.layout.pp)  # tp-cp-dp-pp
        assert stages[stage].total == pytest.approx(measured, rel=0.15)


def test_a_forked_rank_that_raises_reports_its_traceback(tmp_path):
    result = run_trial(tiny_spec(1, 1, 2, trainer={"schedule": "zigzag"}), tmp_path)
    assert result.status is TrialState.ERROR, trials_seen([result])
    assert result.error.endswith("exited with code 1")
    assert "TrainerError: trainer.schedule must be one of" in result.log_tail
