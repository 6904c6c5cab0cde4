"""``{launch_dir}`` is where a campaign was created, on every resume: a resume from another
directory must not point every trial at a program that is not there (each would fail with
"can't open file", spend the budget and mark its layout failed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from parsearch.store import open_store

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
PROGRAM = 'import json, sys\nprint(json.dumps({"tokens_per_s": 1000.0 * int(sys.argv[1])}))\n'


def cli(cwd: Path, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "parsearch", *args], cwd=cwd, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert (done.returncode == 0) is ok, done.stdout + done.stderr
    return done


def test_a_resume_from_elsewhere_keeps_the_launch_dir_or_refuses_naming_both(tmp_path):
    checkout, elsewhere = tmp_path / "checkout", tmp_path / "elsewhere"
    checkout.mkdir()
    elsewhere.mkdir()
    (checkout / "train.py").write_text(PROGRAM)
    space = {
        "name": "moved",
        "model": {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "vocab_size": 128,
                  "seq_length": 32},
        "allocation": {"nodes": 1, "devices_per_node": 1, "device": "cpu",
                       "device_memory": "1GiB", "peak_tflops": 0.05},
        "search": {"tp": 1, "pp": 1, "mbs": [1, 2, 4], "gas": 1},
        "trainer": {"kind": "command", "parser": "json",
                    "command": [sys.executable, "{launch_dir}/train.py", "{mbs}"]},
    }  # fmt: skip
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    store = str(tmp_path / "c.db")
    cli(checkout, "run", str(tmp_path / "space.yaml"), "--store", store, "--budget", "1", "--quiet")
    resumed = cli(elsewhere, "resume", "--store", store, "--budget", "2", "--quiet")
    assert f"{{launch_dir}} stays {checkout}" in resumed.stderr
    with open_store(store, readonly=True) as opened:
        trials = opened.trials(opened.get_campaign().id)
        assert [trial.state.value for trial in trials] == ["ok", "ok"], [t.error for t in trials]
    (checkout / "train.py").rename(elsewhere / "train.py")
    checkout.rmdir()
    refused = cli(elsewhere, "resume", "--store", store, "--budget", "3", ok=False)
    assert f"created in {checkout}" in refused.stderr and str(elsewhere) in refused.stderr
    status = json.loads(cli(elsewhere, "status", "--store", store, "--format", "json").stdout)
    assert status["finished"] == 2  # nothing ran, nothing spent
