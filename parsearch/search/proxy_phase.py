"""Proxy mode: explore with proxy trials on fewer nodes, confirm the best at full scale.

A campaign's cost is node-hours, and a full-scale trial holds the whole allocation for one
layout. :class:`ProxyPhase` wraps a strategy (``default`` usually) and turns each of its
proposals into a *proxy* (the same ``tp``, ``pp``, ``mbs``, ``gas`` on the fewest
data-parallel replicas predicted to fit, with the estimate's memory scaled by what runs
needed over it so far, :meth:`ProxyPhase._proxy_plan`), so several run at once on the
nodes one full-scale trial would hold. The wrapped strategy is told each proxy's
full-scale figures as the estimate predicts them from the proxy's measurement
(:func:`~parsearch.estimate.proxy.full_scale_figures`), times the correction learnt from
confirmations.

The campaign opens with the wrapped strategy's first pick measured at full scale
(``open_full_scale``): where the estimate ranks the machine's layouts right, that pick is
already the answer, and a proxy campaign then costs what full-scale search costs instead of
a wave of proxies and a confirmation more (``benchmarks/README.md``, proxy campaigns); where
it does not, the opening is the bar every proxy's prediction must clear to be confirmed. A
budget too small for the opening, its calibration, a first wave and a confirmation has
no opening.

Confirmations are full-scale trials of layouts a proxy measured (or whose proxies all ran
out of memory where full scale may fit: below), most likely to beat the best first:

* the first once the first wave is all in (the wrapped strategy's first ``explore_first``
  picks, which differ in tp and pp, and the opening's calibration), of its best proxy if
  that is likely to beat the opening (below): no other proxy starts before it, since a
  confirmation needs the whole allocation and a later, longer proxy would hold it back;
* another whenever a proxy's prediction, raised by how far predictions have missed so far
  (:func:`~parsearch.estimate.proxy.learned_spread`: one global correction cannot fix an
  error that depends on dp and placement), is more than ``margin`` above the best
  confirmed figure (one confirmation at a time, so each learns from the last's);
* the last trial of the budget confirms the best proxy that may still beat every
  confirmed figure (within two spreads: no later trial could), or any while none has
  succeeded, so that a campaign's answer is a full-scale measurement unless the budget
  ends first;
* whenever the wrapped strategy has nothing more to propose (every layout tried, or
  ``--settle`` expects none to beat the best), each that may still beat the best within
  two spreads, so that neither the budget's end nor ``--settle`` leaves a layout of higher
  expected gain unconfirmed (:attr:`ProxyPhase.settled`).

Proxies are placed as nodes free up (the backend's
:class:`~parsearch.search.strategy.Placement`, which the driver hands every strategy): the
first wave starts its longest predicted proxy first, so that the wave ends together;
later, a pick that needs more nodes than are free waits while up to ``OVERTAKE`` smaller
ones start beside the running proxies (a backfill), then is started first. While running
proxies drain before a confirmation (the first wave's, or any later one), a proxy
starts on the nodes they free if it is expected to end before the last of them does, with
``DRAIN_SAFETY`` to spare: how long a run takes is learnt from the runs that finished, on
the backend's ``clock`` (:func:`expected_run_s`).

Each confirmation (and the opening's calibration: a proxy of the opening, run with the
first wave) gives a (predicted, measured) pair, and the correction is their geometric mean
ratio (:func:`~parsearch.estimate.proxy.learned_correction`). A proxy that
ran out of memory condemns its layout only when nothing is dp-sharded
(:func:`~parsearch.estimate.proxy.proxy_oom_is_full_scale`). Otherwise the smaller shard
may be why (under ZeRO-1 a rank holds more optimizer state at a lower dp): the layout is
measured again on the next larger proxy expected to fit, or, with none left, waits for a
full-scale trial, valued at the estimate's figure corrected and spread by the full-scale
trials so far, and confirmed when that may beat the best; the wrapped strategy hears
nothing of it until then (told an out-of-memory, it would learn that full scale does not
fit). A confirmation that fails is told to it (full scale's own verdict on the layout).

The state is rebuilt from the store's trials on resume (:meth:`ProxyPhase.start`), in
trial order, so a resumed campaign decides as the interrupted one would have.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence

from parsearch.config import ParallelLayout
from parsearch.estimate.proxy import (
    PRIOR_SPREAD,
    ProxyPlan,
    fidelity_record,
    full_scale_figures,
    learned_correction,
    learned_spread,
    nodes_for,
    predict_run,
    proxy_dps,
    proxy_oom_is_full_scale,
)
from parsearch.result import TrialResult, TrialState
from parsearch.search.optimizer import Objective
from parsearch.search.strategy import Placement, Proposal, Strategy, TrialLike

OVERTAKE = 3  # smaller picks that may start before one waiting for more nodes
DRAIN_SAFETY = 1.2  # a drain fill must be expected to end this much before the drain does
# A layout is confirmed at full scale while its expected full-scale figure, this many spreads
# up, beats the best confirmed one: a proxy's miss is its own noise and the full-scale
# run's, and a layout's DP reduction the estimate gets wrong by its own factor, so one
# spread (one chance in six of being above) leaves the optimum unconfirmed too often
# (``benchmarks/README.md``, proxy campaigns).
CONFIRM_SPREADS = 2.0
# One run's throughput from the next (noise, placement): a proxy's prediction compares two
# runs, so it cannot miss full scale by less than about sqrt(2) of this, whatever a few
# confirmations that happened to agree say; the prior adds the estimate's DP-reduction error.
RUN_NOISE = 0.05
SPREAD_FLOOR = math.sqrt(2) * RUN_NOISE
PROXY_PRIOR_SPREAD = math.sqrt(PRIOR_SPREAD**2 + SPREAD_FLOOR**2)


def expected_run_s(runs: Sequence[tuple[float, float]], step_s: float) -> float | None:
    """How long a run whose step the estimate predicts at ``step_s`` holds its nodes, from
    finished runs' ``(predicted step, held seconds)``: a least-squares line (start-up plus
    a multiple of the predicted step; every run times as many steps), or proportional when
    the runs' predictions do not spread. None with fewer than two runs."""
    if len(runs) < 2:
        return None
    mean_x = sum(x for x, _ in runs) / len(runs)
    mean_y = sum(y for _, y in runs) / len(runs)
    spread = sum((x - mean_x) ** 2 for x, _ in runs)
    if spread <= 1e-9 * mean_x**2:
        return mean_y / mean_x * step_s
    slope = max(sum((x - mean_x) * (y - mean_y) for x, y in runs) / spread, 0.0)
    return max(mean_y - slope * mean_x, 0.0) + slope * step_s


@dataclasses.dataclass(frozen=True)
class Run:
    """A trial this phase started and has not seen finish."""

    nodes: int
    since: float | None  # on the backend's clock; None when started before a resume
    step_s: float  # the estimate's step of the run (proxy or full scale), to time it


class ProxyPhase(Strategy):
    """``inner``'s proposals measured by proxies first, the best confirmed at full scale."""

    name = "proxy"
    sized = True

    def __init__(
        self,
        inner: Strategy,
        *,
        budget: int | None = None,
        margin: float = 0.02,
        explore_first: int | None = None,
        open_full_scale: bool = True,
    ):
        super().__init__(inner.space, seed=inner.seed)
        self.inner = inner
        self.budget = budget
        self.margin = margin
        self.explore_first = explore_first or min(4, int(getattr(inner, "n_seeds", 4)))
        self.open_full_scale = open_full_scale
        self._made = 0  # trials started (proxies and full scale), against the budget
        self._layouts: dict[str, ParallelLayout] = {}
        self._proxy_order: dict[str, None] = {}  # keys measured by proxy, first started first
        self._opening: str | None = None  # the key of the latest opening, run at full scale
        self._openings = 0  # picks that opened the campaign at full scale
        self._predicted: dict[str, float] = {}  # full key -> uncorrected full-scale objective
        self._proxy_running: set[str] = set()
        self._full_running: set[str] = set()
        self._measured: dict[str, float | None] = {}  # full key -> full-scale objective
        self._retry: dict[str, int] = {}  # full key -> smallest dp of its next proxy
        self._judged: set[str] = set()  # failed for good: never confirmed
        self._pairs: list[tuple[float, float]] = []  # (predicted, measured) objectives
        self._wave_queue: list[Proposal] | None = None  # the first wave's, once chosen
        self._held: list[Proposal] = []  # picks waiting for more free nodes than there are
        self._overtaken = 0  # picks started since the oldest held one was held
        self._runs: dict[str, Run] = {}  # key -> its running trial
        self.clock: Callable[[], float] | None = None  # the backend's time, once placed
        self._durations: list[tuple[float, float]] = []  # finished: (predicted step, held s)
        self._estimate_only: set[str] = set()  # no proxy fits, full scale may: the estimate's
        self._estimate_pairs: list[tuple[float, float]] = []  # (estimate's, measured) full
        self._memory_ratio = 1.0  # what runs needed over the estimate's peak, at most
        self._dry = False  # the wrapped strategy proposed nothing since the last result

    # -- what the driver asks -----------------------------------------------------------------

    @property
    def correction(self) -> float:
        """Full-scale measured over proxy-predicted throughput, learnt from confirmations."""
        return learned_correction(self._pairs)

    @property
    def spread(self) -> float:
        """How far (log) a corrected proxy prediction may miss full scale: the spread of the
        confirmations' misses about the correction, pooled with :data:`PROXY_PRIOR_SPREAD`
        (:func:`learned_spread`), never below :data:`SPREAD_FLOOR`."""
        return max(learned_spread(self._pairs, prior=PROXY_PRIOR_SPREAD), SPREAD_FLOOR)

    def ask(self, n: int) -> list[Proposal]:
        proposals: list[Proposal] = []
        while len(proposals) < n:
            proposal = self._next()
            if proposal is None:
                break
            proposals.append(proposal)
            proxy_dp = None if proposal.proxy is None else proposal.proxy.dp
            self._started(proposal.layout, proxy_dp, None if self.clock is None else self.clock())
        return proposals

    def _propose(self, n: int) -> Iterable[Proposal]:  # ask is overridden whole
        return ()

    def _next(self) -> Proposal | None:
        if self._opening_wanted():  # the estimate's first pick (or next), as is
            return next(iter(self._inner_ask(1)), None)
        if self._opening is not None and self._opening in self._full_running:
            return None  # it holds the allocation, and sets the bar
        while self._retry:
            key, min_dp = next(iter(self._retry.items()))
            del self._retry[key]
            if self._proxy_plan(self._layouts[key], min_dp) is not None:
                return self._measure(self._layouts[key], "retry", min_dp)
            self._estimate_only.add(key)  # no proxy left that is expected to fit
        candidate = self._confirmation()
        if candidate is not None:  # it waits for every running proxy: fill that time
            drain_fill = self._drain_fill()
            return drain_fill or Proposal(candidate, "confirm", self.space.predict(candidate))
        if self._reserved():
            if self._proxy_running or self._full_running:
                return None  # the last trial confirms what the running proxies find
            return next(iter(self._inner_ask(1)), None)  # nothing to confirm: full scale
        if self._first_wave_pending():
            return self._drain_fill()  # the first wave decides the first confirmation
        if self._wave_queue is None:
            self._wave_queue = self._first_wave()
        if self._wave_queue:
            return self._fitting(self._wave_queue) or self._wave_queue.pop(0)
        proposal = self._backfilled()
        if proposal is None and self._dry and not self._held:
            candidate = self._confirmation()  # nothing left to propose: what may beat the best
            if candidate is not None:
                return Proposal(candidate, "confirm", self.space.predict(candidate))
        return proposal

    def _inner_ask(self, n: int) -> list[Proposal]:
        """The wrapped strategy's next ``n`` picks. Fewer: it has nothing more to propose
        (for now, when it settles: until it hears of another result), and what is left to
        do is confirm what the proxies found."""
        proposals = self.inner.ask(n) if n > 0 else []
        self._dry = self._dry or len(proposals) < n
        return proposals

    def _backfilled(self, by: float | None = None) -> Proposal | None:
        """The wrapped strategy's next pick that fits the nodes free now (and is expected
        to end ``by`` then, when given). One that does not is held and started first once
        it fits, so that a proxy waiting for half the allocation does not leave the other
        nodes idle while smaller ones could run; the oldest held is overtaken by at most
        ``OVERTAKE`` of them, then waited for."""

        def fits(proposal: Proposal) -> bool:
            return self._fits(proposal) and (by is None or self._ends_by(proposal, by))

        waiting = self._held[:1] if self._overtaken >= OVERTAKE else self._held
        for index, proposal in enumerate(waiting):
            if fits(proposal):
                self._overtaken = 0 if index == 0 else self._overtaken + 1
                return self._held.pop(index)
        while self._overtaken < OVERTAKE and len(self._held) < OVERTAKE:
            proposal = next(iter(self._proxies_of(self._inner_ask(1))), None)
            if proposal is None:
                break
            if fits(proposal):
                self._overtaken += bool(self._held)
                return proposal
            self._held.append(proposal)
        if by is not None or self._proxy_running or self._full_running or not self._held:
            return None  # a running trial frees the nodes the held one waits for
        self._overtaken = 0
        return self._held.pop(0)  # nothing runs: the backend's own nodes are too few

    def _drain_fill(self) -> Proposal | None:
        """A proxy to start while the running ones drain before a confirmation (which
        needs every node), when it is expected to end before the last of them does: the
        nodes they free would otherwise idle. None without a clock, before two runs have
        taught how long runs take, or when the budget's last trials are for
        confirmations."""
        left = self._left()
        if self.clock is None or not self._proxy_running or self._full_running:
            return None
        if left is not None and left <= 2:
            return None
        end = self._drain_end()
        return None if end is None else self._backfilled(by=end)

    def _drain_end(self) -> float | None:
        """When the last running trial is expected to end, on the backend's clock."""
        ends = []
        for key in self._proxy_running | self._full_running:
            run = self._runs[key]
            if run.since is None:  # started before a resume: its end is unknown
                return None
            expected = expected_run_s(self._durations, run.step_s)
            if expected is None:
                return None
            ends.append(run.since + expected)
        return max(ends, default=None)

    def _ends_by(self, proposal: Proposal, end: float) -> bool:
        assert self.clock is not None  # a drain end was found on it
        expected = expected_run_s(self._durations, self._predicted_run_s(proposal))
        return expected is not None and self.clock() + DRAIN_SAFETY * expected <= end

    def _fitting(self, queue: list[Proposal]) -> Proposal | None:
        """The first proposal of ``queue`` whose run fits the nodes free now, taken off it."""
        for index, proposal in enumerate(queue):
            if self._fits(proposal):
                return queue.pop(index)
        return None

    def _run_nodes(self, proposal: Proposal) -> int:
        per_node = self.space.allocation.devices_per_node
        return proposal.proxy.nodes if proposal.proxy else nodes_for(proposal.layout, per_node)

    def _fits(self, proposal: Proposal) -> bool:
        """Whether the backend has room for a proposal's run now: what ``room`` says (the
        driver sets it to the backend's placement, which knows lost nodes and places a
        ``local`` backend's trials by slot), or else the allocation's nodes that no trial
        of this phase holds (a phase driven by hand)."""
        nodes = self._run_nodes(proposal)
        if self.placement.room is not None:
            return self.placement.room(nodes) > 0
        return nodes <= self.space.allocation.nodes - sum(r.nodes for r in self._runs.values())

    def _proxies_of(self, proposals: Iterable[Proposal]) -> list[Proposal]:
        """The wrapped strategy's proposals, each to be measured by its smallest proxy."""
        return [
            dataclasses.replace(
                self._measure(proposal.layout, proposal.origin, 1), prediction=proposal.prediction
            )
            for proposal in proposals
        ]

    def _first_wave(self) -> list[Proposal]:
        """The first wave's proxies not yet started (the opening's calibration and the
        wrapped strategy's first picks), longest predicted first: they start as nodes free
        up, and a long proxy started last would keep the allocation half idle while it
        finishes, and hold back the first confirmation (longest-first packs a wave so that
        its proxies end close together)."""
        calibration = self._calibration()
        wave = [] if calibration is None else [calibration]
        started = sum(1 for key in self._proxy_order if key != self._opening)
        wanted = self.explore_first - started
        left = self._left()
        if left is not None:
            wanted = min(wanted, left - 1 - len(wave))  # the last trial confirms
        wave += self._proxies_of(self._inner_ask(wanted))
        return sorted(wave, key=self._predicted_run_s, reverse=True)

    def _predicted_run_s(self, proposal: Proposal) -> float:
        """The estimate's step time of the run a proposal starts (its proxy's, if any)."""
        return self._run_step_s(proposal.proxy.proxy_layout if proposal.proxy else proposal.layout)

    def _run_step_s(self, run: ParallelLayout) -> float:
        space = self.space
        return predict_run(space.model, run, space.allocation, space.estimate).step_time_s

    def _calibration(self) -> Proposal | None:
        """A proxy of the opening, once it measured, so that the first wave's predictions
        carry a correction before any is compared with the opening's figure (without one, an
        estimate that errs low for every proxy would confirm none)."""
        key = self._opening
        if key is None or key in self._proxy_order or self._measured.get(key) is None:
            return None
        plan = self._proxy_plan(self._layouts[key])
        return None if plan is None else self._measure(self._layouts[key], "calibrate", 1)

    def _first_wave_pending(self) -> bool:
        """Whether the first wave's proxies are started but not all in, or the first
        confirmation of a proxy is running: no other proxy starts until then."""
        wave = list(self._proxy_order)[: self._wave]
        if len(wave) < self._wave:
            return False
        if any(key in self._proxy_running for key in wave):
            return True
        confirmed = any(k in self._measured for k in self._proxy_order if k != self._opening)
        return not confirmed and any(key in self._full_running for key in self._proxy_order)

    def _measure(self, layout: ParallelLayout, origin: str, min_dp: int) -> Proposal:
        """A proxy of ``layout`` (:meth:`_proxy_plan`), or the layout itself when no proxy
        smaller than it is expected to fit."""
        plan = self._proxy_plan(layout, min_dp)
        return Proposal(layout, origin, None if plan else self.space.predict(layout), proxy=plan)

    def _proxy_plan(self, layout: ParallelLayout, min_dp: int = 1) -> ProxyPlan | None:
        """The smallest proxy of ``layout`` (``min_dp`` replicas or more) on fewer nodes
        than the layout, whose predicted peak times what runs have shown the estimate to
        miss (:attr:`memory_ratio`) fits: the estimate's memory has no learning of its own,
        and under ZeRO a proxy holds more per rank than full scale, so the smallest proxy
        it expects to fit is the likeliest to run out of memory, a trial that measures
        nothing. ``None`` when none is left."""
        space = self.space
        per_node = space.allocation.devices_per_node
        full_nodes = nodes_for(layout, per_node)
        for dp in proxy_dps(layout):
            if dp < min_dp:
                continue
            plan = ProxyPlan(layout, dp, nodes_for(dataclasses.replace(layout, dp=dp), per_node))
            if plan.nodes >= full_nodes:
                return None
            peak = self._peak(plan.proxy_layout)
            if peak * self._memory_ratio <= space.memory_limit_bytes:
                return plan
        return None

    def _peak(self, run: ParallelLayout) -> float:
        """The estimate's peak bytes per rank of a run of ``run`` on the nodes it spans."""
        space = self.space
        return predict_run(space.model, run, space.allocation, space.estimate).memory.total

    @property
    def memory_ratio(self) -> float:
        """The most any run needed over the estimate's peak for it (at least 1): measured
        peaks, and for a run out of memory the device over its predicted peak (it needed
        more). Proxies are sized by it (:meth:`_proxy_plan`)."""
        return self._memory_ratio

    def _learn_memory(self, record: TrialLike, result: TrialResult) -> None:
        """What a finished run says of the estimate's memory (see :attr:`memory_ratio`)."""
        run = record.layout
        if record.proxy_dp is not None:
            run = dataclasses.replace(run, dp=record.proxy_dp)
        measured = result.metrics.get("peak_mem_bytes")
        if record.proxy_dp is not None:
            measured = result.metrics.get("fidelity", {}).get("measured", {}).get("peak_mem_bytes")
        if result.status is TrialState.OOM:
            measured = self.space.memory_limit_bytes
        elif not result.ok:
            return
        if isinstance(measured, int | float) and measured > 0:
            self._memory_ratio = max(self._memory_ratio, float(measured) / self._peak(run))

    @property
    def _opens(self) -> bool:
        """Whether the campaign opens at full scale: not when the opening and its
        calibration would take the first wave's room, or its confirmation's."""
        room = self.budget is None or self.budget >= self.explore_first + 3
        return self.open_full_scale and room

    def _opening_wanted(self) -> bool:
        """Whether the next trial opens the campaign at full scale: the first, and the next
        pick while every opening failed (at most ``explore_first``) and no proxy ran. With
        no full-scale figure there is no bar for a proxy to clear and nothing to calibrate
        it by, and on a machine whose memory the estimate misses the proxies, sized by it,
        run out too; a full-scale trial that fits teaches what the memory is, as it does a
        full-scale campaign."""
        if not self._opens:
            return False
        if not self._layouts:
            return True
        failed = self._opening is not None and self._measured.get(self._opening, 0.0) is None
        return failed and self._openings < self.explore_first and not self._proxy_order

    @property
    def _wave(self) -> int:
        """Proxies in the first wave: ``explore_first``, and the opening's calibration
        (none when every opening failed)."""
        opened = self._opening is not None and self._measured.get(self._opening) is not None
        return self.explore_first + opened

    def _left(self) -> int | None:
        return None if self.budget is None else self.budget - self._made

    def _reserved(self) -> bool:
        """Whether what is left of the budget is kept for a confirmation: the last trial
        confirms the best proxy that may beat every confirmed figure (any, while none
        succeeded), once every running proxy is in. A proxy in the last trial could never
        be confirmed, so it would change nothing of the campaign's answer."""
        left = self._left()
        if left is None or left > 1:
            return False
        best = self._best()
        return (
            best is None
            or any(self._may_beat_last(*expected, best) for expected in self._waiting().values())
            or bool(self._proxy_running)
        )

    def _best(self) -> float | None:
        """The best full-scale figure measured so far."""
        return max((v for v in self._measured.values() if v is not None), default=None)

    @staticmethod
    def _may_beat_last(expected: float, spread: float, best: float) -> bool:
        """Whether an expected full-scale figure may beat ``best`` when no later trial could
        confirm it instead (the budget's last trial, or the wrapped strategy has nothing
        more to propose): within two of its spreads, with no margin."""
        return expected * math.exp(2 * spread) > best

    def _waiting(self) -> dict[str, tuple[float, float]]:
        """Layouts that may be confirmed at full scale, with the full-scale figure expected
        of each and its log spread: those a proxy measured (its prediction, corrected by
        the confirmations; the spread of their misses, :func:`learned_spread`), and those
        whose proxies ran out of memory where full scale may fit (the estimate's figure,
        corrected by every full-scale trial so far, and the spread of its misses). A proxy's
        out-of-memory condemns nothing at full scale when full scale holds less per rank:
        the layout competes on what the estimate expects of it."""
        done = self._measured.keys() | self._full_running | self._judged
        correction, spread = self.correction, self.spread
        waiting = {
            key: (value * correction, spread)
            for key, value in self._predicted.items()
            if key not in done
        }
        if self._estimate_only - done:
            pairs = self._estimate_pairs
            estimate = (learned_correction(pairs), learned_spread(pairs))
            for key in self._estimate_only - done:
                waiting[key] = (self._estimated(key) * estimate[0], estimate[1])
        return waiting

    def _estimated(self, key: str) -> float:
        """The estimate's full-scale objective for a layout."""
        return float(getattr(self.space.predict(self._layouts[key]), self.space.objective))

    def _confirmation(self) -> ParallelLayout | None:
        """The next layout to confirm at full scale, if now is the time for one: the one
        highest at :data:`CONFIRM_SPREADS` spreads above its expected figure, when that is
        above the best confirmed figure by ``margin`` (by nothing when no later trial could
        confirm it instead). Where the proxies' spread is wider than the gap they must
        decide, the layouts they cannot tell apart are all measured at full scale: a
        campaign by proxies then searches as a full-scale one would, among its best."""
        waiting = self._waiting()
        if not waiting:
            return None
        best = self._best()
        if self._reserved() or self._dry:  # every proxy started: the best, once all are in
            if self._proxy_running or (self._dry and self._full_running):
                return None
            key = max(waiting, key=lambda k: waiting[k][0] * math.exp(2 * waiting[k][1]))
            if best is not None and not self._may_beat_last(*waiting[key], best):
                return None
            return self._layouts[key]
        if self._full_running or (len(self._predicted) < self._wave and self._proxy_running):
            return None
        up = CONFIRM_SPREADS
        key = max(waiting, key=lambda k: waiting[k][0] * math.exp(up * waiting[k][1]))
        expected, spread = waiting[key]
        if best is None or expected * math.exp(up * spread) > best * (1 + self.margin):
            return self._layouts[key]
        return None

    # -- what finished ------------------------------------------------------------------------

    def record_result(self, record: TrialLike, result: TrialResult) -> TrialResult:
        """What a finished trial records: a proxy's full-scale figures predicted from its
        measurement (its own in ``metrics["fidelity"]``); a full-scale trial's as measured.
        A proxy's out-of-memory is kept as such, its error saying whether it condemns the
        layout at full scale."""
        plan = self._plan(record)
        if plan is None:
            return result
        space = self.space
        if result.status is TrialState.OOM:
            verdict = proxy_oom_is_full_scale(space.model, plan, space.allocation, space.estimate)
            why = (
                "full scale holds as much per rank, so it would not fit either"
                if verdict
                else "its dp-sharded states are smaller at full scale: measured again larger"
            )
            error = f"proxy at dp{plan.dp}: {result.error or 'out of memory'} ({why})"
            return dataclasses.replace(result, error=error)
        if not result.ok:
            return result
        correction = self.correction
        metrics = full_scale_figures(
            space.model, plan, result.metrics, space.allocation, space.estimate, correction
        )
        fidelity = fidelity_record(plan, result.metrics)
        fidelity["correction"] = correction
        return dataclasses.replace(result, metrics={**metrics, "fidelity": fidelity})

    def _plan(self, record: TrialLike) -> ProxyPlan | None:
        if record.proxy_dp is None:
            return None
        layout = record.layout
        proxy = dataclasses.replace(layout, dp=record.proxy_dp)
        per_node = self.space.allocation.devices_per_node
        return ProxyPlan(layout, record.proxy_dp, nodes_for(proxy, per_node))

    def finished(self, finished: Sequence[tuple[TrialLike, TrialResult]]) -> None:
        """Learn from finished trials (as recorded, after :meth:`record_result`) and
        tell the wrapped strategy what they say of each layout at full scale."""
        observed: list[tuple[ParallelLayout, TrialResult]] = []
        told: list[tuple[ParallelLayout, Objective]] = []
        self._dry = False  # news: the wrapped strategy may propose again
        for record, result in finished:
            key = record.layout.key()
            run = self._runs.pop(key, None)
            if run is not None and run.since is not None and self.clock and result.ok:
                self._durations.append((run.step_s, self.clock() - run.since))
            self._learn_memory(record, result)
            value = result.objective(self.space.objective)
            if record.proxy_dp is not None:
                self._proxy_running.discard(key)
                # Not a verdict when the smaller shard may be why: a larger proxy tells. With
                # none, the layout waits for a full-scale trial, as its estimate deserves;
                # the wrapped strategy hears nothing of it until then (an out-of-memory
                # would teach it that full scale does not fit).
                if result.status is TrialState.OOM and not self._condemns(record):
                    if not self._retried(record):
                        self._estimate_only.add(key)
                    continue
                if isinstance(value, float):
                    correction = float(result.metrics.get("fidelity", {}).get("correction", 1))
                    self._predicted[key] = value / correction
                else:
                    self._judged.add(key)
                if key == self._opening:  # its calibration: measured at full scale first
                    if isinstance(value, float) and self._measured.get(key) is not None:
                        self._pairs.append((self._predicted[key], self._measured[key]))
                    continue  # the wrapped strategy was told of it by the opening
            else:
                self._full_running.discard(key)
                self._measured[key] = value if isinstance(value, float) else None
                if isinstance(value, float):
                    self._estimate_pairs.append((self._estimated(key), value))
                if key in self._predicted and isinstance(value, float):
                    self._pairs.append((self._predicted[key], value))
                    continue  # the wrapped strategy was told of it by its proxy
                # A confirmation that failed is told too: it heard the proxy's figure, and
                # now what full scale says of the layout's memory or time.
            observed.append((record.layout, result))
            told.append((record.layout, value))
        if told:
            self.inner.observe(observed)
            self.inner.tell(told)

    def _retried(self, record: TrialLike) -> bool:
        """Whether a proxy's out-of-memory (one that condemns nothing at full scale) is
        measured again on a larger proxy: when one is left that is expected to fit."""
        dp = record.proxy_dp
        if dp is None:
            return False
        if self._proxy_plan(record.layout, dp + 1):
            self._retry[record.layout.key()] = dp + 1
            return True
        return False

    def _condemns(self, record: TrialLike) -> bool:
        plan = self._plan(record)
        space = self.space
        return plan is None or proxy_oom_is_full_scale(
            space.model, plan, space.allocation, space.estimate
        )

    def _started(
        self, layout: ParallelLayout, proxy_dp: int | None, since: float | None = None
    ) -> None:
        """Count a trial as started (at ``since`` on the clock, when known: not on replay)."""
        key = layout.key()
        self._made += 1
        if proxy_dp is None and self._opening_wanted():
            self._opening = key
            self._openings += 1
        self._layouts[key] = layout
        self._retry.pop(key, None)
        (self._full_running if proxy_dp is None else self._proxy_running).add(key)
        ran = layout if proxy_dp is None else dataclasses.replace(layout, dp=proxy_dp)
        nodes = nodes_for(ran, self.space.allocation.devices_per_node)
        # Its predicted step serves only to time a drain, which needs its start.
        step = 0.0 if since is None else self._run_step_s(ran)
        self._runs[key] = Run(nodes, since, step)
        if proxy_dp is not None and key not in self._proxy_order:
            self._proxy_order[key] = None

    def start(self, history: Sequence[TrialLike], *, budget: int) -> None:
        """Take the campaign's budget, and rebuild the state from its stored trials, in their
        order (resume): a resumed campaign decides as the interrupted one would have."""
        self.budget = budget
        self.inner.exclude(record.layout for record in history)
        for record in history:
            self._started(record.layout, record.proxy_dp)
            if record.state.finished:
                self.finished([(record, TrialResult(record.state, record.metrics))])

    # -- the Strategy interface ---------------------------------------------------------------

    def place(self, placement: Placement) -> None:
        """Where its trials run: proxies are started when the backend has room for their
        nodes, and run times are learnt on its clock (none before: driven by hand)."""
        super().place(placement)
        self.inner.place(placement)
        self.clock = placement.clock

    def campaign_settings(self) -> dict[str, str | bool]:
        return {**self.inner.campaign_settings(), "proxy": True}

    def exclude(self, layouts: Iterable[ParallelLayout]) -> None:
        self.inner.exclude(layouts)

    def observe(self, results: Sequence[tuple[ParallelLayout, TrialResult]]) -> None:
        """Unused: :meth:`finished` needs the records (proxy or full scale), not layouts."""

    def tell(self, results: Sequence[tuple[ParallelLayout, Objective]]) -> None:
        """Unused: see :meth:`observe`."""

    def allows(self, layout: ParallelLayout) -> bool:
        return self.inner.allows(layout)

    @property
    def settled(self) -> bool:
        """Whether the campaign may end before its budget: the wrapped strategy expects no
        untried layout to beat the best, and no layout a proxy measured (or whose proxies
        ran out of memory) may beat it within two spreads. :meth:`ask` confirms those
        first, so ``--settle`` never stops while one of higher expected gain is untried
        at full scale."""
        best = self._best()
        return (
            self.inner.settled
            and best is not None
            and not any(
                self._may_beat_last(*expected, best) for expected in self._waiting().values()
            )
        )

    def close(self) -> None:
        self.inner.close()
