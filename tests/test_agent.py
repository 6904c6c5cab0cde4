"""The node agent against hostile rank programs (plain Python, no torch): it must survive,
report the right state, read back only a bounded tail, and leave no process behind."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import pytest
from bench_helpers import command_plan
from process_census import child_pids_alive
from trials_seen import trials_seen

from parsearch.config import AllocationSpec, ModelSpec, ParallelLayout
from parsearch.launch.placement import NodePlacement
from parsearch.launch.process import TAIL_BYTES, NodeRun, free_port, run_local, run_node
from parsearch.result import TrialState
from parsearch.trial import TrialSpec
from parsearch.trial_kinds import node_run


def make_spec(world: int = 2, per_node: int | None = None, timeout_s: float = 30.0, **kw):
    return TrialSpec(
        trial_id="agent-test",
        model=ModelSpec(num_layers=2, hidden_size=8, num_heads=2, vocab_size=16, seq_length=4),
        layout=ParallelLayout(tp=1, pp=1, dp=world, mbs=1, gas=1),
        allocation=AllocationSpec(
            nodes=1,
            devices_per_node=per_node or world,
            device_memory_bytes=2**30,
            peak_flops_per_device=1e12,
            device=kw.pop("device", "cpu"),
        ),
        timeout_s=timeout_s,
        **kw,
    )


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def start(spec: TrialSpec, tmp_path: Path, code: str, node_rank: int = 0, **kw) -> NodeRun:
    where = NodePlacement(spec, node_rank, spec.nodes, "127.0.0.1", 1, tmp_path, **kw)
    return NodeRun(where, command_plan(where, py(code))).start()


def test_ranks_get_their_environment_and_one_thread(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    code = (
        "import os, json; keys = ['RANK','LOCAL_RANK','WORLD_SIZE','LOCAL_WORLD_SIZE',"
        "'MASTER_ADDR','MASTER_PORT','OMP_NUM_THREADS','CUDA_VISIBLE_DEVICES'];"
        "open('env%s.json' % os.environ['RANK'], 'w').write("
        "json.dumps({k: os.environ.get(k) for k in keys}))"
    )
    spec = make_spec(world=4, per_node=2)
    where = NodePlacement(spec, 1, 2, "10.0.0.1", 4242, tmp_path)
    run = NodeRun(where, command_plan(where, py(code))).start()
    result = run.wait()
    assert result.ok, result.error
    # A custom command that writes no result.json: only the agent's own measure of it.
    assert list(result.metrics) == ["measured_peak_rss_bytes"]
    env = {r: json.loads((tmp_path / f"env{r}.json").read_text()) for r in (2, 3)}
    assert env[3] == {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "4242",
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": None,  # a CPU allocation hides nothing
    }
    assert (tmp_path / "rank2.log").exists() and (tmp_path / "spec.json").exists()
    assert TrialSpec.from_json((tmp_path / "spec.json").read_text()) == spec


def test_gpu_ranks_see_one_device_each(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    monkeypatch.delenv("ROCR_VISIBLE_DEVICES", raising=False)
    code = "import os; print('VISIBLE', os.environ['CUDA_VISIBLE_DEVICES'])"
    result = start(make_spec(device="cuda", trainer={"device": "auto"}), tmp_path, code).wait()
    assert result.ok
    assert "VISIBLE 3" in (tmp_path / "rank0.log").read_text()
    assert "VISIBLE 5" in (tmp_path / "rank1.log").read_text()


def test_rank_zero_result_file_becomes_the_result(tmp_path):
    code = (
        "import os, json\n"
        "if os.environ['RANK'] == '0':\n"
        "    json.dump({'status': 'ok', 'metrics': {'tokens_per_s': 12.5}},"
        " open('result.json', 'w'))"
    )
    result = start(make_spec(), tmp_path, code).wait()
    assert result.ok and result.metrics == {"tokens_per_s": 12.5}
    assert result.hosts == [socket.gethostname()] and result.duration_s > 0


def test_default_command_without_result_is_an_error(tmp_path):
    """The built-in trainer always writes result.json; its absence is a failure."""
    spec = make_spec(world=1)
    run = node_run(NodePlacement(spec, 0, 1, "127.0.0.1", 1, tmp_path))
    run.command = py("print('no result written')")
    result = run.start().wait()
    assert result.status is TrialState.ERROR, trials_seen([result])
    assert "wrote no result.json" in result.error


def test_early_exit_kills_the_others_after_a_grace_period(tmp_path):
    code = (
        "import os, sys, time\n"
        "if os.environ['RANK'] == '1':\n"
        "    print('rank 1 gives up'); sys.exit(3)\n"
        "time.sleep(600)"
    )
    began = time.monotonic()
    run = start(make_spec(timeout_s=120), tmp_path, code, grace_s=1.0)
    result = run.wait()
    assert time.monotonic() - began < 15
    assert result.status is TrialState.ERROR, trials_seen([result])
    assert result.error == "rank 1 exited with code 3"
    assert "rank 1 gives up" in result.log_tail
    assert child_pids_alive(run.pids) == []


def test_hang_is_killed_by_the_timeout(tmp_path):
    run = start(make_spec(timeout_s=1.5), tmp_path, "import time; time.sleep(600)")
    result = run.wait()
    assert result.status is TrialState.TIMEOUT, trials_seen([result])
    assert "timed out after 1.5 s" in result.error
    assert 1.5 <= result.duration_s < 15
    assert child_pids_alive(run.pids) == []


def test_rank_that_ignores_sigterm_is_killed(tmp_path):
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        "print('ignoring', flush=True); time.sleep(600)"
    )
    run = start(make_spec(world=1, timeout_s=1.5), tmp_path, code)
    result = run.wait()
    assert result.status is TrialState.TIMEOUT, trials_seen([result])
    assert child_pids_alive(run.pids) == []


def test_grandchildren_die_with_their_rank(tmp_path):
    code = (
        "import subprocess, sys;"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
        "open('grandchild.pid', 'w').write(str(p.pid))"
    )
    result = start(make_spec(world=1), tmp_path, code).wait()
    assert result.ok
    grandchild = int((tmp_path / "grandchild.pid").read_text())
    assert child_pids_alive([grandchild]) == []


def test_huge_log_keeps_only_a_bounded_tail(tmp_path):
    code = (
        "import sys\n"
        "line = 'x' * 1023 + '\\n'\n"
        "for _ in range(100 * 1024):\n"
        "    sys.stdout.write(line)\n"
        "print('the last words'); sys.exit(1)"
    )
    result = start(make_spec(world=1), tmp_path, code).wait()
    assert (tmp_path / "rank0.log").stat().st_size > 100 * 2**20
    assert result.status is TrialState.ERROR, trials_seen([result])
    assert len(result.log_tail.encode()) <= TAIL_BYTES
    assert result.log_tail.endswith("the last words")


@pytest.mark.parametrize(
    "message",
    [
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "RuntimeError: HIP error: hipErrorOutOfMemory",
        "RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate",
    ],
)
def test_out_of_memory_text_means_oom(tmp_path, message):
    code = (
        "import os, sys, time\n"
        "if os.environ['RANK'] == '1':\n"
        f"    print({message!r}); sys.exit(1)\n"
        "time.sleep(600)"
    )
    result = start(make_spec(), tmp_path, code, grace_s=0.5).wait()
    assert result.status is TrialState.OOM, trials_seen([result])
    assert result.error == "rank 1 ran out of memory"
    assert message in result.log_tail


def test_kill_cancels_a_running_node(tmp_path):
    run = start(make_spec(), tmp_path, "import time; time.sleep(600)")
    assert run.poll() is None
    result = run.kill()
    assert result.status is TrialState.INTERRUPTED, trials_seen([result])
    assert run.poll() is result
    assert child_pids_alive(run.pids) == []


def test_run_node_blocks_until_done(tmp_path):
    where = NodePlacement(make_spec(), 0, 1, "127.0.0.1", 1, tmp_path)
    result = run_node(where, command_plan(where, py("print('hi')")))
    assert result.ok and "hi" in result.log_tail


def test_run_local_fails_fast_when_one_node_fails(tmp_path):
    code = (
        "import os, sys, time\n"
        "if os.environ['RANK'] == '3':\n"
        "    sys.exit('node 1 broke')\n"
        "time.sleep(600)"
    )
    spec = make_spec(world=4, per_node=2, timeout_s=120)
    began = time.monotonic()
    result = run_local(spec, lambda where: command_plan(where, py(code)), tmp_path)
    assert time.monotonic() - began < 20
    assert result.status is TrialState.ERROR, trials_seen([result])
    assert "node 1 broke" in result.log_tail
    left = [p for p in os.listdir("/proc") if p.isdigit()]
    assert all(_cmdline(pid).find("node 1 broke") < 0 for pid in left)


def test_run_local_retries_a_rendezvous_port_taken_meanwhile(tmp_path):
    code = (
        "import os, sys\n"
        "first = not os.path.exists('tried')\n"
        "open('tried', 'a').close()\n"
        "if first:\n"
        "    sys.exit('DistNetworkError: ... code: -98, name: EADDRINUSE')\n"
        "print('port', os.environ['MASTER_PORT'])"
    )
    result = run_local(make_spec(world=1), lambda where: command_plan(where, py(code)), tmp_path)
    assert result.ok, result.error
    assert "port" in result.log_tail


def test_free_port_can_be_bound():
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("", port))


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""
