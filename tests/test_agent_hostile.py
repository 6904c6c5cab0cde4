"""What tests/test_agent.py (hostile ranks: early exit, hang, SIGTERM ignored, 100 MB of log)
and tests/test_local_backend.py leave out, with plain-Python ranks through the local backend:
concurrent trials never share a rendezvous port, and a timed-out trial leaves nothing in
the process table, not even a grandchild of a rank."""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path

import pytest
from trials_seen import trials_seen

from parsearch.backends import create_backend
from parsearch.config import ParallelLayout
from parsearch.result import TrialState
from parsearch.space import space_from_dict
from parsearch.trial import TrialSpec

pytestmark = pytest.mark.multiprocess

# A rank: records its rendezvous port, starts a grandchild that sleeps, then reports a
# summary (the json parser's format) or, in "hang" mode, never ends.
RANK = """
import json, os, subprocess, sys, time
mode, marker = sys.argv[1], sys.argv[2]
with open(f"port-{os.environ['RANK']}.json", "w") as out:
    json.dump({"port": int(os.environ["MASTER_PORT"]), "pid": os.getpid()}, out)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", marker])
time.sleep(1.0)  # overlap with the other trial
while mode == "hang":
    time.sleep(1)
print(json.dumps({"tokens_per_s": 1.0}))
"""


def make_space(tmp_path: Path, mode: str, marker: str, timeout: float):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    return space_from_dict(
        {
            "model": {
                "num_layers": 2,
                "hidden_size": 8,
                "num_heads": 2,
                "vocab_size": 16,
                "seq_length": 4,
            },
            "allocation": {
                "nodes": 1,
                "devices_per_node": 2,
                "device": "cpu",
                "device_memory": "1GiB",
                "peak_tflops": 1,
            },
            "search": {"tp": [1], "pp": [1], "mbs": [1]},
            "global_batch": 2,
            "trainer": {
                "kind": "command",
                "command": ["{python}", "{script}", mode, marker],
                "vars": {"python": sys.executable, "script": str(script)},
                "steps": 2,
                "warmup_steps": 1,
                "timeout": timeout,
            },
        }
    )


def spec(space, trial_id: str) -> TrialSpec:
    layout = ParallelLayout(tp=1, pp=1, dp=2, mbs=1, gas=1)
    timeout = float(space.trainer["timeout"])
    return TrialSpec(trial_id, space.model, layout, space.allocation, space.trainer, timeout)


def run_all(backend, specs: list[TrialSpec]) -> dict:
    for item in specs:
        backend.submit(item)
    done, deadline = {}, time.monotonic() + 60
    while len(done) < len(specs) and time.monotonic() < deadline:
        done.update((f.trial_id, f.result) for f in backend.poll(0.5))
    return done


def processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.append(int(entry))
    return found


def test_concurrent_trials_get_their_own_rendezvous_port(tmp_path):
    marker = f"parsearch-test-{uuid.uuid4().hex}"
    space = make_space(tmp_path, "ok", marker, timeout=30)
    backend = create_backend("local", space, slots=2, options={"workdir": str(tmp_path / "w")})
    try:
        results = run_all(backend, [spec(space, "a"), spec(space, "b")])
    finally:
        backend.close()
    assert {r.status for r in results.values()} == {TrialState.OK}
    ports = {
        trial: {json.loads(p.read_text())["port"] for p in (tmp_path / "w" / trial).glob("port-*")}
        for trial in ("a", "b")
    }
    assert len(ports["a"]) == len(ports["b"]) == 1  # one rendezvous per trial
    assert ports["a"] != ports["b"]
    assert processes_with(marker) == []


def test_a_timed_out_trial_leaves_no_process(tmp_path):
    marker = f"parsearch-test-{uuid.uuid4().hex}"
    space = make_space(tmp_path, "hang", marker, timeout=2)
    backend = create_backend("local", space, options={"workdir": str(tmp_path / "w")})
    try:
        (result,) = run_all(backend, [spec(space, "hang")]).values()
    finally:
        backend.close()
    assert result.status is TrialState.TIMEOUT, trials_seen([result])
    assert processes_with(marker) == []
