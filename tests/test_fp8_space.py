"""The shipped FP8 space end to end on the simulate backend: it plans both precisions,
searches them, and exports the FP8 layout it found with Megatron's FP8 flags."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SPACE = Path(__file__).parent.parent / "search_spaces" / "llama3-70b-h100-fp8.yaml"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "parsearch", *args], capture_output=True, text=True, timeout=300
    )


@pytest.mark.e2e
def test_the_fp8_space_plans_searches_and_exports(tmp_path):
    plan = cli("plan", str(SPACE), "--format", "json")
    assert plan.returncode == 0, plan.stderr
    values = {item["value"] for item in json.loads(plan.stdout)["best_by_value"]["precision"]}
    assert values == {"auto", "fp8"}, values
    store = str(tmp_path / "fp8.db")
    run = cli("run", str(SPACE), "--store", store, "--backend", "simulate", "--budget", "4",
              "--quiet")  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    best = json.loads(cli("best", "--store", store, "--format", "json").stdout)
    assert best["layout"]["precision"] == "fp8", best["layout"]
    flags = cli("best", "--store", store, "--format", "megatron")
    assert "--fp8-format hybrid" in flags.stdout and "--fp8-recipe delayed" in flags.stdout, (
        flags.stdout + flags.stderr
    )
