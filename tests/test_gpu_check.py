"""benchmarks/gpu_check.py, the estimate-against-this-device check, rehearsed on CPU with a
tiny GPT so it keeps working between the runs on a GPU machine: the built-in trainer's
layouts, then the Hugging Face Trainer and DeepSpeed examples (a layout that fits and one
over the memory wall each)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


@pytest.mark.slow
def test_the_gpu_check_probes_trains_and_compares_on_cpu(tmp_path):
    out = tmp_path / "check"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_check.py"),
            "--tiny",
            "--out",
            str(out),
            "--max-layouts",
            "2",
            "--budget",
            "600",
            "--trainer-budget",
            "420",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        # Where DeepSpeed's CPU op, built once by scripts/test.sh, is cached.
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
        | {key: os.environ[key] for key in ("HOME", "TORCH_EXTENSIONS_DIR") if key in os.environ},
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["profile_probed"]  # the probe ran and its profile loaded
    (row, *_) = report["rows"]
    assert row["state"] == "ok" and row["measured"]["tokens_per_s"] > 0
    for estimate in ("defaults", "probed"):
        assert row[estimate]["tokens_per_s"] > 0 and row[estimate]["peak_mem_bytes"] > 0
    assert "Spearman" in done.stdout and "| tp1 pp1 dp1" in done.stdout
    # The command trainers: each case ends as a person would call it, with what it printed
    # parsed and the agent's own memory measure stored.
    trainers = {(row["trainer"], row["case"]): row for row in report["trainers"]}
    assert set(trainers) == {
        (trainer, case)
        for trainer in ("hf-trainer", "deepspeed")
        for case in ("fits", "out of memory")
    }, trainers
    for (_, case), row in trainers.items():
        assert row["state"] == row["expected"], row
        assert row["figures"]["tokens_per_s"] > 0 and row["figures"]["measured_peak_rss_bytes"] > 0
        assert (case == "out of memory") == ("exceeds memory_cap" in row["error"]), row
    assert "| hf-trainer | fits | tp1 pp1 mbs1 gas1 | ok (ok) |" in done.stdout
