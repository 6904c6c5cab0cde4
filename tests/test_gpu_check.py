"""benchmarks/gpu_check.py, the estimate-against-this-device check, rehearsed on CPU with a
tiny GPT so it keeps working between the runs on a GPU machine."""

import json
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
            "200",
        ],
        capture_output=True,
        text=True,
        timeout=420,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
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
