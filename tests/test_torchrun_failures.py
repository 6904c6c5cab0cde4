"""A program started by torchrun fails with its rank's own error, not torchrun's
``ChildFailedError``: torch's error files (``TORCHELASTIC_ERROR_FILE``, torchrun's
``--log-dir`` through ``PET_LOG_DIR``) written for scripts without ``@record`` too
(parsearch.launch.rank_site), read by parsearch.launch.rank_errors.

Real torchrun, two CPU workers over gloo-free scripts (they fail before any collective)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from trials_seen import trials_seen

from parsearch.config import AllocationSpec, ModelSpec, ParallelLayout
from parsearch.failures import failure_reason
from parsearch.launch.placement import NodePlacement
from parsearch.launch.process import free_port
from parsearch.result import TrialState
from parsearch.trainers.command.trainer import run_node, validate_section
from parsearch.trial import TrialSpec

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

# nanoGPT's style: module-level code, no main() to decorate with torch's @record.
SCRIPT = """
import os
rank = int(os.environ["RANK"])
if rank == 1:
    {failure}
import time
time.sleep(30)  # rank 0 waits, as it would in a collective, until torchrun stops it
"""
FAILURES = {
    "runtime": ('raise RuntimeError(f"shapes do not match on rank {rank}")',
                "rank 1: RuntimeError: shapes do not match on rank 1"),
    "assertion": ("assert rank == 0, 'batch not divisible'",
                  "rank 1: AssertionError: batch not divisible"),
}  # fmt: skip


def torchrun_spec(
    script: str, tmp_path: Path, *options: str, launch: str = "per_node"
) -> TrialSpec:
    trainer = validate_section(
        {
            "kind": "command",
            "launch": launch,
            "command": [
                sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                "{nproc_per_node}", "--nnodes", "{nnodes}", "--node-rank", "{node_rank}",
                "--master-addr", "{master_addr}", "--master-port", "{master_port}", *options,
                script,
            ],
            "parser": "json",
            "steps": 3,
            "warmup_steps": 1,
        },
        "test",
    )  # fmt: skip
    model = ModelSpec(num_layers=2, hidden_size=32, num_heads=2, vocab_size=64, seq_length=16)
    allocation = AllocationSpec(
        nodes=1, devices_per_node=2, device_memory_bytes=1 << 30, peak_flops_per_device=1e12,
        device="cpu",
    )  # fmt: skip
    layout = ParallelLayout(tp=1, pp=1, dp=2, mbs=1, gas=1)
    return TrialSpec("t1", model, layout, allocation, trainer=trainer, timeout_s=120.0)


def run(spec: TrialSpec, trial_dir: Path):
    port = free_port("127.0.0.1")
    return run_node(NodePlacement(spec, 0, 1, "127.0.0.1", port, trial_dir))


@pytest.mark.parametrize("kind", sorted(FAILURES))
def test_the_failed_workers_own_exception_is_the_reason(kind, tmp_path):
    code, expected = FAILURES[kind]
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(failure=code))
    result = run(torchrun_spec(str(script), tmp_path), tmp_path / "trial")
    assert result.status is TrialState.ERROR, trials_seen([result])
    assert result.error.startswith("node 0 exited with code 1: "), result.error
    assert expected in result.error
    assert "ChildFailedError" not in result.error
    reason = failure_reason(result.error, result.log_tail)  # what status and report show
    assert expected in reason and "ChildFailedError" not in reason


def test_a_script_torchrun_cannot_open_is_named(tmp_path):
    missing = tmp_path / "nanogpt" / "train.py"
    result = run(torchrun_spec(str(missing), tmp_path), tmp_path / "trial")
    assert result.status is TrialState.ERROR, trials_seen([result])
    assert f"can't open file {str(missing)!r}" in result.error, result.error
    assert "ChildFailedError" not in result.error


def test_a_rank_started_by_parsearch_records_its_own_error(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(failure=FAILURES["runtime"][0]))
    spec = torchrun_spec(str(script), tmp_path)
    spec.trainer = validate_section(
        {**spec.trainer, "launch": "per_rank", "command": [sys.executable, str(script)]}, "test"
    )
    result = run(spec, tmp_path / "trial")
    assert result.error == (
        "rank 1 exited with code 1: RuntimeError: shapes do not match on rank 1"
    ), result.error


def test_a_recorded_error_is_not_followed_by_the_launchers_exception():
    tail = "RuntimeError: boom\ntorch.distributed.elastic.multiprocessing.errors.ChildFailedError:"
    error = "node 0 exited with code 1: rank 1: RuntimeError: boom"
    assert failure_reason(error, tail) == error
    # The rank's own line, not torchrun's report of it (tests/fixtures/logs, issue 36).
    assert failure_reason("rank 0 exited with code 1", tail).endswith(": RuntimeError: boom")


def test_a_main_wrapped_in_torchs_record_is_read_from_torchs_own_file(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import os, time\n"
        "from torch.distributed.elastic.multiprocessing.errors import record\n"
        "@record\n"
        "def main():\n"
        "    if os.environ['RANK'] == '1':\n"
        "        raise ValueError('vocab size 50257 is not divisible by tp 2')\n"
        "    time.sleep(30)\n"
        "main()\n"
    )
    result = run(torchrun_spec(str(script), tmp_path), tmp_path / "trial")
    assert "rank 1: ValueError: vocab size 50257 is not divisible by tp 2" in result.error


def test_a_rank_whose_output_torchrun_filters_out_still_shows_its_traceback(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(failure=FAILURES["runtime"][0]))
    spec = torchrun_spec(str(script), tmp_path, "--local-ranks-filter=0")  # rank 0's output only
    result = run(spec, tmp_path / "trial")
    assert "rank 1: RuntimeError: shapes do not match on rank 1" in result.error
    # torchrun prints the worker's error file in its summary: the traceback is in the log.
    assert 'raise RuntimeError(f"shapes do not match' in result.log_tail


def test_a_traceback_missing_from_the_log_is_added_from_the_error_file():
    from parsearch.launch.process import _with_callstack
    from parsearch.launch.rank_errors import RankError

    stack = 'Traceback (most recent call last):\n  File "x.py"\nRuntimeError: boom'
    recorded = RankError(3, "RuntimeError: boom", stack, 0)
    tail = _with_callstack("launcher: worker 3 failed", recorded)
    assert tail.endswith(f"--- rank 3's traceback, from its error file ---\n{stack}")
    assert _with_callstack(f"...\n{stack}\n", recorded) == f"...\n{stack}\n"  # already there


def test_a_long_message_keeps_the_end_of_the_traceback_it_carries(tmp_path):
    """torch.multiprocessing.spawn's ProcessRaisedException carries the child's whole
    traceback in its message: the child's own error is its last line."""
    from parsearch.launch.rank_errors import MESSAGE_CHARS, read_error
    from parsearch.launch.rank_site import SITE_DIR

    frames = "".join(f'  File "/opt/train/layer{n}.py", line {n}, in forward\n' for n in range(40))
    message = (
        "-- Process 1 terminated with the following error:\n"
        f"Traceback (most recent call last):\n{frames}ValueError: bad shard 7 of 8"
    )
    script = tmp_path / "spawn.py"
    script.write_text(
        "class ProcessRaisedException(Exception): pass\n"
        f"raise ProcessRaisedException({message!r})\n"
    )
    error_file = tmp_path / "rank0.json"
    env = {"PYTHONPATH": str(SITE_DIR), "TORCHELASTIC_ERROR_FILE": str(error_file)}
    subprocess.run([sys.executable, str(script)], env=env, capture_output=True, check=False)
    described = read_error(error_file, 0).describe()
    assert len(described) <= MESSAGE_CHARS + len("rank 0: "), described
    assert described.startswith("rank 0: ProcessRaisedException: -- Process 1 terminated"), (
        described
    )
    assert described.endswith("ValueError: bad shard 7 of 8"), described
    reason = failure_reason(f"rank 0 exited with code 1: {described}", "")  # status, report
    assert reason.endswith("ValueError: bad shard 7 of 8"), reason
