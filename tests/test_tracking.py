"""Trials logged to a real MLflow file store: ``run --track``, ``export --to``, observers."""

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from store_polling import campaign_trials

from parsearch.campaign.observers import Observers
from parsearch.campaign.session import CampaignSettings, start_campaign
from parsearch.cli import main
from parsearch.errors import TrackingError
from parsearch.result import TrialState
from parsearch.store import open_store
from parsearch.tracking import TrackTarget, parse_target
from parsearch.tracking.background import DRAIN_DOWN_S, BackgroundTracker

TINY = Path(__file__).parent.parent / "search_spaces" / "tiny-cpu.yaml"
SIMULATE = ["--backend", "simulate", "--backend-opt", "fail_rate=0.3", "--quiet"]


def _runs(uri: str, experiment: str):
    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no experiment {experiment!r} in {uri}"
    return client.search_runs([found.experiment_id], max_results=1000)


@pytest.mark.e2e
@pytest.mark.slow
def test_run_track_logs_every_finished_trial_and_export_adds_only_the_missing(tmp_path, capsys):
    pytest.importorskip("mlflow")
    db, uri = tmp_path / "t.db", (tmp_path / "mlruns").as_uri()
    code = main(["run", str(TINY), "--store", str(db), "--budget", "6", *SIMULATE,
                 "--track", f"mlflow:{uri}"])  # fmt: skip
    assert code == 0
    with open_store(db, readonly=True) as store:
        campaign = store.get_campaign()
        records = {r.number: r for r in store.trials(campaign.id)}
    runs = _runs(uri, campaign.name)
    assert sorted(int(r.data.tags["parsearch.trial"]) for r in runs) == sorted(records)
    states = set()
    for run in runs:
        record = records[int(run.data.tags["parsearch.trial"])]
        states.add(record.state)
        assert run.data.tags["state"] == record.state.value
        assert run.info.status == ("FINISHED" if record.state is TrialState.OK else "FAILED")
        assert {k: run.data.params[k] for k in record.config} == {
            k: str(v) for k, v in record.config.items()
        }
        for name, value in record.metrics.items():
            if isinstance(value, float):
                assert run.data.metrics[name] == pytest.approx(value)
        for name, value in (record.predicted or {}).items():
            if isinstance(value, float):
                assert run.data.metrics[f"predicted.{name}"] == pytest.approx(value)
        if record.objective is not None:
            assert run.data.metrics["objective"] == pytest.approx(record.objective)
        if record.error:
            assert run.data.tags["error"] == record.error
        assert run.data.tags["parsearch.store"] == str(db.absolute())  # which store's trial
    assert TrialState.OK in states and len(states) > 1  # successes and failures both logged
    capsys.readouterr()

    # Exporting the same campaign again adds nothing; to a new store, everything.
    assert main(["export", "--store", str(db), "--to", f"mlflow:{uri}"]) == 0
    assert "logged 0 new of 6 finished trials" in capsys.readouterr().out
    fresh = tmp_path / "exported"
    assert main(["export", "--store", str(db), "--to", f"mlflow:{fresh}"]) == 0
    assert "logged 6 new of 6 finished trials" in capsys.readouterr().out
    assert len(_runs(fresh.as_uri(), campaign.name)) == 6


class _Broken:
    name = "broken-tracker"

    def __init__(self):
        self.calls = 0

    def trial_finished(self, campaign, record):
        self.calls += 1
        raise ConnectionError("tracking server unreachable")

    def close(self):
        pass


class _Recorder:
    name = "recorder"

    def __init__(self):
        self.seen = []

    def trial_finished(self, campaign, record):
        assert record.state.finished
        self.seen.append(record.number)

    def close(self):
        pass


def test_a_failing_observer_costs_the_campaign_nothing(tmp_path, capsys):
    broken, recorder = _Broken(), _Recorder()
    observers = Observers([broken, recorder])
    summary = start_campaign(
        TINY,
        tmp_path / "o.db",
        budget=4,
        settings=CampaignSettings(backend="simulate"),
        observers=observers,
    )
    assert summary.finished == 4 and broken.calls == 4
    assert sorted(recorder.seen) == [0, 1, 2, 3]  # told after each trial, despite the other
    err = capsys.readouterr().err
    assert err.count("warning: broken-tracker could not record") == 1
    assert "tracking server unreachable" in err and observers.failures == {"broken-tracker": 4}


def test_track_targets_are_checked(capsys):
    assert parse_target("mlflow") == TrackTarget("mlflow")
    assert parse_target("mlflow:http://host:5000") == TrackTarget("mlflow", "http://host:5000")
    with pytest.raises(TrackingError, match=r"unknown tracker 'wandb'.*valid: mlflow"):
        parse_target("wandb")
    with pytest.raises(SystemExit) as exit_:
        main(["export", "--store", "x.db", "--to", "tensorboard"])
    assert exit_.value.code == 2
    assert "unknown tracker 'tensorboard'" in capsys.readouterr().err


def test_a_second_store_of_the_same_campaign_gets_runs_of_its_own(tmp_path, capsys):
    """Two stores of the same space and campaign name, exported to one MLflow: each logs
    all its trials, told apart by store and campaign, and a second export adds nothing."""
    pytest.importorskip("mlflow")
    uri = (tmp_path / "mlruns").as_uri()
    stores = [tmp_path / "a.db", tmp_path / "b.db"]
    for i, db in enumerate(stores):
        args = ["--store", str(db), "--budget", "5", "--name", "same", "--seed", str(i)]
        assert main(["run", str(TINY), *args, *SIMULATE]) == 0
    capsys.readouterr()
    for db in stores:
        assert main(["export", "--store", str(db), "--to", f"mlflow:{uri}"]) == 0
        out = capsys.readouterr().out
        assert "logged 5 new of 5 finished trials of campaign 'same'" in out and str(db) in out
    assert main(["export", "--store", str(stores[1]), "--to", f"mlflow:{uri}"]) == 0
    assert "logged 0 new of 5" in capsys.readouterr().out
    runs = _runs(uri, "same")
    assert len(runs) == 10
    by_store = {}
    for run in runs:
        tags = run.data.tags
        by_store.setdefault(tags["parsearch.store"], set()).add(
            (tags["parsearch.campaign_uid"], int(tags["parsearch.trial"]))
        )
        assert Path(tags["parsearch.store"]).name in run.info.run_name
    assert sorted(by_store) == sorted(str(db.absolute()) for db in stores)
    uids = {uid for found in by_store.values() for uid, _ in found}
    assert len(uids) == 2 and all(len(found) == 5 for found in by_store.values())


class _Slow:
    """A tracker whose every call takes ``delay_s`` (a server that answers slowly), or
    fails after it (one that is down)."""

    name = "slow-tracker"

    def __init__(self, delay_s: float, fail: bool = False):
        self.delay_s, self.fail = delay_s, fail
        self.logged: list[int] = []

    def trial_finished(self, campaign, record):
        time.sleep(self.delay_s)
        if self.fail:
            raise ConnectionError("connection refused")
        self.logged.append(record.number)

    def close(self):
        pass


def _records(n: int, tmp_path):
    start_campaign(TINY, tmp_path / "r.db", budget=n, settings=CampaignSettings(backend="simulate"))
    with open_store(tmp_path / "r.db", readonly=True) as store:
        campaign = store.get_campaign()
        return campaign, store.trials(campaign.id)


def test_a_background_tracker_never_blocks_and_counts_what_it_drops(tmp_path):
    campaign, records = _records(6, tmp_path)
    out = io.StringIO()
    slow = _Slow(0.3)
    tracker = BackgroundTracker(slow, queue_size=3, drain_s=0.5, drain_down_s=0.1, stream=out)
    started = time.monotonic()
    for record in records:
        tracker.trial_finished(campaign, record)
    assert time.monotonic() - started < 0.1  # queued, not logged, by the caller
    counts = tracker.close()
    assert counts.told == 6 and counts.dropped_full >= 2  # 3 queued (+1 taken) at most
    assert counts.logged == len(slow.logged) >= 1
    assert counts.logged + counts.dropped_full + counts.dropped_at_close == 6
    text = out.getvalue()
    assert "behind by 3 trials" in text and f"logged {counts.logged} of 6" in text
    assert "parsearch export --store STORE --to slow-tracker" in text

    # A tracker that is down: failures counted, one warning, and the end does not wait.
    out = io.StringIO()
    down = BackgroundTracker(_Slow(0.05, fail=True), drain_s=30, drain_down_s=0.2, stream=out)
    for record in records:
        down.trial_finished(campaign, record)
    time.sleep(0.2)
    started = time.monotonic()
    counts = down.close()
    assert time.monotonic() - started < 1.5  # not drain_s: its last call failed
    assert counts.failed >= 1 and counts.failed + counts.dropped_at_close == 6
    assert out.getvalue().count("could not record") == 1


DEAD_SERVER = "mlflow:http://127.0.0.1:9"  # port 9 (discard): nothing listens


def _timed_run(tmp_path, name: str, *extra: str) -> tuple[float, float, str]:
    """(seconds from the first trial's start to the last finish, seconds from the last
    finish to the command's exit, stderr) of a 5-trial simulate campaign. (Not the whole
    command's time: importing MLflow takes seconds before the campaign starts.)"""
    db = tmp_path / f"{name}.db"
    done = subprocess.run(
        [sys.executable, "-m", "parsearch", "run", str(TINY), "--store", str(db), "--budget",
         "5", "--backend", "simulate", "--backend-opt", "delay=0.3", "--quiet", *extra],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    exited = time.time()
    assert done.returncode == 0, done.stderr
    with open_store(db, readonly=True) as store:
        records = store.trials(store.get_campaign().id)
    assert len(records) == 5 and all(r.state.finished for r in records)
    last = max(r.finished_at for r in records)
    return last - min(r.started_at for r in records), exited - last, done.stderr


@pytest.mark.e2e
@pytest.mark.slow
def test_a_dead_tracking_server_costs_the_campaign_nothing(tmp_path):
    pytest.importorskip("mlflow")
    span, tail, _ = _timed_run(tmp_path, "alone")
    tracked_span, tracked_tail, err = _timed_run(tmp_path, "tracked", "--track", DEAD_SERVER)
    assert tracked_span < span + 1.0, (span, tracked_span)  # the trials did not wait
    # ... nor the end: after the last trial, at most the second given to a tracker down.
    assert tracked_tail < tail + DRAIN_DOWN_S + 2.0, (tail, tracked_tail)
    assert "logged 0 of 5 finished trials" in err and "parsearch export" in err


@pytest.mark.e2e
@pytest.mark.slow
def test_a_driver_with_a_dead_tracker_stops_within_its_grace(tmp_path):
    pytest.importorskip("mlflow")
    db = tmp_path / "term.db"
    driver = subprocess.Popen(
        [sys.executable, "-m", "parsearch", "run", str(TINY), "--store", str(db), "--budget",
         "30", "--backend", "simulate", "--backend-opt", "delay=1", "--slots", "1",
         "--grace", "5", "--quiet", "--track", DEAD_SERVER],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while sum(r.state.finished for r in campaign_trials(db)) < 3:
            assert driver.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        driver.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        _, err = driver.communicate(timeout=120)
        stopped_in = time.monotonic() - signalled
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
    assert driver.returncode == 0, err
    assert stopped_in < 5 + DRAIN_DOWN_S + 5.0, stopped_in  # grace + the tracker's 1 s
