"""What ``plan`` says about context parallelism on the shipped long-context spaces."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from parsearch.space import load_space, space_from_dict

SPACES = Path(__file__).parent.parent / "search_spaces"
LONG = SPACES / "llama3-8b-128k-h100.yaml"


def test_at_128k_tokens_plan_ranks_context_parallel_layouts_first():
    plan = load_space(LONG).plan()
    top = [layout for layout, _ in plan.feasible[:10]]
    assert all(layout.cp > 1 for layout in top), [layout.short() for layout in top]
    by_cp = {value: (rank, share) for value, rank, share in plan.best_by_value()["cp"]}
    rank, share = by_cp[1]
    assert rank > 10 and share < 0.9, by_cp
    assert by_cp[max(by_cp)][0] is not None, by_cp


def test_plan_says_why_no_cp_1_layout_fits_without_recompute():
    data = yaml.safe_load(LONG.read_text())
    data["search"]["recompute"] = ["none"]
    plan = space_from_dict(data, source=str(LONG)).plan()
    by_cp = dict((value, rank) for value, rank, _ in plan.best_by_value()["cp"])
    assert by_cp[1] is None and by_cp[16] is not None, by_cp
    (why,) = [reason for reason in plan.unreachable() if reason.startswith("cp1:")]
    assert "none of its" in why and "activations" in why and "against" in why, why


def test_plan_json_carries_the_best_of_each_value_and_what_is_out_of_reach(tmp_path):
    data = yaml.safe_load(LONG.read_text())
    data["search"]["recompute"] = ["none"]
    data["estimate"]["machine"] = str(Path(load_space(LONG).estimate.machine.path))
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump(data))
    result = subprocess.run(
        [sys.executable, "-m", "parsearch", "plan", str(path), "--format", "json"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    cp = {item["value"]: item["rank"] for item in document["best_by_value"]["cp"]}
    assert cp[1] is None and cp[16] == 1, cp
    assert any(reason.startswith("cp1:") for reason in document["unreachable"]), document
