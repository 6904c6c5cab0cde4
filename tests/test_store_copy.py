"""``parsearch store copy``: SQLite -> PostgreSQL -> SQLite gives back every row of every
table exactly (campaigns, settings, trials with their metrics, leases and generations); and
the command line runs, resumes and queries a campaign on a ``postgresql://`` store."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import pytest

from parsearch.cli import main
from parsearch.config import ParallelLayout
from parsearch.errors import StoreError
from parsearch.result import TrialResult, TrialState
from parsearch.store import open_store
from parsearch.store.copy import TABLES, copy_store

pytestmark = pytest.mark.postgres


def _fill(path: Path) -> None:
    """A store with something in every column a campaign can fill."""
    with open_store(path) as store:
        first = store.create_campaign(
            "gpt-175b",
            {"model": {"name": "gpt", "layers": 96}},
            space_path="spaces/gpt.yaml",
            seed=7,
            budget=40,
            backend="simulate",
            settings={"objective_metric": "tokens_per_s", "ratio": 0.1 + 0.2},
        )
        store.acquire_lease(first.id, "driver-a", stale_after_s=30.0)
        store.acquire_lease(first.id, "driver-a", stale_after_s=30.0)  # renewed
        done = store.add_trial(first.id, ParallelLayout(tp=2, pp=1, dp=4, mbs=1, gas=2))
        store.mark_running(done.id, ["n0", "n1"], attempt=1)
        metrics = {"tokens_per_s": 1234.5678901234567, "peak_mem_bytes": 3e9, "odd": math.nan}
        store.finish_trial(done.id, TrialResult(TrialState.OK, metrics, log_tail="é\n"), 1234.5)
        failed = store.add_trial(first.id, ParallelLayout(tp=1, pp=2, dp=4, mbs=2, gas=1))
        store.finish_trial(failed.id, TrialResult(TrialState.OOM, {}, error="CUDA OOM"), None)
        store.add_trial(
            first.id,
            ParallelLayout(tp=1, pp=1, dp=8, mbs=1, gas=1),
            predicted={"step_time_s": 0.25},
            proxy_dp=2,
            origin="initial",
        )
        store.update_campaign(first.id, stop_reason="SIGTERM", stopped_at=1.5, status="stopped")
        second = store.create_campaign("empty", {}, versions={"parsearch": "0.1"})
        store.acquire_lease(second.id, "driver-b", stale_after_s=5.0)
        store.release_lease(second.id, "driver-b")  # its generation stays on the campaign


def _rows(path: Path) -> dict[str, list[tuple[object, ...]]]:
    conn = sqlite3.connect(path)
    try:
        # repr keeps what == would blur: 1 vs 1.0, and NaN (never equal to itself).
        return {t: [repr(r) for r in conn.execute(f"SELECT * FROM {t} ORDER BY 1")] for t in TABLES}
    finally:
        conn.close()


def test_a_round_trip_through_postgresql_keeps_every_row(
    tmp_path: Path, postgres_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    original, back = tmp_path / "original.db", tmp_path / "back.db"
    _fill(original)
    assert main(["store", "copy", str(original), postgres_url]) == 0
    assert "copied 2 campaigns, 3 trials, 1 leases" in capsys.readouterr().out
    assert copy_store(postgres_url, str(back)) == {
        "schema_version": 5,
        "campaigns": 2,
        "trials": 3,
        "leases": 1,
    }
    assert _rows(back) == _rows(original)
    # The server's ids go on after the copied ones, and the copy reads as a store.
    with open_store(postgres_url) as store:
        campaign = store.get_campaign("gpt-175b")
        assert store.best(campaign.id).metrics["tokens_per_s"] == 1234.5678901234567
        added = store.add_trial(campaign.id, ParallelLayout(tp=4, pp=1, dp=2, mbs=1, gas=1))
        assert (added.id, added.number) == (4, 3)
        assert store.create_campaign("third", {}).id == 3


def test_a_copy_into_a_store_with_campaigns_writes_nothing(tmp_path: Path) -> None:
    source, target = tmp_path / "a.db", tmp_path / "b.db"
    _fill(source)
    with open_store(target) as store:
        store.create_campaign("mine", {})
    with pytest.raises(StoreError, match="already holds 1 campaigns"):
        copy_store(str(source), str(target))
    with open_store(target, readonly=True) as store:
        assert [c.name for c in store.list_campaigns()] == ["mine"]


def test_a_campaign_runs_and_is_queried_on_postgresql(
    postgres_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command line takes a URL wherever it takes a file: a simulate campaign, its
    resume to a larger budget, then a query command (read-only) over the same server."""
    space = str(Path(__file__).resolve().parents[1] / "search_spaces" / "gpt-175b-frontier.yaml")
    run = ["run", space, "--store", postgres_url, "--budget", "3", "--backend", "simulate"]
    assert main([*run, "--quiet"]) == 0
    assert "3/3 trials finished" in capsys.readouterr().out
    assert main(["resume", "--store", postgres_url, "--budget", "4", "--quiet"]) == 0
    assert "4/4 trials finished" in capsys.readouterr().out
    assert main(["status", "--store", postgres_url]) == 0
    assert "trials   4/4 finished" in capsys.readouterr().out
    with open_store(postgres_url, readonly=True) as store:
        trials = store.trials(store.get_campaign().id)
        assert [t.number for t in trials] == [0, 1, 2, 3]
        with pytest.raises(StoreError, match="read-only"):
            store.create_campaign("another", {})
