"""The store's contract, as a :class:`typing.Protocol` that the driver, the lease and the
read side are typed against; :class:`~parsearch.store.sqlite.SQLiteStore` and
:class:`~parsearch.store.postgres.PostgreSQLStore` implement it."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from parsearch.config import ParallelLayout
from parsearch.result import TrialResult, TrialState
from parsearch.store.records import Campaign, CampaignStatus, LeaseHolder, TrialRecord

if TYPE_CHECKING:
    import pandas as pd


@runtime_checkable
class Store(Protocol):
    """Campaigns, the lease on each, their trials and the queries over them.

    What every implementation guarantees:

    * **Atomic methods.** Each method is one transaction: when it returns, its change is
      durable; when it raises, it had no effect. Every failure is a
      :class:`~parsearch.errors.StoreError` (a held lease: its subclass
      :class:`~parsearch.errors.CampaignLockedError`) naming the store and what to do.
    * **One record per layout.** A layout is recorded at most once per campaign, identified by
      :meth:`ParallelLayout.key`; :meth:`add_trial` refuses a second one.
    * **States only move forward.** ``queued -> running -> ok | oom | timeout | error |
      infeasible``, or to ``interrupted`` from queued or running, and ``interrupted ->
      queued`` via :meth:`requeue`. A finished trial is never changed again (nothing finished
      is lost); any other move raises.
    * **Readers see committed states only.** A read-only store (``readonly``) runs every query
      and no write; it sees what writers committed, never half a transaction, and may read
      while the driver writes.
    * **One writer per campaign, by lease.** Only the lease holder writes a campaign's trials.
      :meth:`acquire_lease` is refused while another owner's heartbeat is younger than
      ``stale_after_s``; an older one is taken over. A driver whose :meth:`heartbeat` raises
      :class:`~parsearch.errors.CampaignLockedError` has **lost** the lease (it was silent
      too long and another driver took over) and must stop writing at once.
    * **Thread-safe.** Methods may be called from several threads (a heartbeat thread beside
      the driver loop).
    """

    path: Path | str
    readonly: bool

    def close(self) -> None: ...

    def create_campaign(
        self,
        name: str,
        space: dict[str, Any],
        *,
        space_path: str | None = ...,
        seed: int = ...,
        budget: int | None = ...,
        backend: str = ...,
        settings: dict[str, Any] | None = ...,
        objective_metric: str = ...,
        versions: dict[str, str] | None = ...,
    ) -> Campaign:
        """Record a new campaign; ``versions`` defaults to the software running now."""
        ...

    def get_campaign(self, name: str | None = None) -> Campaign:
        """The campaign called ``name``; without a name, the most recently created one."""
        ...

    def list_campaigns(self) -> list[Campaign]:
        """Every campaign, oldest first."""
        ...

    def update_campaign(
        self,
        campaign_id: int,
        *,
        budget: int | None = ...,
        finished_at: float | None = ...,
        status: CampaignStatus | str = ...,
        stop_reason: str | None = ...,
        stopped_at: float | None = ...,
    ) -> Campaign:
        """Change the given fields (``None`` clears any but status)."""
        ...

    def acquire_lease(self, campaign_id: int, owner: str, *, stale_after_s: float) -> None:
        """Make ``owner`` the campaign's only driver (see the class docstring)."""
        ...

    def heartbeat(self, campaign_id: int, owner: str) -> None:
        """Prove ``owner`` is alive; raises ``CampaignLockedError`` if it lost the lease."""
        ...

    def lease_holder(self, campaign_id: int) -> LeaseHolder | None:
        """The driver holding the campaign's lease (alive or not: see its heartbeat)."""
        ...

    def release_lease(self, campaign_id: int, owner: str) -> None:
        """Give the lease up if ``owner`` holds it; safe to call twice, or after losing it."""
        ...

    def add_trial(
        self,
        campaign_id: int,
        layout: ParallelLayout,
        *,
        state: TrialState = ...,
        predicted: dict[str, Any] | None = ...,
        origin: str = ...,
        proxy_dp: int | None = ...,
    ) -> TrialRecord:
        """Record ``layout`` as the campaign's next trial (numbered from 0); with
        ``proxy_dp``, a proxy trial of it at that many data-parallel replicas."""
        ...

    def has_key(self, campaign_id: int, key: str) -> bool:
        """Whether a layout with this :meth:`ParallelLayout.key` is in the campaign."""
        ...

    def get_trial(self, trial_id: int) -> TrialRecord: ...

    def mark_running(self, trial_id: int, hosts: Iterable[str], attempt: int) -> TrialRecord:
        """A queued trial was dispatched to ``hosts``; ``attempt`` counts its starts from 1."""
        ...

    def finish_trial(
        self, trial_id: int, result: TrialResult, objective: float | None
    ) -> TrialRecord:
        """Record a queued or running trial's outcome; only an ok trial has an objective."""
        ...

    def mark_interrupted(self, campaign_id: int) -> int:
        """Mark every queued or running trial interrupted; returns how many."""
        ...

    def requeue(self, trial_id: int) -> TrialRecord:
        """Queue an interrupted trial again, clearing its partial outcome; attempt is kept."""
        ...

    def trials(
        self, campaign_id: int, states: Iterable[TrialState] | None = None
    ) -> list[TrialRecord]:
        """The campaign's trials in order of number, optionally only those in ``states``."""
        ...

    def recent_finish_times(self, campaign_id: int, n: int) -> list[float]:
        """When the ``n`` newest finished trials finished, oldest first."""
        ...

    def counts(self, campaign_id: int) -> dict[TrialState, int]:
        """How many trials are in each state (every state present, zeros included)."""
        ...

    def device_seconds(self, campaign_id: int) -> dict[str, float]:
        """Device-seconds the trials ran, by fidelity (``full``, ``proxy``)."""
        ...

    def best(self, campaign_id: int, *, max_mem_bytes: float | None = None) -> TrialRecord | None:
        """The ok trial with the highest objective, optionally within a peak-memory cap;
        measured at full scale unless no full-scale trial succeeded (then a proxy's)."""
        ...

    def top(
        self,
        campaign_id: int,
        k: int,
        *,
        max_mem_bytes: float | None = ...,
        full_scale: bool = ...,
    ) -> list[TrialRecord]:
        """The ``k`` ok trials with the highest objective, best first (only those measured
        at full scale with ``full_scale``)."""
        ...

    def pareto(self, campaign_id: int) -> list[TrialRecord]:
        """Ok trials no other ok trial beats on both objective (max) and peak memory (min)."""
        ...

    def dataframe(self, campaign_id: int) -> pd.DataFrame:
        """One row per trial, layout fields and metrics as columns."""
        ...

    def export(self, campaign_id: int, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`dataframe` to ``path``: ``.csv`` or ``.parquet``, by suffix."""
        ...
