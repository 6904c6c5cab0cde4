"""Trials logged to a real MLflow file store: ``run --track``, ``export --to``, observers."""

import os
from pathlib import Path

import pytest

from parsearch.campaign.observers import Observers
from parsearch.campaign.session import CampaignSettings, start_campaign
from parsearch.cli import main
from parsearch.errors import TrackingError
from parsearch.result import TrialState
from parsearch.store import open_store
from parsearch.tracking import TrackTarget, parse_target

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
