"""Each node of a trial gets a scratch directory of its own (``{trial_tmp}``,
``PARSEARCH_TRIAL_TMP`` and the variables named in ``PARSEARCH_TRIAL_TMP_VARS``, e.g.
MIOpen's cache on Frontier) that exists while its ranks run and is gone when they end,
whether the trial succeeded or failed; one an agent could not remove (killed) goes with
the next trial on the node.

Trials run a small Python program through the real node agent; the program reports what
it found and leaves a file in the directory, as a cache would.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from parsearch import tempdirs
from parsearch.config import AllocationSpec, ModelSpec, ParallelLayout
from parsearch.launch.placement import NodePlacement
from parsearch.launch.process import free_port
from parsearch.result import TrialState
from parsearch.trainers.command.trainer import run_node, validate_section
from parsearch.trial import TrialSpec

PROGRAM = """
import json, os, sys
scratch = sys.argv[1]
names = ("PARSEARCH_TRIAL_TMP", "MIOPEN_USER_DB_PATH", "MIOPEN_CUSTOM_CACHE_DIR")
with open(os.path.join(scratch, "cache.db"), "w") as cache:
    cache.write("kernels")
print("SEEN " + json.dumps({
    "dir": scratch, "isdir": os.path.isdir(scratch), "files": sorted(os.listdir(scratch)),
    "env": {name: os.environ.get(name) for name in names},
}))
print(json.dumps({"tokens_per_s": 1000.0}))
sys.exit(int(sys.argv[2]))
"""


@pytest.fixture
def tmpdir_root(tmp_path, monkeypatch) -> Path:
    """A TMPDIR of the test's own, and parsearch told to point MIOpen's cache at the
    trial's scratch directory (as jobs/frontier.sbatch does)."""
    root = tmp_path / "node-tmp"
    root.mkdir()
    monkeypatch.setenv("TMPDIR", str(root))
    monkeypatch.setattr(tempdirs.tempfile, "tempdir", None)  # re-read TMPDIR
    monkeypatch.setenv("PARSEARCH_TRIAL_TMP_VARS", "MIOPEN_USER_DB_PATH, MIOPEN_CUSTOM_CACHE_DIR")
    return root


def run(tmp_path: Path, exit_code: int, env: dict | None = None):
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    section = validate_section(
        {
            "kind": "command",
            "command": [sys.executable, str(program), "{trial_tmp}", str(exit_code)],
            "env": env or {},
            "parser": "json",
            "steps": 1,
            "warmup_steps": 0,
        },
        "test",
    )
    model = ModelSpec(num_layers=2, hidden_size=64, num_heads=4, vocab_size=100, seq_length=64)
    allocation = AllocationSpec(1, 1, 1 << 30, 1e12, device="cpu")
    layout = ParallelLayout(tp=1, pp=1, dp=1, mbs=1, gas=1)
    spec = TrialSpec("t7", model, layout, allocation, section, timeout_s=30)
    trial_dir = tmp_path / "trial"
    placement = NodePlacement(spec, 0, 1, "127.0.0.1", free_port("127.0.0.1"), trial_dir)
    result = run_node(placement)
    log = (trial_dir / "rank0.log").read_text()
    seen = json.loads(next(line[5:] for line in log.splitlines() if line.startswith("SEEN ")))
    return result, seen, placement.scratch_dir


@pytest.mark.parametrize("exit_code", [0, 3], ids=["ok", "failed"])
def test_the_scratch_directory_exists_during_the_trial_and_is_gone_after(
    tmp_path, tmpdir_root, exit_code
):
    result, seen, scratch = run(tmp_path, exit_code)
    assert result.status is (TrialState.OK if exit_code == 0 else TrialState.ERROR)
    assert seen["isdir"] and Path(seen["dir"]) == scratch
    assert scratch.parent == tmpdir_root and "t7-n0" in scratch.name
    assert "cache.db" in seen["files"]  # the program wrote into it
    assert seen["env"] == dict.fromkeys(
        ("PARSEARCH_TRIAL_TMP", "MIOPEN_USER_DB_PATH", "MIOPEN_CUSTOM_CACHE_DIR"), str(scratch)
    )
    assert not scratch.exists()
    assert list(tmpdir_root.iterdir()) == []  # nothing else left in TMPDIR either


def test_a_leftover_is_emptied_and_the_space_s_own_setting_wins(tmp_path, tmpdir_root):
    _, _, scratch = run(tmp_path, 0)
    scratch.mkdir()
    (scratch / "stale.db").write_text("an earlier attempt's")
    _, seen, _ = run(tmp_path, 0, env={"MIOPEN_USER_DB_PATH": "{trial_tmp}/miopen-db"})
    assert "stale.db" not in seen["files"]
    assert seen["env"]["MIOPEN_USER_DB_PATH"] == f"{scratch}/miopen-db"
    assert seen["env"]["MIOPEN_CUSTOM_CACHE_DIR"] == str(scratch)
    assert not scratch.exists()


def test_a_dead_agent_s_scratch_directory_goes_with_the_next_trial(tmp_path, tmpdir_root):
    left = subprocess.run(
        [sys.executable, "-c",
         "from parsearch.tempdirs import make_owned, owned_path\n"
         "print(make_owned(owned_path('trial', 'x-n0')))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert Path(left).is_dir()  # its agent exited without removing it (as kill -9 would)
    run(tmp_path, 0)
    assert not Path(left).exists()
