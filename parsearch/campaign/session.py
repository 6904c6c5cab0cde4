"""Starting and resuming campaigns: everything between a command line and the driver loop.

A session takes the campaign's lease before it reads or writes trials, so a second driver is
refused before it can do anything; it rebuilds the strategy from the store (every finished
trial told again, every trial in the store excluded from new proposals) and re-queues what an
earlier session left interrupted or running, so that resuming loses and repeats nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from parsearch.backends import Backend, create_backend
from parsearch.campaign import DEFAULT_BUDGET
from parsearch.campaign.crash_streak import DEFAULT_CRASH_LIMIT
from parsearch.campaign.driver import Driver, DriverSettings, Outcome
from parsearch.campaign.kept import record_kept
from parsearch.campaign.lease import DEFAULT_STALE_AFTER_S, Lease, check_lease_timeout
from parsearch.campaign.observers import Observers
from parsearch.campaign.outage import DEFAULT_OUTAGE_LIMIT_S
from parsearch.campaign.progress import Progress, format_duration
from parsearch.campaign.signals import StopRequest
from parsearch.campaign.warm_start import load_warm_start, store_warm_start_source
from parsearch.errors import (
    CampaignLockedError,
    ParsearchError,
    StoreError,
    StoreUnavailableError,
    UsageError,
)
from parsearch.estimate.profile import profile_from_dict, profile_to_dict
from parsearch.inputs import MAX_BUDGET, MAX_SLOTS, name_problem, seconds
from parsearch.result import TrialState
from parsearch.scaling import chosen_campaign
from parsearch.search.factory import make_strategy
from parsearch.search.strategy import Strategy
from parsearch.space import (
    SearchSpace,
    apply_profile,
    load_space,
    space_from_dict,
    space_with_profile,
)
from parsearch.store import (
    Campaign,
    CampaignExistsError,
    CampaignStatus,
    Store,
    TrialRecord,
    fidelity_note,
    is_postgres_url,
    open_store,
    resume_command,
)


@dataclass(frozen=True)
class CampaignSettings:
    """How a campaign runs; stored with it, so that ``resume`` continues the same way."""

    backend: str = "local"
    backend_options: dict[str, str] = field(default_factory=dict)
    slots: int | None = None
    strategy: str = "default"
    keep_predicted_oom: bool = False
    warm_start: str | None = None
    warm_start_name: str | None = None
    # A new campaign warm-starts from the same model at another node count in its own store
    # (parsearch.campaign.warm_start.store_warm_start_source) unless this is off.
    auto_warm_start: bool = True
    timeout_s: float | None = None
    grace_s: float = 60.0
    lease_timeout_s: float = DEFAULT_STALE_AFTER_S
    # How long the store may stay unreachable before the session drains and keeps its results.
    store_outage_limit_s: float = DEFAULT_OUTAGE_LIMIT_S
    crash_limit: int = DEFAULT_CRASH_LIMIT  # alike crashes in a row before any trial ran
    machine: str | None = None  # a machine profile given with --machine
    proxy: bool = False  # explore by proxy trials at fewer replicas, confirm at full scale
    settle: bool = False  # end once no untried layout is expected to beat the best

    def __post_init__(self) -> None:
        """Refuse what would hang or crash a session later (an infinite wait, a NaN lease)."""
        for option, value, allow_zero in (
            ("--timeout", self.timeout_s, False),
            ("--grace", self.grace_s, True),
            ("--store-outage-limit", self.store_outage_limit_s, True),
        ):
            try:
                if value is not None:
                    seconds(value, allow_zero=allow_zero)
            except (TypeError, ValueError) as error:
                raise UsageError(f"{option}: {error}") from None
        check_lease_timeout(self.lease_timeout_s)
        if self.slots is not None and not 1 <= self.slots <= MAX_SLOTS:
            raise UsageError(f"--slots must lie in [1, {MAX_SLOTS}], got {self.slots}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CampaignSettings:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in names})


@dataclass(frozen=True)
class SessionSummary:
    """What one ``run`` or ``resume`` did, for the command's final report."""

    campaign: Campaign
    outcome: Outcome
    counts: dict[TrialState, int]
    best: TrialRecord | None
    interrupted: int
    elapsed_s: float
    detail: str | None = None  # the driver's words on the outcome, when it has more to say

    @property
    def finished(self) -> int:
        return sum(n for state, n in self.counts.items() if state.finished)

    def render(self, store_path: str | Path) -> str:
        """The command's closing report: outcome, states, best, how to continue."""
        campaign = self.campaign
        states = ", ".join(
            f"{state.value} {n}" for state, n in self.counts.items() if n and state.finished
        )
        lines = [
            f"campaign '{campaign.name}': {self.outcome.value}; {self.finished}/"
            f"{campaign.budget} trials finished ({states or 'none'}) "
            f"[{format_duration(self.elapsed_s)}]"
        ]
        if self.detail:
            lines.append(self.detail)
        if self.best is not None:
            lines.append(
                f"best {campaign.objective_metric} {self.best.objective:.4g}: "
                f"{self.best.layout.short()} (trial #{self.best.number})"
                + (f"; {fidelity_note(self.best)}" if self.best.proxy_dp is not None else "")
            )
        else:
            lines.append("no trial succeeded yet")
        if not self.outcome.complete:
            lines.append(
                f"{self.interrupted} trial(s) interrupted; continue with: "
                f"{resume_command(store_path, campaign.name)}"
            )
        return "\n".join(lines)


def start_campaign(
    space_path: str | Path | SearchSpace,
    store_path: str | Path,
    *,
    name: str | None = None,
    budget: int | None = None,
    seed: int = 0,
    settings: CampaignSettings = CampaignSettings(),
    progress: Progress | None = None,
    resume_overrides: dict[str, Any] | None = None,
    observers: Observers | None = None,
    backend: Backend | None = None,
    parts: _Parts | None = None,
    stop: StopRequest | None = None,
) -> SessionSummary:
    """Create a campaign for the space at ``space_path`` and run it (``budget`` defaults
    to :data:`DEFAULT_BUDGET`); a :class:`SearchSpace` built in memory (a scaling study's
    child campaign) may stand for the file.

    A campaign of that name already in the store is refused, unless ``resume_overrides``
    is given: it is then continued as :func:`resume_campaign` would, with those overrides
    and ``budget`` (if given) as its new total. One command then serves every job of a
    chain, and opening the store to write first recovers it after a killed driver.
    ``backend``, when given, is used instead of one made from the settings, and left open
    (a scaling study runs all its sizes on one MPI job's workers). ``parts`` (a strategy
    and backend built by the caller, :func:`parsearch.campaign.api.run_campaign`) stand
    for the settings' names; the campaign owns them from the call on: they are closed
    whatever happens. ``stop``, when given, is the caller's: a signal that reaches this
    campaign after its last trial still stops the caller (a scaling study's next size).
    """
    try:
        # The stored source is absolute: a machine profile the space names by a relative
        # path is found from it (serve, report, best --like) whatever their working folder.
        if isinstance(space_path, SearchSpace):
            space = space_path
            source = str(Path(space.source).resolve()) if Path(space.source).exists() else None
        else:
            space = load_space(space_path)
            source = str(Path(space_path).resolve())
        if settings.machine:
            space = apply_profile(space, settings.machine)
        if budget is not None:
            _check_budget(budget)
        name = name or space.name
        if problem := name_problem(name):
            raise UsageError(f"campaign name {name[:60]!r} is refused: {problem}")
    except BaseException:
        if parts is not None:
            parts.close()
        raise
    stop = stop if stop is not None else StopRequest()
    with stop.on_signals(), open_store(store_path) as store:
        if any(c.name == name for c in store.list_campaigns()):
            if parts is not None:
                parts.close()
            campaign = chosen_campaign(store, name)
            if resume_overrides is None:
                raise CampaignExistsError.of(name, str(store_path), campaign.created_at)
            if campaign.space != space.raw:
                print(
                    f"warning: {source} differs from the space campaign '{name}' was "
                    "started with; it continues with the stored one",
                    file=sys.stderr,
                )
            return _continue(
                store, campaign, budget, resume_overrides, progress, stop, observers, backend
            )
        if warning := space.plan().timeout_warning():
            print(f"warning: {warning}", file=sys.stderr)
        # Everything that can refuse the settings does so before the campaign exists, so a
        # typo never leaves behind a campaign that only `resume` could reach.
        if parts is None:
            settings = _with_store_warm_start(store, store_path, space, settings)
            parts = _Parts.build(space, settings, seed, backend)
        try:
            campaign = store.create_campaign(
                name,
                space.raw,
                space_path=source,
                seed=seed,
                budget=DEFAULT_BUDGET if budget is None else budget,
                backend=settings.backend,
                settings={
                    **settings.to_dict(),
                    "backend_settings": parts.backend.describe(),
                    **_profile_record(space),
                    "launch_dir": os.getcwd(),  # {launch_dir}, the same on every resume
                },
                objective_metric=space.objective,
            )
        except CampaignExistsError:
            # Another `run --resume` created it since the look above (two jobs of a chain
            # started together): continue it as that branch would (exit 75 while it runs).
            parts.close()
            if resume_overrides is None:
                raise
            campaign = chosen_campaign(store, name)
            return _continue(
                store, campaign, budget, resume_overrides, progress, stop, observers, backend
            )
        except BaseException:
            parts.close()
            raise
        return _session(
            store, campaign, space, settings, progress, stop, parts=parts, observers=observers
        )


def resume_campaign(
    store_path: str | Path,
    *,
    name: str | None = None,
    budget: int | None = None,
    overrides: dict[str, Any] | None = None,
    progress: Progress | None = None,
    observers: Observers | None = None,
) -> SessionSummary:
    """Continue a campaign: re-queue its interrupted trials, then run to its budget.

    ``overrides`` replaces stored settings (``backend``, ``slots``, ``grace_s``...) for this
    session only: the store keeps the settings the campaign started with (a new ``budget``
    is stored).
    """
    if budget is not None:
        _check_budget(budget)
    if (
        str(store_path) != ":memory:"
        and not is_postgres_url(store_path)  # a server answers for itself when opened
        and not Path(store_path).exists()
    ):
        # Opening it to write would create an empty store where none was meant to be.
        raise UsageError(
            f"no store at {store_path}; check the path, or start a campaign there with "
            f"`parsearch run SPACE --store {store_path}`"
        )
    stop = StopRequest()
    with stop.on_signals(), open_store(store_path) as store:
        campaign = chosen_campaign(store, name)
        return _continue(store, campaign, budget, overrides or {}, progress, stop, observers)


def _continue(
    store: Store,
    campaign: Campaign,
    budget: int | None,
    overrides: dict[str, Any],
    progress: Progress | None,
    stop: StopRequest,
    observers: Observers | None = None,
    backend: Backend | None = None,
) -> SessionSummary:
    overrides = dict(overrides)
    if overrides.get("backend", campaign.backend) != campaign.backend:
        overrides.setdefault("backend_options", {})  # the old backend's do not apply
    # One construction from both, so an override can replace a stored value that is no
    # longer valid (say a lease timeout below today's minimum).
    settings = CampaignSettings.from_dict({**campaign.settings, **overrides})
    _check_launch_dir(campaign)
    source = campaign.space_path or f"campaign '{campaign.name}' in {store.path}"
    space = space_from_dict(campaign.space, source=source)
    if settings.machine and campaign.settings.get("machine_profile"):
        # The profile as the campaign started with it, wherever its file is now.
        profile = profile_from_dict(campaign.settings["machine_profile"], source=settings.machine)
        space = space_with_profile(space, profile)
    return _session(
        store,
        campaign,
        space,
        settings,
        progress,
        stop,
        budget=budget,
        observers=observers,
        backend=backend,
    )


def _check_launch_dir(campaign: Campaign) -> None:
    """The campaign's trials keep the ``{launch_dir}`` it was created in (the driver passes
    it on); when its trainer uses it, say so if this session starts elsewhere, and refuse
    when it is gone: every trial would fail to find its program and spend the budget."""
    stored = campaign.settings.get("launch_dir")
    here = os.getcwd()
    uses = "{launch_dir}" in json.dumps(campaign.space.get("trainer", {}))
    if not stored or not uses or Path(stored) == Path(here):
        return
    if not Path(stored).is_dir():
        raise UsageError(
            f"campaign '{campaign.name}' was created in {stored}, its {{launch_dir}}, which "
            f"no longer exists; this resume runs in {here}. Restore {stored} (or link it to "
            "the checkout's new place) and resume again"
        )
    print(
        f"note: {{launch_dir}} stays {stored}, where campaign '{campaign.name}' was created "
        f"(this resume runs in {here})",
        file=sys.stderr,
    )


def _with_store_warm_start(
    store: Store, store_path: str | os.PathLike[str], space: SearchSpace, settings: CampaignSettings
) -> CampaignSettings:
    """``settings`` warm-starting from the store's own campaign of the same model at another
    node count, when the default strategy is given no other source; said on stderr, and
    recorded with the campaign's settings so that a resume rebuilds the same strategy."""
    if settings.warm_start is not None or not settings.auto_warm_start:
        return settings
    if is_postgres_url(store_path):
        where = str(store_path)
    elif Path(store_path).is_file():  # not ":memory:", which no later session could reopen
        where = str(Path(store_path).resolve())
    else:
        return settings
    if settings.strategy != "default":
        return settings
    found = store_warm_start_source(store, space)
    if found is None:
        return settings
    source, finished = found
    nodes = source.space.get("allocation", {}).get("nodes")
    print(
        f"note: warm start from campaign '{source.name}' of this store (the same model on "
        f"the same devices, {nodes} nodes; {finished} finished trials); --no-auto-warm-start "
        "turns it off",
        file=sys.stderr,
    )
    return dataclasses.replace(settings, warm_start=where, warm_start_name=source.name)


def _profile_record(space: SearchSpace) -> dict[str, Any]:
    """The machine profile the campaign's estimate uses, as stored with its settings."""
    profile = space.estimate.machine
    if profile is None:
        return {"machine_profile": None}
    return {"machine_profile": profile_to_dict(profile), "machine_profile_path": profile.path}


@dataclass
class _Parts:
    """A session's strategy and backend, closed together whatever happens."""

    strategy: Strategy
    backend: Backend
    closed: bool = False
    owns_backend: bool = True

    @classmethod
    def build(
        cls,
        space: SearchSpace,
        settings: CampaignSettings,
        seed: int,
        backend: Backend | None = None,
    ) -> _Parts:
        strategy = make_strategy(
            settings.strategy,
            space,
            seed=seed,
            keep_predicted_oom=settings.keep_predicted_oom,
            settle=settings.settle,
            warm_start=None
            if settings.warm_start is None
            else load_warm_start(settings.warm_start, settings.warm_start_name),
            proxy=settings.proxy,
        )
        if backend is not None:
            return cls(strategy, backend, owns_backend=False)
        try:
            backend = create_backend(
                settings.backend, space, slots=settings.slots, options=settings.backend_options
            )
        except BaseException:
            strategy.close()
            raise
        return cls(strategy, backend)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            if self.owns_backend:
                self.backend.close()
        finally:
            self.strategy.close()


def _session(
    store: Store,
    campaign: Campaign,
    space: SearchSpace,
    settings: CampaignSettings,
    progress: Progress | None,
    stop: StopRequest,
    *,
    budget: int | None = None,
    parts: _Parts | None = None,
    observers: Observers | None = None,
    backend: Backend | None = None,
) -> SessionSummary:
    """Run the campaign under its lease; ``parts`` are built after the lease if not given.

    ``stop`` has caught the stop signals since the command began: one that arrives while
    DeepHyper loads makes the driver stop before it starts anything, and exit 0.
    """
    started = time.monotonic()
    progress = progress or Progress(enabled=False)
    with contextlib.ExitStack() as stack:
        if parts is not None:
            stack.callback(parts.close)  # if the lease is refused
        lease = stack.enter_context(
            Lease(store, campaign.id, stale_after_s=settings.lease_timeout_s)
        )
        _report_last_stop(campaign, progress)
        # Built before the campaign changes: a backend that refuses the settings (a bad
        # option, a cluster too small for one trial) leaves it as it was.
        parts = parts or _Parts.build(space, settings, campaign.seed, backend)
        # Closed before the lease is released: no trial outlives its driver's lease.
        stack.callback(parts.close)
        recorded, kept_file = record_kept(store, campaign)
        if recorded:
            print(
                f"note: recorded {recorded} finished result(s) that an earlier session could "
                f"not write to the store, from {kept_file}",
                file=sys.stderr,
            )
        history = _reopen(store, campaign)
        campaign = store.update_campaign(
            campaign.id,
            budget=campaign.budget if budget is None else budget,
            status=CampaignStatus.RUNNING,
            finished_at=None,
            stop_reason=None,
            stopped_at=None,
        )
        assert campaign.budget is not None  # start_campaign always sets one
        try:
            strategy = parts.strategy
            strategy.start(history, budget=campaign.budget)  # told as they were
            progress.message(
                f"campaign '{campaign.name}': {space.name}, budget {campaign.budget}, backend "
                f"{settings.backend} ({parts.backend.capacity} slots), strategy "
                f"{settings.strategy}{' by proxies' if settings.proxy else ''}, "
                f"{sum(r.state.finished for r in history)} trials done before"
            )
            driver = Driver(
                store=store,
                campaign=campaign,
                space=space,
                backend=parts.backend,
                strategy=strategy,
                lease=lease,
                settings=DriverSettings(
                    budget=campaign.budget,
                    timeout_s=settings.timeout_s,
                    grace_s=settings.grace_s,
                    crash_limit=settings.crash_limit,
                    outage_limit_s=settings.store_outage_limit_s,
                ),
                stop=stop,
                progress=progress,
                observers=observers,
            )
            outcome = driver.run(history)
            parts.close()
        except CampaignLockedError:
            raise  # another driver owns the campaign now: write nothing more
        except Exception as error:
            parts.close()  # its trials stop before the campaign is marked stopped
            _record_failure(store, campaign, error)
            raise
        try:
            campaign = store.update_campaign(
                campaign.id,
                status=CampaignStatus.FINISHED if outcome.complete else CampaignStatus.STOPPED,
                finished_at=time.time() if outcome.complete else None,
                stop_reason=None if outcome.complete else driver.detail or outcome.value,
                stopped_at=None if outcome.complete else time.time(),
            )
            counts, best = store.counts(campaign.id), store.best(campaign.id)
        except StoreUnavailableError:
            if outcome is not Outcome.STORE_DOWN:
                raise
            # The store stays down: what this session knows is the report; the campaign
            # shows running with no driver until the next session, which sets it right.
            counts, best = dict(driver.states), driver.best_record
        return SessionSummary(
            campaign=campaign,
            outcome=outcome,
            counts=counts,
            best=best,
            interrupted=driver.interrupted,
            elapsed_s=time.monotonic() - started,
            detail=driver.detail,
        )


def _report_last_stop(campaign: Campaign, progress: Progress) -> None:
    """Say how the previous session ended, when it did not finish the campaign."""
    if campaign.status is CampaignStatus.RUNNING:
        progress.message(
            f"campaign '{campaign.name}' was left running by a driver that stopped without "
            "finishing (killed, or an error it could not record, such as a full disk); its "
            "unfinished trials run again"
        )
    elif campaign.stop_reason and campaign.stopped_at is not None:
        when = datetime.fromtimestamp(campaign.stopped_at).strftime("%Y-%m-%d %H:%M:%S")
        progress.message(
            f"campaign '{campaign.name}' stopped at {when}: {campaign.stop_reason}; its "
            "unfinished trials run again"
        )


def _record_failure(store: Store, campaign: Campaign, error: Exception) -> None:
    """Mark the campaign stopped with ``error`` as the reason, so that ``status`` and the next
    driver say why, and add notes to ``error`` on what was kept and how to go on.

    Best effort: a disk still full may refuse this write too (SQLite needs room for its
    journal); the campaign then stays marked running, which ``status`` reports as a driver
    that stopped without finishing, and the note says so.
    """
    reason = str(error) if isinstance(error, ParsearchError) else f"{type(error).__name__}: {error}"
    try:
        store.mark_interrupted(campaign.id)
        store.update_campaign(
            campaign.id,
            status=CampaignStatus.STOPPED,
            stop_reason=reason,
            stopped_at=time.time(),
        )
        error.add_note(f"campaign '{campaign.name}' is marked stopped with this error")
    except StoreError as failed:
        error.add_note(
            f"campaign '{campaign.name}' could not be marked stopped either ({failed}); "
            "`parsearch status` shows it running with no driver"
        )
    error.add_note(
        "every finished trial is kept in the store; unfinished ones run again when you continue "
        f"with: {resume_command(store.path, campaign.name)}"
    )


def _reopen(store: Store, campaign: Campaign) -> list[TrialRecord]:
    """The campaign's trials, with whatever an earlier session left unfinished re-queued."""
    store.mark_interrupted(campaign.id)
    for record in store.trials(campaign.id, states=[TrialState.INTERRUPTED]):
        store.requeue(record.id)
    return store.trials(campaign.id)


def _check_budget(budget: int) -> None:
    if not 1 <= budget <= MAX_BUDGET:
        raise UsageError(f"--budget must lie in [1, {MAX_BUDGET}], got {budget}")
