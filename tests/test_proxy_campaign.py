"""Proxy campaigns for real: ``parsearch run --proxy`` processes on the simulate backend
(kill -9 in the proxy phase, then resume), the local backend's real trainer processes two
proxies at a time (``--slots 2``), and what every reader says of a proxy's figures.
The mpi campaign is in tests/test_mpi_backend.py."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from store_polling import campaign_trials
from trials_seen import trials_seen

from parsearch.cli import main
from parsearch.config import ParallelLayout
from parsearch.result import TrialResult, TrialState
from parsearch.store import TrialRecord, open_store

ROOT = Path(__file__).parent.parent
GPT175 = str(ROOT / "search_spaces" / "gpt-175b-frontier.yaml")
LEASE_S = 1.5


def _parsearch(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "parsearch", *args, "--quiet", "--lease-timeout", str(LEASE_S)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _overlap(a: TrialRecord, b: TrialRecord) -> bool:
    assert a.started_at and a.finished_at and b.started_at and b.finished_at
    return a.started_at < b.finished_at and b.started_at < a.finished_at


def _cli(capsys, *args: str) -> str:
    assert main(list(args)) == 0
    return capsys.readouterr().out


@pytest.mark.e2e
@pytest.mark.slow
def test_kill_9_in_the_proxy_phase_then_resume_loses_and_repeats_nothing(tmp_path, capsys):
    db = tmp_path / "c.db"
    budget = 10
    run = _parsearch(
        "run", GPT175, "--store", str(db), "--backend", "simulate", "--proxy",
        "--budget", str(budget), "--backend-opt", "delay=0.3", "--backend-opt", "jitter=0.5",
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while True:  # kill it once proxies have finished and others run
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()
        trials = campaign_trials(db)
        done = [t for t in trials if t.state.finished]
        if len(done) >= 3 and any(t.state is TrialState.RUNNING for t in trials):
            break
        time.sleep(0.05)
    run.send_signal(signal.SIGKILL)
    run.wait()
    before = campaign_trials(db, recover=True)
    kept = {t.number: t for t in before if t.state.finished}
    cut = {t.number: t for t in before if not t.state.finished}
    assert kept[0].proxy_dp is None and kept[0].origin != "confirm"  # the opening, at full scale
    assert cut and all(t.proxy_dp is not None for t in kept.values() if t.number)  # mid proxies

    time.sleep(LEASE_S)
    resume = _parsearch("resume", "--store", str(db))
    out, err = resume.communicate(timeout=180)
    assert resume.returncode == 0, err
    assert "budget reached" in out

    after = campaign_trials(db)
    assert len(after) == budget and all(t.state is TrialState.OK for t in after), trials_seen(after)
    assert len({t.key for t in after}) == budget, "no trial twice"
    for number, trial in kept.items():
        assert after[number] == trial, f"trial {number} changed"
    assert any(t.proxy_dp for t in after[len(before) :]), "resume kept proxy mode"
    for number, trial in cut.items():  # re-run as they were: same layout, same size
        assert (after[number].key, after[number].proxy_dp) == (trial.key, trial.proxy_dp)
        assert after[number].attempt == trial.attempt + 1
    proxies = [t for t in after if t.proxy_dp is not None]
    opening, *full = [t for t in after if t.proxy_dp is None]
    assert opening.number == 0  # then confirmations, and the budget's last trial at full scale
    assert all(t.origin == "confirm" or t.number == budget - 1 for t in full)
    confirmed = {t.layout.key() for t in full if t.origin == "confirm"}
    assert confirmed <= {t.layout.key() for t in proxies}
    assert any(_overlap(a, b) for a in proxies for b in proxies if a.number < b.number)
    for proxy in proxies:  # what it measured, next to what it predicts at full scale
        measured = proxy.metrics["fidelity"]["measured"]
        assert proxy.metrics["fidelity"]["dp"] == proxy.proxy_dp < proxy.layout.dp
        assert proxy.metrics["fidelity"]["nodes"] < 128
        assert measured["tokens_per_s"] < proxy.metrics["tokens_per_s"]

    with open_store(db, readonly=True) as store:
        campaign = store.list_campaigns()[0]
        best = store.best(campaign.id)
    assert campaign.settings["proxy"] is True
    assert best is not None and best.proxy_dp is None  # measured at full scale
    store_args = ("--store", str(db))
    assert "fidelity measured at full scale" in _cli(capsys, "best", *store_args)
    status = json.loads(_cli(capsys, "status", *store_args, "--format", "json"))
    assert status["best"]["fidelity"] == "full" and status["best"]["trial"] == best.number
    hours = status["node_hours"]  # apart: a proxy is a trial of the budget on fewer nodes
    assert hours["full"] > 0 and hours["proxy"] > 0
    assert "in proxies (each proxy is a trial of the budget)" in _cli(capsys, "status", *store_args)
    top = _cli(capsys, "top", *store_args, "-k", str(budget))
    assert "proxy dp" in top and "full" in top
    ranked = json.loads(_cli(capsys, "top", *store_args, "-k", "50", "--format", "json"))
    assert {row["fidelity"] for row in ranked} == {"full", "proxy"}
    shown = _cli(capsys, "show", *store_args, "--trial", str(proxies[0].number))
    assert f"predicted from a proxy at dp{proxies[0].proxy_dp}" in shown
    _cli(capsys, "export", *store_args, "--out", str(tmp_path / "t.csv"))
    with open(tmp_path / "t.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted({row["fidelity"] for row in rows}) == ["full", "proxy"]
    assert all(row["fidelity.measured.tokens_per_s"] for row in rows if row["proxy_dp"])


def test_best_says_its_figures_are_a_prediction_when_no_full_scale_trial_succeeded(
    tmp_path, capsys
):
    db = tmp_path / "p.db"
    layout = ParallelLayout(tp=8, pp=16, dp=8, mbs=1, gas=128, zero_stage=1)
    with open_store(db) as store:
        space = yaml.safe_load(Path(GPT175).read_text())
        campaign = store.create_campaign(
            "cut", space, seed=0, budget=1, backend="simulate", settings={"proxy": True}
        )
        trial = store.add_trial(campaign.id, layout, proxy_dp=2)
        assert trial.key != layout.key() and trial.run_layout.dp == 2
        fidelity = {"kind": "proxy", "dp": 2, "nodes": 32, "measured": {"tokens_per_s": 1.0}}
        metrics = {"tokens_per_s": 4.0, "fidelity": fidelity}
        store.finish_trial(trial.id, TrialResult(TrialState.OK, metrics), 4.0)
        full = store.add_trial(campaign.id, layout)  # its confirmation: a trial of its own
        assert full.fidelity == "full" and full.key == layout.key()
    out = _cli(capsys, "best", "--store", str(db))
    assert "predicted from a proxy at dp2 on 32 nodes, not measured at full scale" in out
    status = json.loads(_cli(capsys, "status", "--store", str(db), "--format", "json"))
    assert status["best"]["fidelity"] == "proxy" and status["best"]["proxy_dp"] == 2
    assert "predicted from a proxy" in _cli(capsys, "status", "--store", str(db))


TINY = {
    "name": "tiny-proxy",
    "model": {
        "num_layers": 2, "hidden_size": 64, "num_heads": 4, "vocab_size": 128, "seq_length": 32
    },
    "allocation": {
        "nodes": 2, "devices_per_node": 1, "device": "cpu", "device_memory": "1GiB",
        "peak_tflops": 0.05,
    },
    "search": {"tp": [1], "pp": [1], "mbs": [1, 2], "recompute": ["none", "full"]},
    "global_batch": 8,
    "trainer": {"kind": "builtin", "steps": 2, "warmup_steps": 1, "timeout": 120},
}  # fmt: skip


@pytest.mark.multiprocess
@pytest.mark.slow
def test_local_slots_run_two_proxies_at_once_then_confirm(tmp_path, capsys):
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(TINY))
    db = tmp_path / "l.db"
    out = _cli(
        capsys, "run", str(tmp_path / "space.yaml"), "--store", str(db), "--backend", "local",
        "--slots", "2", "--proxy", "--budget", "3", "--quiet",
    )  # fmt: skip
    assert "budget reached; 3/3 trials finished (ok 3)" in out
    first, second, last = campaign_trials(db)
    assert first.proxy_dp == second.proxy_dp == 1 and _overlap(first, second)
    assert last.proxy_dp is None and last.origin == "confirm"
    assert last.started_at >= max(first.finished_at, second.finished_at)
    assert last.layout.key() in {first.layout.key(), second.layout.key()}
    assert last.metrics["world_size"] == 2 and first.metrics["fidelity"]["measured"]
    assert "fidelity measured at full scale" in _cli(capsys, "best", "--store", str(db))
