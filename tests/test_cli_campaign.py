"""``parsearch status | best | top | export`` and ``results()`` on a real store."""

import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from parsearch.campaign.session import CampaignSettings, start_campaign
from parsearch.cli import main
from parsearch.query import results
from parsearch.store import open_store

ROOT = Path(__file__).parent.parent
GPT175 = ROOT / "search_spaces" / "gpt-175b-frontier.yaml"
TINY = ROOT / "search_spaces" / "tiny-cpu.yaml"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Two campaigns: a 175B rehearsal where some trials OOM, and one where all do."""
    db = tmp_path_factory.mktemp("cli") / "c.db"
    settings = CampaignSettings(
        backend="simulate", slots=4, backend_options={"mem_factor": "1.1", "seed": "3"}
    )
    start_campaign(GPT175, db, name="rehearsal", budget=30, settings=settings)
    doomed = CampaignSettings(backend="simulate", backend_options={"mem_factor": "100"})
    start_campaign(TINY, db, name="doomed", budget=3, settings=doomed)
    return db


def _cli(capsys, *args):
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_status_text_and_json(store, capsys):
    code, out, _ = _cli(capsys, "status", "--store", str(store), "--name", "rehearsal")
    assert code == 0
    assert "campaign 'rehearsal' (finished" in out and "30/30 finished (100%)" in out
    assert "best tokens_per_s" in out and "other campaigns in this store: doomed" in out
    code, out, _ = _cli(capsys, "status", "--store", str(store), "--format", "json")
    data = json.loads(out)
    assert data["campaign"] == "doomed", "without --name: the newest campaign"
    assert data["states"]["oom"] == 3 and data["best"] is None and data["eta_s"] is None


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_best_is_machine_readable(store, capsys, fmt):
    code, out, _ = _cli(
        capsys, "best", "--store", str(store), "--name", "rehearsal", "--format", fmt
    )
    assert code == 0
    data = json.loads(out) if fmt == "json" else yaml.safe_load(out)
    frame = results(store, "rehearsal")
    ok = frame[frame.state == "ok"]
    assert data["objective"]["value"] == pytest.approx(ok.objective.max())
    assert data["layout"]["tp"] * data["layout"]["pp"] * data["layout"]["dp"] == 1024
    assert data["metrics"]["tokens_per_s"] == pytest.approx(data["objective"]["value"])
    assert data["predicted"]["fits"] is True


def test_best_under_a_memory_cap(store, capsys):
    frame = results(store, "rehearsal")
    ok = frame[frame.state == "ok"]
    cap = int(ok.peak_mem_bytes.median())
    code, out, _ = _cli(
        capsys,
        "best",
        "--store",
        str(store),
        "--name",
        "rehearsal",
        "--max-mem",
        str(cap),
        "--format",
        "json",
    )
    assert code == 0
    data = json.loads(out)
    assert data["metrics"]["peak_mem_bytes"] <= cap
    assert data["objective"]["value"] == pytest.approx(ok[ok.peak_mem_bytes <= cap].objective.max())
    code, out, _ = _cli(capsys, "best", "--store", str(store), "--name", "rehearsal")
    assert "best of campaign 'rehearsal'" in out and "(predicted" in out


def test_best_without_a_success_is_an_error(store, capsys):
    code, _, err = _cli(capsys, "best", "--store", str(store), "--name", "doomed")
    assert code == 1 and "has no successful trial yet" in err
    with pytest.raises(SystemExit) as exit_info:
        main(["best", "--store", str(store), "--max-mem", "lots"])
    assert exit_info.value.code == 2 and "expected a size" in capsys.readouterr().err


def test_top_k_in_every_format(store, capsys):
    args = ("top", "--store", str(store), "--name", "rehearsal", "-k", "5")
    code, out, _ = _cli(capsys, *args)
    assert code == 0 and "top 5 of campaign 'rehearsal'" in out
    _, out, _ = _cli(capsys, *args, "--format", "json")
    ranked = json.loads(out)
    values = [row["objective"]["value"] for row in ranked]
    assert len(values) == 5 and values == sorted(values, reverse=True)
    _, out, _ = _cli(capsys, *args, "--format", "csv")
    rows = list(csv.DictReader(out.splitlines()))
    assert [float(r["objective"]) for r in rows] == pytest.approx(values)
    assert all(r["predicted_objective"] for r in rows)


def test_export_csv_matches_results(store, capsys, tmp_path):
    out_path = tmp_path / "results.csv"
    code, out, _ = _cli(
        capsys, "export", "--store", str(store), "--name", "rehearsal", "--out", str(out_path)
    )
    assert code == 0 and "wrote 30 trials" in out
    exported = pd.read_csv(out_path)
    frame = results(store, "rehearsal")
    assert len(exported) == len(frame) == 30
    assert set(exported.key) == set(frame.key)
    assert "predicted.tokens_per_s" in exported.columns
    code, _, err = _cli(capsys, "export", "--store", str(store), "--out", str(tmp_path / "x.xls"))
    assert code == 2 and ".csv" in err  # a usage error


def test_query_errors_name_the_problem(tmp_path, capsys, store):
    code, _, err = _cli(capsys, "status", "--store", str(tmp_path / "none.db"))
    assert code == 2 and "no store at" in err
    code, _, err = _cli(capsys, "top", "--store", str(store), "--name", "nope")
    assert code == 2 and "no campaign 'nope'" in err and "rehearsal" in err


@pytest.mark.e2e
def test_queries_work_while_a_campaign_runs(tmp_path):
    db = tmp_path / "live.db"
    driver = subprocess.Popen(
        [sys.executable, "-m", "parsearch", "run", str(GPT175), "--store", str(db),
         "--backend", "simulate", "--budget", "40", "--slots", "2",
         "--backend-opt", "delay=0.5", "--quiet"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            status = subprocess.run(
                [sys.executable, "-m", "parsearch", "status", "--store", str(db), "--format",
                 "json"],
                capture_output=True, text=True, cwd=ROOT,
            )  # fmt: skip
            if status.returncode == 0 and json.loads(status.stdout)["best"] is not None:
                break
            assert time.monotonic() < deadline, status.stderr
            time.sleep(0.3)
        data = json.loads(status.stdout)
        assert data["status"] == "running" and 0 < data["finished"] < 40
        best = subprocess.run(
            [sys.executable, "-m", "parsearch", "best", "--store", str(db), "--format", "json"],
            capture_output=True, text=True, cwd=ROOT,
        )  # fmt: skip
        assert best.returncode == 0, best.stderr
        assert json.loads(best.stdout)["state"] == "ok"
    finally:
        driver.terminate()
        driver.communicate(timeout=30)
    assert driver.returncode == 0


def test_run_warns_of_a_trial_timeout_too_short_for_the_best_layouts(tmp_path, capsys):
    space = tmp_path / "short.yaml"
    space.write_text(GPT175.read_text().replace("timeout: 1200", "timeout: 100"))
    code, out, err = _cli(
        capsys, "run", str(space), "--store", str(tmp_path / "c.db"), "--backend", "simulate",
        "--budget", "3", "--quiet",
    )  # fmt: skip
    assert code == 0 and "budget reached" in out
    assert err.startswith(f"warning: {space}: ") and "longer than trainer.timeout (100 s)" in err


def _run_resume(capsys, space, db, *extra):
    return _cli(
        capsys, "run", str(space), "--store", str(db), "--backend", "simulate", "--quiet",
        "--resume", *extra,
    )  # fmt: skip


def test_run_resume_starts_a_campaign_then_continues_it(tmp_path, capsys):
    """One command for every job of a chain: the first creates, the next ones continue."""
    db = tmp_path / "c.db"
    code, out, _ = _run_resume(capsys, TINY, db, "--budget", "3")
    assert code == 0 and "3/3 trials finished" in out
    code, out, _ = _run_resume(capsys, TINY, db)  # no --budget: the stored one
    assert code == 0 and "3/3 trials finished" in out
    code, out, err = _run_resume(capsys, TINY, db, "--budget", "5", "--slots", "2")
    assert code == 0 and "5/5 trials finished" in out and "warning" not in err
    frame = results(db)
    assert len(frame) == 5 and frame["key"].is_unique and sorted(frame["number"]) == [0, 1, 2, 3, 4]
    code, _, err = _cli(capsys, "run", str(TINY), "--store", str(db), "--backend", "simulate")
    assert code == 1 and "already exists" in err and "run --resume" in err


def test_run_resume_keeps_the_stored_space_and_says_so(tmp_path, capsys):
    db = tmp_path / "c.db"
    assert _run_resume(capsys, TINY, db, "--budget", "2")[0] == 0
    edited = tmp_path / "tiny-cpu.yaml"
    edited.write_text(TINY.read_text().replace("steps: 4", "steps: 5"))
    code, out, err = _run_resume(capsys, edited, db, "--name", "tiny-cpu", "--budget", "3")
    assert code == 0 and "3/3 trials finished" in out
    assert f"warning: {edited} differs from the space campaign 'tiny-cpu'" in err


def test_run_resume_recovers_a_store_a_killed_driver_left_mid_write(tmp_path, capsys):
    """A driver killed inside a transaction leaves a hot journal, which read-only commands
    cannot roll back (``status`` refuses the store); ``run --resume`` opens it to write."""
    db = tmp_path / "c.db"
    assert _run_resume(capsys, TINY, db, "--budget", "2")[0] == 0
    crash = subprocess.run(
        [sys.executable, "-c", (
            "import os, sqlite3\n"
            f"raw = sqlite3.connect({str(db)!r}, isolation_level=None)\n"
            "raw.execute('PRAGMA cache_size = 1')\n"
            "raw.execute('BEGIN IMMEDIATE')\n"
            "raw.execute(\"UPDATE trials SET state = 'error', log_tail = zeroblob(100000)\")\n"
            "os._exit(1)\n"
        )], timeout=60,
    )  # fmt: skip
    assert crash.returncode == 1 and db.with_name("c.db-journal").exists()
    code, _, err = _cli(capsys, "status", "--store", str(db))
    assert code == 1 and "unfinished write" in err
    code, out, _ = _run_resume(capsys, TINY, db, "--budget", "4")
    assert code == 0 and "4/4 trials finished (ok 4)" in out


def test_a_campaign_another_driver_holds_exits_75_to_be_retried(tmp_path, capsys):
    db = tmp_path / "c.db"
    assert _run_resume(capsys, TINY, db, "--budget", "2")[0] == 0
    with open_store(db) as store:
        store.acquire_lease(store.get_campaign().id, "live-driver", stale_after_s=60.0)
    code, _, err = _cli(capsys, "resume", "--store", str(db), "--budget", "3", "--quiet")
    assert code == 75 and "being run by another parsearch driver" in err
    code, _, err = _run_resume(capsys, TINY, db, "--budget", "3")
    assert code == 75 and "being run by another parsearch driver" in err


def test_run_settle_ends_early_with_the_same_best_and_resume_keeps_it(tmp_path, capsys):
    """tiny-cpu on the simulate backend: tried to exhaustion (34 layouts), and with
    ``--settle``, which ends once no untried layout is expected to beat the best."""
    common = ["--backend", "simulate", "--budget", "100", "--quiet"]
    code, out, _ = _cli(capsys, "run", str(TINY), "--store", str(tmp_path / "all.db"), *common)
    assert code == 0 and "no untried layout left; 34/100" in out
    settled_db = str(tmp_path / "settled.db")
    code, out, _ = _cli(capsys, "run", str(TINY), "--store", settled_db, "--settle", *common)
    assert code == 0 and "settled: no untried layout is expected to beat the best" in out
    with open_store(tmp_path / "all.db", readonly=True) as store:
        every = store.trials(store.get_campaign().id)
    with open_store(settled_db, readonly=True) as store:
        campaign = store.get_campaign()
        settled = store.trials(campaign.id)
        assert campaign.settings["settle"] is True
    assert len(settled) < len(every)
    best = max(t.objective or 0 for t in every)
    assert max(t.objective or 0 for t in settled) == best
    code, out, _ = _cli(capsys, "resume", "--store", settled_db, "--quiet")
    assert (
        code == 0
        and f"settled: no untried layout is expected to beat the best; {len(settled)}/100" in out
    )
