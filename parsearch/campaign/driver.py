"""The campaign loop: keep every slot busy, record every result, stop at the budget exactly.

One iteration: fill the free slots (re-queued trials first, then the strategy's proposals),
wait briefly for finished trials, record each in its own store transaction, tell the
strategy all of them at once. Invariants:

* ``finished + running <= budget`` at every moment, so the campaign never finishes more
  trials than its budget, however many slots free at once;
* a trial is in the store (queued) before its backend starts it, and finished in the store
  before the strategy hears of it: a crash at any point loses at most running trials, which
  ``resume`` re-queues;
* a driver whose lease was taken over stops at its next iteration (within ``poll_s``)
  and writes nothing more: no drain, no interrupted marks, no campaign status;
* an exception out of the backend's ``poll`` names no trial, so the backend is taken for
  broken: a :class:`BackendError` naming it and the exception ends the session, which marks
  the campaign stopped (resumable); a backend that fails to conclude one trial reports that
  trial as an error instead (:func:`parsearch.backends.conclusion_failed`);
* a store that cannot be reached (:class:`~parsearch.errors.StoreUnavailableError`) ends
  nothing at once: running trials go on, finished results wait in memory, no trial starts,
  and the store is tried again with a growing pause (:mod:`~parsearch.campaign.outage`);
  past ``outage_limit_s`` the driver drains as on SIGTERM and keeps what it could not write
  in a file that the next session records (:mod:`~parsearch.campaign.kept`);
* a result with impossible figures (not finite, negative, above the peak FLOP/s or any
  addressable memory) is recorded as an ``error`` and told as a failure, never as a value.

The driver knows strategies by :class:`~parsearch.search.strategy.Strategy`'s interface
alone: it hands each the backend's placement and clock
(:class:`~parsearch.search.strategy.Placement`), stores what
:meth:`~parsearch.search.strategy.Strategy.record_result` says a finished trial measured,
and tells it what finished. A strategy whose trials differ in size (``sized``: ``run
--proxy``, where a proxy spans fewer nodes than the allocation) is asked for one trial at a
time while the backend has a free node (:func:`~parsearch.backends.room_for`); each is
queued in the store and the queue's head starts as soon as there is room for it, so small
proxies fill the nodes a full-scale trial would hold and a confirmation waits for the whole
allocation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import re
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from parsearch.backends import Backend, Finished, clock_of, room_for
from parsearch.campaign.crash_streak import DEFAULT_CRASH_LIMIT, CrashStreak
from parsearch.campaign.kept import KeptResult, keep
from parsearch.campaign.lease import Lease
from parsearch.campaign.observers import Observers
from parsearch.campaign.outage import DEFAULT_OUTAGE_LIMIT_S, Outage
from parsearch.campaign.progress import Progress, Snapshot
from parsearch.campaign.signals import StopRequest
from parsearch.config import ParallelLayout
from parsearch.errors import BackendError, ParsearchError, StoreUnavailableError
from parsearch.plausible import checked as plausible_result
from parsearch.result import TrialResult, TrialState
from parsearch.search.candidates import layout_problems
from parsearch.search.strategy import Placement, Proposal, Strategy
from parsearch.space import SearchSpace
from parsearch.store import Campaign, Store, TrialRecord
from parsearch.trial import TrialSpec, nodes_spanned

# The stop signals a scheduler sends every process of a job it ends (scancel, a requeue, the
# time limit); SIGUSR1, its warning, reaches the driver alone through the batch shell.
JOB_ENDING = ("SIGTERM", "SIGHUP")

# How long an idle backend may report no free slot before the driver calls it an error:
# Ray holds a finished trial's placement group until its actors have closed (seconds on a
# loaded node), and a cluster's nodes may still be joining.
ROOM_WAIT_S = 120.0

T = TypeVar("T")


class Outcome(str, enum.Enum):
    """Why the driver returned."""

    BUDGET = "budget reached"
    EXHAUSTED = "no untried layout left"
    SETTLED = "settled: no untried layout is expected to beat the best"
    STOPPED = "stopped by a signal"
    TIMED_OUT = "campaign timeout reached"
    CRASHING = "stopped: every trial crashed the same way"
    STORE_DOWN = "stopped: the store stayed unreachable"

    @property
    def complete(self) -> bool:
        """Whether the campaign is done (rather than paused until ``resume``)."""
        return self in (Outcome.BUDGET, Outcome.EXHAUSTED, Outcome.SETTLED)

    @property
    def exit_code(self) -> int:
        """What ``run`` and ``resume`` exit with: 3 when the trainer is broken (a job chain
        stops there rather than resubmit it), 0 otherwise."""
        return 3 if self is Outcome.CRASHING else 0


@dataclass(frozen=True)
class DriverSettings:
    budget: int
    timeout_s: float | None = None
    grace_s: float = 60.0
    poll_s: float = 0.5
    crash_limit: int = DEFAULT_CRASH_LIMIT
    outage_limit_s: float = DEFAULT_OUTAGE_LIMIT_S


@dataclass
class _Unwritten:
    """A finished trial whose outcome the store has not recorded yet."""

    record: TrialRecord
    result: TrialResult
    objective: float | None = None
    judged: bool = False  # infeasible by the rules: not a run, no crash to count
    written: bool = False  # an interrupted trial's outcome is, its re-queuing is not yet
    tried: bool = False  # a write failed: its commit may have reached the store all the same


class Driver:
    """Runs one session of a campaign (a ``run`` or a ``resume``) to its end."""

    def __init__(
        self,
        *,
        store: Store,
        campaign: Campaign,
        space: SearchSpace,
        backend: Backend,
        strategy: Strategy,
        lease: Lease,
        settings: DriverSettings,
        stop: StopRequest | None = None,
        progress: Progress | None = None,
        observers: Observers | None = None,
    ):
        self.store = store
        self.campaign = campaign
        self.space = space
        self.backend = backend
        self.strategy = strategy
        strategy.place(
            Placement(room=lambda nodes: room_for(backend, nodes), clock=clock_of(backend))
        )
        self.lease = lease
        self.settings = settings
        self.stop = stop or StopRequest()
        self._draining = False
        self.progress = progress or Progress(enabled=False)
        self.observers = observers or Observers()
        self.metric = campaign.objective_metric
        self.trial_timeout_s = space.trial_timeout_s
        self.running: dict[str, TrialRecord] = {}
        self.queue: deque[TrialRecord] = deque()
        self.finished = 0
        self.failed = 0
        self.best: tuple[float, ParallelLayout] | None = None
        # What this session knows without its store (the summary when the store is gone).
        self.best_record: TrialRecord | None = None
        self.states: Counter[TrialState] = Counter()
        self.unwritten: list[_Unwritten] = []
        self._unadded: deque[Proposal] = deque()  # asked for while the store was down
        self.outage = Outage(settings.outage_limit_s)
        self.outage_s = 0.0  # how long the store was unreachable in all, in this session
        self.interrupted = 0
        # Said beside the outcome when it needs more words (why the trainer is taken as broken).
        self.detail: str | None = None
        self.crashes = CrashStreak(settings.crash_limit)
        self._interrupted_outside = 0
        self._started = time.monotonic()
        self._finished_here = 0
        self._last_finish = self._started
        self._no_room_since: float | None = None
        # Trial ids name work directories: unique across campaigns and attempts, path-safe.
        self._slug = re.sub(r"[^A-Za-z0-9._-]+", "_", campaign.name)

    def run(self, history: Iterable[TrialRecord] = ()) -> Outcome:
        """Drive the campaign; ``history`` is what the store holds already (on resume).

        Finished trials in it count against the budget and set the best so far; queued ones
        (re-queued after an interruption) run before anything new is asked.
        """
        for record in history:
            if record.state.finished:
                self._count(record)
            elif record.state is TrialState.QUEUED:
                self.queue.append(record)
        try:
            return self._loop()
        finally:
            self.progress.close()

    def _loop(self) -> Outcome:
        while True:
            self.lease.check()
            if self.stop.requested:
                return self._drain(Outcome.STOPPED)
            if self.crashes.verdict:
                self.detail = self.crashes.verdict
                self.progress.message(self.detail)
                self.stop.request("the trainer crashes in every trial")
                return self._drain(Outcome.CRASHING)
            if self._timed_out():
                self.stop.request("timeout")
                return self._drain(Outcome.TIMED_OUT)
            if not self._store_ready():
                if self.outage.exceeded:
                    self.stop.request("store unreachable")
                    return self._drain(Outcome.STORE_DOWN)
                self._wait_for_store()
                continue
            exhausted = self._dispatch()
            if self.outage.active:
                continue  # a write failed there: wait for the store, not for room
            if not self.running:
                if self._awaiting_room(exhausted):
                    continue
                return self._complete(exhausted)
            self.progress.update(self.snapshot())
            self._record(self._poll(self._poll_timeout()))

    def _stored(self, write: Callable[..., T], *args: object, **kwargs: object) -> T:
        """``write(*args, **kwargs)`` on the store, noting an outage's start and end."""
        try:
            value = write(*args, **kwargs)
        except StoreUnavailableError as error:
            if self.outage.failed(error):
                self.progress.message(
                    f"store unreachable: {error}; running trials go on, their results wait "
                    f"here, and the store is tried again for up to "
                    f"{self.outage.limit_s:g} s (--store-outage-limit)"
                )
            raise
        if self.outage.active:
            lasted = self.outage.ended()
            self.outage_s += lasted
            self.progress.message(f"store reachable again after {lasted:.1f} s; going on")
        return value

    def _store_ready(self) -> bool:
        """Whether the store takes writes: every waiting result written now. False while
        an outage lasts (until its next try, or when that try fails); with no result to
        write, the lease's heartbeat is the try."""
        if self.outage.due_in_s() > 0:
            return False
        self._flush()
        if self.outage.active and not self.unwritten:
            with contextlib.suppress(StoreUnavailableError):
                self._stored(self.store.heartbeat, self.campaign.id, self.lease.owner)
        return not self.outage.active

    def _wait_for_store(self) -> None:
        """Until the store's next try: collect what finishes meanwhile (kept in memory)."""
        wait = min(self.outage.due_in_s() or self.settings.poll_s, self._poll_timeout())
        self.progress.update(self.snapshot())
        if self.running:
            self._record(self._poll(wait))
        else:
            time.sleep(wait)

    def _flush(self, *, tell_empty: bool = False) -> None:
        """Write the waiting results in order, as far as the store takes them; count and
        tell the strategy those written (not while draining: see :meth:`_record`), even
        none when ``tell_empty`` (a poll's news for a strategy that waits for any)."""
        told = []
        try:
            while self.unwritten:
                item = self.unwritten[0]
                if item.result.status is TrialState.INTERRUPTED:
                    self._write_interrupted(item)
                else:
                    told.append(self._write_finished(item))
                self.unwritten.pop(0)
        except StoreUnavailableError:
            pass
        if not self._draining and (told or tell_empty):
            self.strategy.finished(told)

    def _write_finished(self, item: _Unwritten) -> tuple[TrialRecord, TrialResult]:
        """Record one result; after a failed try, first look whether that try's commit
        reached the store although its answer did not (the connection dropped in between):
        then it is not written twice, which the store would refuse."""
        record = None
        if item.tried:
            record = self._stored(self.store.get_trial, item.record.id)
        if record is None or not record.state.finished:
            item.tried = True
            record = self._stored(
                self.store.finish_trial, item.record.id, item.result, item.objective
            )
        self._count(record)
        if not item.judged:
            self.crashes.add(record)
            self._finished_here += 1
            self._last_finish = time.monotonic()
        self.observers.trial_finished(self.campaign, record)
        return record, item.result

    def _write_interrupted(self, item: _Unwritten) -> None:
        """A trial stopped from outside (the job ending kills every process of its step) is
        no outcome of its layout: it is neither counted nor told, and runs again, now or
        when the campaign continues. After a failed try, as :meth:`_write_finished`: a
        step whose commit reached the store is not made again."""
        state = None
        if item.tried:
            state = self._stored(self.store.get_trial, item.record.id).state
        item.tried = True
        if state in (None, TrialState.QUEUED, TrialState.RUNNING) and not item.written:
            self._stored(self.store.finish_trial, item.record.id, item.result, None)
            state = TrialState.INTERRUPTED
        item.written = True
        if self.stop.requested:
            self._interrupted_outside += 1
        elif state is TrialState.INTERRUPTED:
            self.queue.append(self._stored(self.store.requeue, item.record.id))
        else:  # re-queued by the try whose answer was lost
            self.queue.append(self._stored(self.store.get_trial, item.record.id))

    def _poll(self, timeout_s: float) -> list[Finished]:
        """The backend's finished trials; an exception it raises there (a bug, a lost
        connection) as a :class:`BackendError` that names it."""
        try:
            return self.backend.poll(timeout_s)
        except ParsearchError:
            raise
        except Exception as error:
            raise BackendError(
                f"backend '{self.backend.name}' failed while collecting finished trials "
                f"({len(self.running)} running): {type(error).__name__}: {error}"
            ) from error

    def _awaiting_room(self, exhausted: bool) -> bool:
        """Whether to wait (briefly, polling the backend) for a slot to free although no
        trial runs: a backend that could run one (``capacity``) may still be releasing a
        finished trial's resources. One that cannot (every node lost) is not waited for."""
        if exhausted or self.finished >= self.settings.budget or not self.backend.capacity:
            return False
        now = time.monotonic()
        if self._no_room_since is None:
            self._no_room_since = now
        if now - self._no_room_since >= ROOM_WAIT_S:
            return False
        self._poll(0.0)
        time.sleep(min(self.settings.poll_s, 0.05))
        return True

    def _complete(self, exhausted: bool) -> Outcome:
        if self.finished < self.settings.budget and not exhausted:
            name, left = self.backend.name, self.settings.budget - self.finished
            if not self.backend.capacity:
                raise BackendError(
                    f"backend '{name}' has no room left for a trial ({left} of the budget to "
                    "go): its nodes were lost or are too few; `parsearch resume` continues "
                    "the campaign on a new allocation"
                )
            raise BackendError(
                f"backend '{name}' has had no free slot for {ROOM_WAIT_S:g} s although no "
                "trial runs"
            )
        if self.queue:  # re-queued trials the (lowered) budget leaves no room for
            self.interrupted = self.store.mark_interrupted(self.campaign.id)
        if self.finished >= self.settings.budget:
            return Outcome.BUDGET
        return Outcome.SETTLED if self.strategy.settled else Outcome.EXHAUSTED

    def _dispatch(self) -> bool:
        """Fill free slots within the budget; return whether the strategy ran dry."""
        if self.strategy.sized:
            return self._dispatch_sized()
        while True:
            room = min(
                self.backend.free_slots(),
                self.settings.budget - self.finished - len(self.running),
            )
            if room <= 0:
                return False
            while room > 0 and self.queue and not self.outage.active:
                self._launch(self.queue.popleft())
                room -= 1
            if self.outage.active:
                return False
            if room <= 0:
                continue
            proposals = self._proposals(room)
            if not proposals:
                return True
            for record in self._add(proposals):
                if not self.outage.active:
                    self._launch(record)
                else:
                    self.queue.append(record)

    def _dispatch_sized(self) -> bool:
        """:meth:`_dispatch` for trials of different sizes: start the queue's head when the
        backend has room for its nodes; ask for one more trial while a node is free."""
        while self.settings.budget - self.finished - len(self.running) > 0:
            if self.outage.active:
                return False
            if self.queue:
                nodes = nodes_spanned(self.queue[0].run_layout, self.space.allocation)
                if room_for(self.backend, nodes) <= 0:
                    return False
                self._launch(self.queue.popleft())
                continue
            if room_for(self.backend, 1) <= 0:
                return False
            proposals = self._proposals(1)
            if not proposals:
                return True
            self.queue.extend(self._add(proposals))
        return False

    def _proposals(self, n: int) -> list[Proposal]:
        """Up to ``n`` proposals: first those the store could not take when they came."""
        if not self._unadded:
            return self.strategy.ask(n)
        return [self._unadded.popleft() for _ in range(min(n, len(self._unadded)))]

    def _add(self, proposals: list[Proposal]) -> list[TrialRecord]:
        """Record the proposals as queued trials; those that break a rule are finished at
        once as infeasible (and told). Returns the ones to run; those the store could not
        take (it is down) wait for it in :attr:`_unadded`."""
        runnable = []
        for index, proposal in enumerate(proposals):
            try:
                record = self._stored(
                    self.store.add_trial,
                    self.campaign.id,
                    proposal.layout,
                    predicted=_prediction(proposal),
                    origin=proposal.origin,
                    proxy_dp=None if proposal.proxy is None else proposal.proxy.dp,
                )
            except StoreUnavailableError:
                self._unadded.extend(proposals[index:])
                break
            problems = layout_problems(self.space, proposal.layout)
            if problems:
                result = TrialResult(status=TrialState.INFEASIBLE, error="; ".join(problems))
                self.unwritten.append(_Unwritten(record, result, judged=True))
            else:
                runnable.append(record)
        self._flush()
        return runnable

    def _launch(self, record: TrialRecord) -> None:
        spec = TrialSpec(
            trial_id=f"{self._slug}-{record.number:05d}-a{record.attempt + 1}",
            model=self.space.model,
            layout=record.run_layout,
            allocation=self.space.allocation,
            trainer=dict(self.space.trainer),
            timeout_s=self.trial_timeout_s,
            seed=self.campaign.seed,
            memory_cap_bytes=self.space.memory_cap_bytes,
            launch_dir=self.campaign.settings.get("launch_dir"),
        )
        hosts = self.backend.submit(spec)
        self._no_room_since = None
        # A trial the store could not mark running runs all the same: it stays queued there,
        # and its result is recorded from that state.
        self.running[spec.trial_id] = record
        with contextlib.suppress(StoreUnavailableError):
            self.running[spec.trial_id] = self._stored(
                self.store.mark_running, record.id, hosts, attempt=record.attempt + 1
            )

    def _record(self, finished: list[Finished]) -> None:
        """Take the backend's finished trials; they are written (and told) by
        :meth:`_flush` now, or when the store is back."""
        for item in finished:
            record = self.running.pop(item.trial_id, None)
            if record is None:  # cancelled, or not ours
                continue
            result = plausible_result(
                item.result,
                objective=self.metric,
                peak_flops_per_device=self.space.allocation.peak_flops_per_device,
            )
            if result.status is TrialState.ERROR and self.stop.reason in JOB_ENDING:
                # Every process of the job is being stopped: a rank that failed meanwhile
                # lost its peer to the same signal (e.g. gloo's "Connection closed by peer").
                result = dataclasses.replace(
                    result,
                    status=TrialState.INTERRUPTED,
                    error=f"{result.error} (while the job ended: {self.stop.reason})",
                )
            if result.status is not TrialState.INTERRUPTED:
                result = self.strategy.record_result(record, result)
            objective = result.objective(self.metric)
            value = objective if isinstance(objective, float) else None
            self.unwritten.append(_Unwritten(record, result, value))
        # A drain ends this session: what its last results teach the strategy is learnt
        # again from the store when the campaign continues, so its grace goes to recording
        # them, not to refitting DeepHyper and the residual field (a second of CPU for a
        # first result on 2 idle cores, many on a loaded node); _flush tells nothing then.
        if self.outage.due_in_s() == 0:
            self._flush(tell_empty=True)

    def _count(self, record: TrialRecord) -> None:
        self.finished += 1
        self.states[record.state] += 1
        if record.state.failed:
            self.failed += 1
        if record.objective is not None and (self.best is None or record.objective > self.best[0]):
            self.best = (record.objective, record.layout)
            self.best_record = record

    def _drain(self, outcome: Outcome) -> Outcome:
        """Let running trials finish within the grace period; interrupt the rest."""
        self._draining = True
        self.progress.message(
            f"{self.stop.reason}: starting no new trial; waiting up to "
            f"{self.settings.grace_s:g} s for {len(self.running)} running"
        )
        deadline = (self.stop.since or time.monotonic()) + self.settings.grace_s
        while self.running and not self.stop.urgent:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.lease.check()
            self._record(self._poll(min(self.settings.poll_s, left)))
            self.progress.update(self.snapshot())
        cancelled = len(self.running)
        for trial_id in list(self.running):
            self.backend.cancel(trial_id)
        self.running.clear()
        self.lease.check()
        self._flush()
        try:
            if self.unwritten:
                raise StoreUnavailableError(self.outage.error or "the store is unreachable")
            self.interrupted = self._stored(self.store.mark_interrupted, self.campaign.id)
        except StoreUnavailableError:
            # The next session interrupts and re-queues what the store still shows running.
            self.interrupted = cancelled
            self._keep_unwritten()
            outcome = Outcome.STORE_DOWN
        self.interrupted += self._interrupted_outside
        if self.finished >= self.settings.budget and not self.interrupted:
            # The last trials finished within the grace: nothing is left for a resume (a job
            # chain would otherwise spend a job finding that out).
            return Outcome.BUDGET
        return outcome

    def _keep_unwritten(self) -> None:
        """Keep the finished results the store did not take in the campaign's file, and
        say how many and where (:attr:`detail`); interrupted trials need no keeping."""
        kept = [
            KeptResult(item.record, item.result, item.objective)
            for item in self.unwritten
            if item.result.status is not TrialState.INTERRUPTED
        ]
        self._interrupted_outside += len(self.unwritten) - len(kept)
        lasted = (
            f"the store was unreachable for {self.outage.lasted_s:.0f} s; its last error: "
            f"{self.outage.error}"
        )
        if not kept:
            self.detail = f"every finished result was written; {lasted}"
            return
        try:
            path = keep(self.store, self.campaign, kept)
        except OSError as error:
            self.detail = (
                f"{len(kept)} finished result(s) could not be written, nor kept in a file "
                f"({error}): they are lost, and their layouts run again\n{lasted}"
            )
            return
        self.detail = (
            f"{len(kept)} finished result(s) could not be written and are kept in {path}: "
            f"`parsearch resume` records them without running them again\n{lasted}"
        )

    def _timed_out(self) -> bool:
        limit = self.settings.timeout_s
        return limit is not None and time.monotonic() - self._started >= limit

    def _poll_timeout(self) -> float:
        """Wake at least every ``poll_s`` (signals, lease, display), sooner at the deadline."""
        wait = self.settings.poll_s
        if self.settings.timeout_s is not None:
            left = self.settings.timeout_s - (time.monotonic() - self._started)
            wait = min(wait, max(left, 0.0))
        return wait

    def snapshot(self) -> Snapshot:
        value, layout = self.best if self.best else (None, None)
        return Snapshot(
            finished=self.finished,
            budget=self.settings.budget,
            running=len(self.running),
            failed=self.failed,
            best_value=value,
            best_layout=layout,
            metric=self.metric,
            eta_s=self._eta_s(),
        )

    def _eta_s(self) -> float | None:
        """Remaining trials at this session's finishing rate as of the last finish, counted
        down since (a rate taken now would fall while a trial runs, and the ETA rise)."""
        if not self._finished_here:
            return None
        rate = self._finished_here / max(1e-9, self._last_finish - self._started)
        at_last_finish = max(0, self.settings.budget - self.finished) / rate
        return max(0.0, at_last_finish - (time.monotonic() - self._last_finish))


def _prediction(proposal: Proposal) -> dict | None:
    return None if proposal.prediction is None else proposal.prediction.to_dict()
