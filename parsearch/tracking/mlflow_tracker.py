"""Trials as MLflow runs: the campaign is the experiment, each finished trial one run.

A run holds the layout as parameters, the measured figures and the estimate's prediction
(``predicted.<name>``) as metrics, the trial's state, number and failure reason as tags,
and the trial's own start and end times.

A logged trial is identified by its campaign *and* the store that holds it: the
``parsearch.campaign_uid`` tag (the campaign's name and creation time, which no other
store's campaign shares, even one of the same space and name) with the ``parsearch.trial``
number. Exporting a campaign twice (or after ``--track``) adds only what is missing, and a
second store's campaign of the same name gets runs of its own in the same experiment, told
apart by that tag, ``parsearch.store`` (its path, when known) and the run name.

Calls to a tracking server are bounded: unless the environment says otherwise, MLflow
retries a failed request twice (not 7 times over about 4 minutes) and waits 10 s for an
answer (not 120 s); ``--track`` also runs them off the driver loop
(:mod:`parsearch.tracking.background`).

mlflow-skinny is enough: it writes to an MLflow server (``http://...``, ``databricks``)
or to a local file store (``file:///path/mlruns``). MLflow 3 keeps the file store in
maintenance mode behind ``MLFLOW_ALLOW_FILE_STORE``; it is still the only local store
mlflow-skinny can write without SQLAlchemy, so a file target sets that switch.
"""

from __future__ import annotations

import hashlib
import math
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from parsearch.errors import TrackingError
from parsearch.store import Campaign, TrialRecord

TRIAL_TAG = "parsearch.trial"
CAMPAIGN_TAG = "parsearch.campaign_uid"
MAX_TAG_CHARS = 5000  # MLflow's limit on a tag value
# MLflow's HTTP client settings, unless set already: a tracking server that is down costs
# seconds per call, not minutes.
HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}


def campaign_uid(campaign: Campaign) -> str:
    """The campaign across stores: its name and creation time (to the microsecond), hashed.
    Two stores' campaigns of the same space and name differ by it; a copy of a store is the
    same campaign."""
    text = f"{campaign.name}\n{campaign.created_at:.6f}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def resolve_uri(uri: str | None) -> str:
    """The tracking URI: given, else ``$MLFLOW_TRACKING_URI``, else ``./mlruns`` here."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or "mlruns"
    if "://" not in uri and not uri.startswith(("databricks", "file:")):
        uri = Path(uri).expanduser().absolute().as_uri()
    return uri


class MlflowTracker:
    """A driver observer that logs each finished trial as an MLflow run."""

    name = "mlflow"

    def __init__(self, uri: str | None = None, store_path: str | os.PathLike | None = None) -> None:
        try:
            from mlflow.entities import Metric, Param, RunTag
            from mlflow.tracking import MlflowClient
        except ImportError as error:
            raise TrackingError(
                f"--track mlflow needs MLflow ({error}); install it with "
                "pip install 'parsearch[mlflow]'"
            ) from None
        self.uri = resolve_uri(uri)
        if self.uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        for name, value in HTTP_DEFAULTS.items():
            os.environ.setdefault(name, value)
        self.store_path = None if store_path is None else str(Path(store_path).absolute())
        self._entities = (Metric, Param, RunTag)
        self.client = MlflowClient(tracking_uri=self.uri)
        self._experiments: dict[int, str] = {}
        self._logged: dict[str, set[int]] = {}  # by campaign uid, read once per session

    def experiment_id(self, campaign: Campaign) -> str:
        """The campaign's experiment (created on first use), named after the campaign."""
        if campaign.id not in self._experiments:
            found = self.client.get_experiment_by_name(campaign.name)
            if found is not None:
                self._experiments[campaign.id] = found.experiment_id
            else:
                self._experiments[campaign.id] = self.client.create_experiment(
                    campaign.name,
                    tags={
                        "parsearch.objective": campaign.objective_metric,
                        "parsearch.backend": campaign.backend,
                        "parsearch.space": campaign.space_path or "",
                    },
                )
        return self._experiments[campaign.id]

    def logged_trials(self, campaign: Campaign) -> set[int]:
        """Numbers of this campaign's trials (this store's: by :func:`campaign_uid`) already
        logged in its experiment."""
        experiment = self.experiment_id(campaign)
        numbers: set[int] = set()
        token = None
        wanted = f"tags.`{CAMPAIGN_TAG}` = '{campaign_uid(campaign)}'"
        while True:
            page = self.client.search_runs(
                [experiment], filter_string=wanted, max_results=1000, page_token=token
            )
            numbers.update(
                int(run.data.tags[TRIAL_TAG]) for run in page if TRIAL_TAG in run.data.tags
            )
            token = page.token
            if not token:
                return numbers

    def trial_finished(self, campaign: Campaign, record: TrialRecord) -> None:
        """Log ``record`` as a run, unless this campaign's trial of that number is there."""
        uid = campaign_uid(campaign)
        if uid not in self._logged:
            self._logged[uid] = self.logged_trials(campaign)
        if record.number in self._logged[uid]:
            return
        self._log(campaign, record)
        self._logged[uid].add(record.number)

    def _log(self, campaign: Campaign, record: TrialRecord) -> None:
        Metric, Param, RunTag = self._entities
        experiment = self.experiment_id(campaign)
        started_ms = _ms(record.started_at or record.created_at)
        finished_ms = _ms(record.finished_at) if record.finished_at else started_ms
        where = f" [{Path(self.store_path).name}]" if self.store_path else ""
        run = self.client.create_run(
            experiment,
            start_time=started_ms,
            run_name=f"trial {record.number}: {record.layout.short()}{where}",
        )
        run_id = run.info.run_id
        metrics = [
            Metric(name, value, finished_ms, 0) for name, value in run_metrics(record).items()
        ]
        params = [Param(name, str(value)) for name, value in run_params(record).items()]
        tags = [
            RunTag(name, value)
            for name, value in run_tags(campaign, record, self.store_path).items()
        ]
        self.client.log_batch(run_id, metrics=metrics, params=params, tags=tags)
        status = "FINISHED" if record.state.value == "ok" else "FAILED"
        self.client.set_terminated(run_id, status=status, end_time=finished_ms)

    def export(self, campaign: Campaign, records: list[TrialRecord]) -> int:
        """Log the finished trials of ``records`` not logged yet; return how many."""
        logged = self.logged_trials(campaign)
        missing = [r for r in records if r.state.finished and r.number not in logged]
        for record in missing:
            self._log(campaign, record)
        self._logged[campaign_uid(campaign)] = logged | {r.number for r in missing}
        return len(missing)

    def close(self) -> None:
        """Nothing is buffered: every run is complete when :meth:`trial_finished` returns."""


def run_params(record: TrialRecord) -> dict[str, Any]:
    """The layout, plus where the trial came from."""
    return {**record.config, "origin": record.origin, "attempt": record.attempt}


def run_metrics(record: TrialRecord) -> dict[str, float]:
    """Measured numbers under their names, predictions as ``predicted.<name>``, the
    objective and the duration; only finite numbers (MLflow metrics are floats)."""
    values: dict[str, Any] = {**record.metrics}
    values.update({f"predicted.{k}": v for k, v in (record.predicted or {}).items()})
    values["objective"] = record.objective
    values["duration_s"] = record.duration_s
    return {
        name: float(value)
        for name, value in values.items()
        if isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    }


def run_tags(
    campaign: Campaign, record: TrialRecord, store_path: str | None = None
) -> dict[str, str]:
    """Which trial of which campaign of which store, and how it went."""
    created = datetime.fromtimestamp(campaign.created_at, timezone.utc)
    tags = {
        TRIAL_TAG: str(record.number),
        CAMPAIGN_TAG: campaign_uid(campaign),
        "parsearch.campaign": campaign.name,
        "parsearch.campaign_created": created.isoformat(timespec="microseconds"),
        "parsearch.key": record.key,
        "state": record.state.value,
        "layout": record.layout.short(),
        "hosts": ",".join(record.hosts),
    }
    if store_path:
        tags["parsearch.store"] = store_path[:MAX_TAG_CHARS]
    if record.error:
        tags["error"] = record.error[:MAX_TAG_CHARS]
    return tags


def _ms(timestamp: float) -> int:
    return int(timestamp * 1000)
