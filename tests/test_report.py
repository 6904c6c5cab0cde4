"""``parsearch report`` on real stores made by real (simulated) campaigns.

Every number a report shows must be one the store's own queries give, so the tables are
checked against ``top``, ``pareto`` and ``best``; the figures are checked to be real PNGs.
"""

from __future__ import annotations

import base64
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from parsearch.cli import main
from parsearch.report import (
    FIGURES,
    accuracy,
    convergence,
    load_report_data,
    pareto_front,
    top_table,
    tp_pp_grid,
    write_report,
)
from parsearch.result import TrialResult, TrialState
from parsearch.space import load_space
from parsearch.store import open_store

ROOT = Path(__file__).parent.parent
SPACES = ROOT / "search_spaces"
BIG = "gpt-175b-frontier"


def _parsearch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "parsearch", *args], capture_output=True, text=True, cwd=ROOT
    )


@pytest.fixture(scope="module")
def store_path(tmp_path_factory) -> Path:
    """Two campaigns: a random one at 175B scale (OOMs, infeasible points, timeouts) and the
    default seeded search on the tiny space."""
    path = tmp_path_factory.mktemp("report") / "campaigns.db"
    for space, extra in (
        (BIG, ["--budget", "40", "--strategy", "random", "--keep-predicted-oom", "--seed", "3"]),
        ("tiny-cpu", ["--budget", "12"]),
    ):
        result = _parsearch(
            "run", str(SPACES / f"{space}.yaml"), "--store", str(path), "--backend", "simulate",
            "--quiet", *extra,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
    return path


@pytest.fixture(scope="module")
def big(store_path):
    return load_report_data(store_path, BIG)


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


def test_cli_writes_self_contained_page_and_pngs(store_path, tmp_path):
    out = tmp_path / "report"
    result = _parsearch("report", "--store", str(store_path), "--name", BIG, "--out", str(out))
    assert result.returncode == 0, result.stderr
    page = out / "index.html"
    assert result.stdout.strip() == str(page)
    html = page.read_text()
    embedded = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    assert len(embedded) == len(FIGURES) == 4
    for name, encoded in zip(FIGURES, embedded, strict=True):
        png = (out / f"{name}.png").read_bytes()
        assert base64.b64decode(encoded) == png
        width, height = _png_size(png)
        assert width >= 600 and height >= 400
    with open_store(store_path, readonly=True) as store:
        campaign = store.get_campaign(BIG)
        best = store.best(campaign.id)
    assert f"Trial #{best.number}: <b>{best.layout.short()}</b>" in html
    assert "--tensor-model-parallel-size" in html  # the best layout's exports


def test_latest_campaign_is_the_default_and_unknown_name_is_a_clear_error(store_path, tmp_path):
    assert load_report_data(store_path).campaign.name == "tiny-cpu"
    code = main(["report", "--store", str(store_path), "--name", "nope", "--out", str(tmp_path)])
    assert code != 0
    assert not (tmp_path / "index.html").exists()


def test_tables_are_the_store_queries(big, store_path):
    with open_store(store_path, readonly=True) as store:
        campaign = store.get_campaign(BIG)
        top = store.top(campaign.id, 5)
        front = store.pareto(campaign.id)
        best = store.best(campaign.id)
        counts = store.counts(campaign.id)
    table = top_table(big, 5)
    assert list(table["trial"]) == [record.number for record in top]
    assert list(table["tokens_per_s"]) == pytest.approx([record.objective for record in top])
    assert set(pareto_front(big)["number"]) == {record.number for record in front}
    history = convergence(big)
    assert len(history) == sum(n for state, n in counts.items() if state.finished)
    assert history["best_so_far"].iloc[-1] == pytest.approx(best.objective)
    assert history["best_so_far"].dropna().is_monotonic_increasing


def test_heatmap_cells_agree_with_trials_and_rules(big):
    grid = tp_pp_grid(big)
    space = big.space
    assert len(grid) == len(space.dimensions["tp"]) * len(space.dimensions["pp"])
    assert grid["trials"].sum() == len(big.trials)
    trials = big.trials
    for _, cell in grid.iterrows():
        here = trials[(trials["tp"] == cell["tp"]) & (trials["pp"] == cell["pp"])]
        ok = here[here["state"] == "ok"]
        assert (cell["kind"] == "ok") == (not ok.empty)
        if cell["kind"] == "ok":
            assert cell["best"] == pytest.approx(ok["objective"].max())
        if cell["kind"] == "oom":
            assert (here["state"] == "oom").any()
    # 96 layers cannot split into 64 stages: that whole row is invalid by the rules.
    assert set(grid[grid["pp"] == 64]["kind"]) == {"no_divide"}
    assert {"ok", "oom", "no_divide"} <= set(grid["kind"])


def test_accuracy_ratios(big):
    result = accuracy(big, "tokens_per_s")
    ok = big.trials[big.trials["state"] == "ok"]
    ratios = (ok["tokens_per_s"] / ok["predicted.tokens_per_s"]).sort_values()
    assert result.n == len(ok)
    assert result.median_ratio == pytest.approx(ratios.median())
    assert -1 <= result.spearman <= 1
    assert f"n = {len(ok)}" in result.caption()


def _space_dict(name: str) -> dict:
    return yaml.safe_load((SPACES / f"{name}.yaml").read_text())


def test_report_of_a_campaign_with_no_result_yet(tmp_path):
    path = tmp_path / "empty.db"
    with open_store(path) as store:
        store.create_campaign("fresh", _space_dict("tiny-cpu"))
    page = write_report(load_report_data(path), tmp_path / "out")
    html = page.read_text()
    assert "No trial has finished ok yet" in html
    assert len(re.findall("data:image/png;base64,", html)) == 4


def test_report_of_a_campaign_that_only_failed(tmp_path):
    path = tmp_path / "failed.db"
    space = load_space(SPACES / "tiny-cpu.yaml")
    layouts = [layout for layout, _ in space.plan().feasible[:3]]
    with open_store(path) as store:
        campaign = store.create_campaign("failing", _space_dict("tiny-cpu"))
        states = (TrialState.OOM, TrialState.TIMEOUT, TrialState.ERROR)
        for layout, state in zip(layouts, states, strict=True):
            record = store.add_trial(campaign.id, layout)
            store.finish_trial(record.id, TrialResult(state, error="boom"), None)
    data = load_report_data(path)
    assert convergence(data)["best_so_far"].isna().all()
    assert pareto_front(data).empty
    assert accuracy(data, "peak_mem_bytes").n == 0
    grid = tp_pp_grid(data)
    assert "ok" not in set(grid["kind"]) and "oom" in set(grid["kind"])
    assert "No trial has finished ok yet" in write_report(data, tmp_path / "out").read_text()


def test_unwritable_output_is_a_clear_error(store_path, tmp_path, capsys):
    blocker = tmp_path / "taken"
    blocker.write_text("a file where the report directory should go")
    code = main(["report", "--store", str(store_path), "--out", str(blocker)])
    assert code == 2  # a usage error, found before the figures are drawn
    assert f"--out {blocker}: is a file, not a directory" in capsys.readouterr().err
