"""``parsearch plan`` end to end through the console entry point (real subprocess)."""

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
SPACES = sorted((ROOT / "search_spaces").glob("*.yaml"))


def _parsearch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "parsearch", *args], capture_output=True, text=True, cwd=ROOT
    )


@pytest.mark.parametrize("path", SPACES, ids=lambda p: p.stem)
def test_plan_prints_counts_and_table(path):
    """Every shipped space also lets its best layouts finish within the trial timeout."""
    result = _parsearch("plan", str(path))
    assert result.returncode == 0, result.stderr
    assert "total" in result.stdout and "feasible" in result.stdout
    assert "top" in result.stdout and "mem/rank" in result.stdout and "trial s" in result.stdout
    assert "warning" not in result.stderr, result.stderr


def test_plan_warns_when_the_best_layouts_would_outlast_the_trial_timeout(tmp_path):
    path = tmp_path / "short.yaml"
    text = (ROOT / "search_spaces" / "gpt-22b-frontier.yaml").read_text()
    path.write_text(text.replace("timeout: 1800", "timeout: 300"))
    result = _parsearch("plan", str(path))
    assert result.returncode == 0, result.stderr
    warning = result.stderr.strip()
    assert warning.startswith(f"warning: {path}: ") and "of the 10 best predicted" in warning
    assert "longer than trainer.timeout (300 s) for their 6 steps" in warning
    assert "Raise trainer.timeout to about" in warning


def test_plan_json_and_csv_agree():
    space = str(ROOT / "search_spaces" / "gpt-175b-frontier.yaml")
    data = json.loads(_parsearch("plan", space, "--format", "json", "--top", "5").stdout)
    counts = data["counts"]
    assert counts["total"] == counts["not_dividing"] + counts["predicted_oom"] + counts["feasible"]
    assert len(data["top"]) == 5
    rows = list(
        csv.DictReader(
            io.StringIO(_parsearch("plan", space, "--format", "csv", "--top", "5").stdout)
        )
    )
    assert [int(row["tp"]) for row in rows] == [row["tp"] for row in data["top"]]
    objectives = [row["tokens_per_s"] for row in data["top"]]
    assert objectives == sorted(objectives, reverse=True)


def test_bad_space_exits_2_with_one_paragraph_and_no_traceback(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text(
        (ROOT / "search_spaces" / "tiny-cpu.yaml").read_text().replace("num_heads:", "num_head:")
    )
    result = _parsearch("plan", str(path))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert str(path) in result.stderr and "model.num_head" in result.stderr
    assert "did you mean 'num_heads'" in result.stderr


def test_plan_prints_the_band_and_names_the_assumptions():
    """Issue 38, item 2: a profile that states its figures' uncertainty gives each shown
    layout a band of tokens/s and MFU, names which figures are assumptions, and says the
    calibrated estimate replaces the band after the first measured trial."""
    space = str(ROOT / "search_spaces" / "gpt-175b-frontier.yaml")
    table = _parsearch("plan", space, "--top", "3")
    assert table.returncode == 0, table.stderr
    assert "tokens/s band" in table.stdout and "MFU band" in table.stdout
    assert "assumptions: collective_latency" in table.stdout
    assert "single points: gemm, attention, node_links" in table.stdout
    assert "from the first measured trial on" in table.stdout
    data = json.loads(_parsearch("plan", space, "--format", "json", "--top", "3").stdout)
    assert data["machine"]["band"]["assumptions"] == ["collective_latency"]
    for row in data["top"]:
        assert row["mfu_low"] < row["mfu"] <= row["mfu_high"]
        assert row["tokens_per_s_low"] < row["tokens_per_s"] <= row["tokens_per_s_high"]
    rows = list(
        csv.DictReader(
            io.StringIO(_parsearch("plan", space, "--format", "csv", "--top", "3").stdout)
        )
    )
    assert [float(row["mfu_low"]) for row in rows] == [row["mfu_low"] for row in data["top"]]


def test_plan_without_stated_uncertainty_prints_no_band():
    tiny = _parsearch("plan", str(ROOT / "search_spaces" / "tiny-cpu.yaml"), "--top", "2")
    assert tiny.returncode == 0, tiny.stderr
    assert "band" not in tiny.stdout
