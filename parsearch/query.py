"""Reading a campaign while it runs: results as a DataFrame, progress, ETA.

Everything here opens the store read-only, which cannot modify or lock out the driver, so it
is safe from a login node or a notebook while a campaign writes the same file.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from parsearch.campaign.lease import DEFAULT_STALE_AFTER_S
from parsearch.errors import StoreError
from parsearch.failures import FAILURE_STATES, FailureGroup, group_failures
from parsearch.result import TrialState
from parsearch.scaling import chosen_campaign
from parsearch.store import (
    Campaign,
    CampaignStatus,
    LeaseHolder,
    Store,
    TrialRecord,
    open_store,
)

if TYPE_CHECKING:
    import pandas as pd

# Finishing rate from the last trials only: a resumed campaign's rate is the current one.
RATE_WINDOW = 20


@contextlib.contextmanager
def open_campaign(
    store_path: str | os.PathLike[str], name: str | None = None
) -> Iterator[tuple[Store, Campaign]]:
    """The store (read-only) and the campaign ``name`` (default: the newest one)."""
    with open_store(store_path, readonly=True) as store:
        yield store, chosen_campaign(store, name)


def results(store_path: str | os.PathLike[str], name: str | None = None) -> pd.DataFrame:
    """Every trial of a campaign as a DataFrame: layout, state, metrics, predictions.

    ``name`` defaults to the newest campaign of the store. Safe while the campaign runs.
    """
    with open_campaign(store_path, name) as (store, campaign):
        return store.dataframe(campaign.id)


@dataclass(frozen=True)
class CampaignProgress:
    """Where a campaign stands, from the store alone."""

    campaign: Campaign
    counts: dict[TrialState, int]
    best: TrialRecord | None
    rate_per_s: float | None
    driver: LeaseHolder | None = None
    read_at: float = 0.0
    device_seconds: dict[str, float] | None = None  # by fidelity: full, proxy

    @property
    def node_hours(self) -> dict[str, float]:
        """Node-hours the trials ran, measured at full scale and as proxies apart (a proxy
        counts as one trial of the budget, on fewer nodes)."""
        per_node = int(self.campaign.space.get("allocation", {}).get("devices_per_node", 1))
        spent = self.device_seconds or {}
        return {kind: spent.get(kind, 0.0) / per_node / 3600 for kind in ("full", "proxy")}

    @property
    def driver_silent_s(self) -> float | None:
        """Seconds since the driver's last heartbeat, when one holds the campaign."""
        return None if self.driver is None else max(0.0, self.read_at - self.driver.heartbeat_at)

    @property
    def driver_stale(self) -> bool:
        """Whether the driver has been silent longer than the campaign's lease timeout: it
        died without releasing, and a ``resume`` would take the campaign over."""
        timeout = float(self.campaign.settings.get("lease_timeout_s", DEFAULT_STALE_AFTER_S))
        if self.driver is not None and self.driver.stale_after_s is not None:
            timeout = self.driver.stale_after_s  # the holder's own, as takeover uses
        silent = self.driver_silent_s
        return silent is not None and silent > timeout

    @property
    def driver_gone(self) -> bool:
        """Whether the campaign is marked running but no live driver runs it: no driver
        holds its lease, the holder's heartbeat is older than its lease timeout, or the
        holder's process is gone from this host (``kill -9``: seen at once, not after the
        timeout)."""
        if self.campaign.status is not CampaignStatus.RUNNING:
            return False
        if self.driver is None or self.driver_stale:
            return True
        return self.driver.host == socket.gethostname() and not _process_exists(self.driver.pid)

    @property
    def live(self) -> bool:
        """Whether a driver runs the campaign now."""
        return self.campaign.status is CampaignStatus.RUNNING and not self.driver_gone

    @property
    def finish_reason(self) -> str | None:
        """Why a finished campaign ended before its budget (``None`` when it reached it)."""
        campaign = self.campaign
        if campaign.status is not CampaignStatus.FINISHED or not campaign.budget:
            return None
        if self.finished >= campaign.budget:
            return None
        if campaign.settings.get("settle"):
            return "settled: no untried layout was expected to beat the best"
        return "no untried layout left: every layout of the space that can run was tried"

    @property
    def finished(self) -> int:
        return sum(n for state, n in self.counts.items() if state.finished)

    @property
    def failed(self) -> int:
        return sum(n for state, n in self.counts.items() if state.failed)

    @property
    def remaining(self) -> int:
        return max(0, (self.campaign.budget or 0) - self.finished)

    @property
    def eta_s(self) -> float | None:
        """Seconds to the budget at the recent finishing rate, while a driver runs it (none
        once its driver is gone: nothing will finish until ``resume``)."""
        if not self.live or not self.rate_per_s:
            return None
        return self.remaining / self.rate_per_s


def _process_exists(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (``True`` when unsure)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def campaign_progress(store: Store, campaign: Campaign) -> CampaignProgress:
    """Counts and best from indexed queries; the finishing rate only while a driver runs."""
    rate = None
    if campaign.status is CampaignStatus.RUNNING:
        times = store.recent_finish_times(campaign.id, RATE_WINDOW)
        if len(times) >= 2 and times[-1] > times[0]:
            # Count the gap since the last finish too, so a stalled campaign's ETA grows.
            span = max(times[-1], time.time()) - times[0]
            rate = (len(times) - 1) / span
    return CampaignProgress(
        campaign=campaign,
        counts=store.counts(campaign.id),
        best=store.best(campaign.id),
        rate_per_s=rate,
        driver=store.lease_holder(campaign.id),
        read_at=time.time(),
        device_seconds=store.device_seconds(campaign.id),
    )


def stored_backend(store_path: str | Path, name: str | None) -> str | None:
    """A campaign's backend, read without writing: under ``mpiexec``/``srun`` every rank
    runs the command, and the workers must be diverted before anyone opens the store to
    write. ``None`` when the store cannot be read (or lacks the campaign); the command
    then reports why."""
    try:
        with open_store(store_path, readonly=True) as store:
            return chosen_campaign(store, name).backend
    except StoreError:
        return None


def status_document(progress: CampaignProgress, failures: Sequence[FailureGroup] = ()) -> dict:
    """The figures of `parsearch status --format json` (also served by `parsearch serve`);
    ``failures``: the campaign's failed trials grouped by state and reason."""
    campaign, best = progress.campaign, progress.best
    return {
        "campaign": campaign.name,
        "status": campaign.status.value,
        # Whether a driver runs it now: false for a campaign left "running" by a driver
        # that was killed (its lease gone stale, or its process gone from this host).
        "live": progress.live,
        "budget": campaign.budget,
        "finished": progress.finished,
        "failed": progress.failed,
        "states": {state.value: n for state, n in progress.counts.items()},
        "failures": [
            {"state": group.state.value, "reason": group.reason, "trials": list(group.trials)}
            for group in failures
        ],
        "eta_s": progress.eta_s,
        "node_hours": progress.node_hours,  # {"full": ..., "proxy": ...}
        "best": None
        if best is None
        else {
            "trial": best.number,
            "objective": best.objective,
            "layout": best.config,
            "fidelity": best.fidelity,  # "proxy": predicted, no full-scale trial succeeded
            "proxy_dp": best.proxy_dp,
        },
        "objective_metric": campaign.objective_metric,
        "backend": campaign.backend,
        "created_at": campaign.created_at,
        "finished_at": campaign.finished_at,
        "stop_reason": campaign.stop_reason,
        "finish_reason": progress.finish_reason,
        "stopped_at": campaign.stopped_at,
        "driver": None
        if progress.driver is None
        else {
            "host": progress.driver.host,
            "pid": progress.driver.pid,
            "since": progress.driver.acquired_at,
            "silent_s": progress.driver_silent_s,
            "stale": progress.driver_stale,
        },
    }


def campaign_status(store: Store, campaign: Campaign) -> dict:
    """:func:`status_document` of a campaign as stored now: what `status --format json`
    prints and `parsearch serve` answers."""
    failures = group_failures(store.trials(campaign.id, FAILURE_STATES))
    return status_document(campaign_progress(store, campaign), failures)
