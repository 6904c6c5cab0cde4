"""Proxy mode: explore with proxy trials on fewer nodes, confirm the best at full scale.

A campaign's cost is node-hours, and a full-scale trial holds the whole allocation for one
layout. :class:`ProxyPhase` wraps a strategy (``default`` usually) and turns each of its
proposals into a *proxy* (the same ``tp``, ``pp``, ``mbs``, ``gas`` on the fewest
data-parallel replicas predicted to fit, :func:`~parsearch.estimate.proxy.choose_proxy`),
so several run at once on the nodes one full-scale trial would hold. The wrapped strategy
is told each proxy's full-scale figures as the estimate predicts them from the proxy's
measurement (:func:`~parsearch.estimate.proxy.full_scale_figures`), times the correction
learnt from confirmations.

Confirmations are full-scale trials of layouts a proxy measured, best predicted first:

* the first once the first ``explore_first`` proxies (the wrapped strategy's first seeds,
  which differ in tp and pp) are all in: no other proxy starts before it, since a
  confirmation needs the whole allocation and a later, longer proxy would hold it back;
* another whenever a proxy is predicted more than ``margin`` above the best confirmed
  figure (one confirmation at a time, so each learns from the last's correction);
* the last trial of the budget is a confirmation while none has succeeded, so that a
  campaign's answer is a full-scale measurement unless the budget ends first.

Each confirmation gives a (predicted, measured) pair, and the correction is their
geometric mean ratio (:func:`~parsearch.estimate.proxy.learned_correction`). A proxy that
ran out of memory condemns its layout only when nothing is dp-sharded
(:func:`~parsearch.estimate.proxy.proxy_oom_is_full_scale`); otherwise the layout is
measured again on the next larger proxy, or, with none smaller than the allocation, given
up as out of memory (full-scale trials are kept for confirmations).

The state is rebuilt from the store's trials on resume (:meth:`ProxyPhase.replay`), in
trial order, so a resumed campaign decides as the interrupted one would have.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Protocol

from parsearch.config import ParallelLayout
from parsearch.estimate.proxy import (
    ProxyPlan,
    choose_proxy,
    fidelity_record,
    full_scale_figures,
    learned_correction,
    nodes_for,
    proxy_oom_is_full_scale,
)
from parsearch.result import TrialResult, TrialState
from parsearch.search.optimizer import Objective
from parsearch.search.strategy import Proposal, Strategy


class TrialLike(Protocol):
    """What :class:`ProxyPhase` reads of a stored trial (a ``TrialRecord``)."""

    @property
    def layout(self) -> ParallelLayout: ...
    @property
    def proxy_dp(self) -> int | None: ...
    @property
    def state(self) -> TrialState: ...
    @property
    def objective(self) -> float | None: ...
    @property
    def metrics(self) -> dict: ...


class ProxyPhase(Strategy):
    """``inner``'s proposals measured by proxies first, the best confirmed at full scale."""

    name = "proxy"

    def __init__(
        self,
        inner: Strategy,
        *,
        budget: int | None = None,
        margin: float = 0.02,
        explore_first: int | None = None,
    ):
        super().__init__(inner.space, seed=inner.seed)
        self.inner = inner
        self.budget = budget
        self.margin = margin
        self.explore_first = explore_first or min(4, int(getattr(inner, "n_seeds", 4)))
        self._made = 0  # trials started (proxies and full scale), against the budget
        self._layouts: dict[str, ParallelLayout] = {}
        self._predicted: dict[str, float] = {}  # full key -> uncorrected full-scale objective
        self._proxy_running: set[str] = set()
        self._full_running: set[str] = set()
        self._measured: dict[str, float | None] = {}  # full key -> full-scale objective
        self._retry: dict[str, int] = {}  # full key -> smallest dp of its next proxy
        self._judged: set[str] = set()  # failed for good: never confirmed
        self._pairs: list[tuple[float, float]] = []  # (predicted, measured) objectives

    # -- what the driver asks -----------------------------------------------------------------

    @property
    def correction(self) -> float:
        """Full-scale measured over proxy-predicted throughput, learnt from confirmations."""
        return learned_correction(self._pairs)

    def ask(self, n: int) -> list[Proposal]:
        proposals: list[Proposal] = []
        while len(proposals) < n:
            proposal = self._next()
            if proposal is None:
                break
            proposals.append(proposal)
            self._started(proposal.layout, None if proposal.proxy is None else proposal.proxy.dp)
        return proposals

    def _propose(self, n: int) -> Iterable[Proposal]:  # ask is overridden whole
        return ()

    def _next(self) -> Proposal | None:
        if self._retry:
            key, min_dp = next(iter(self._retry.items()))
            del self._retry[key]
            return self._measure(self._layouts[key], "retry", min_dp)
        candidate = self._confirmation()
        if candidate is not None:
            return Proposal(candidate, "confirm", self.space.predict(candidate))
        if self._reserved():
            if self._proxy_running or self._full_running:
                return None  # the last trial confirms what the running proxies find
            return next(iter(self.inner.ask(1)), None)  # nothing to confirm: full scale
        first_wave = not self._measured and len(self._layouts) >= self.explore_first
        if first_wave and (self._proxy_running or self._full_running):
            return None  # the first wave decides the first confirmation: nothing delays it
        for proposal in self.inner.ask(1):
            measured = self._measure(proposal.layout, proposal.origin, 1)
            return dataclasses.replace(measured, prediction=proposal.prediction)
        return None

    def _measure(self, layout: ParallelLayout, origin: str, min_dp: int) -> Proposal:
        """A proxy of ``layout`` (the smallest predicted to fit, ``min_dp`` replicas or
        more), or the layout itself when no proxy is smaller than it."""
        space = self.space
        plan = choose_proxy(space.model, layout, space.allocation, space.estimate, min_dp)
        return Proposal(layout, origin, None if plan else space.predict(layout), proxy=plan)

    def _left(self) -> int | None:
        return None if self.budget is None else self.budget - self._made

    def _reserved(self) -> bool:
        """Whether what is left of the budget is kept for a confirmation: the last trial
        confirms the best proxy predicted above every confirmed figure (or any, while none
        succeeded), once every running proxy is in."""
        left = self._left()
        if left is None or left > 1:
            return False
        best = max((v for v in self._measured.values() if v is not None), default=None)
        correction = self.correction
        return (
            best is None
            or any(
                value * correction > best
                for key, value in self._predicted.items()
                if key not in self._measured and key not in self._judged
            )
            or bool(self._proxy_running)
        )

    def _confirmation(self) -> ParallelLayout | None:
        """The next layout to confirm at full scale, if now is the time for one."""
        waiting = {
            key: value * self.correction
            for key, value in self._predicted.items()
            if key not in self._measured and key not in self._full_running
            and key not in self._judged
        }  # fmt: skip
        if not waiting:
            return None
        key = max(waiting, key=lambda k: waiting[k])
        if self._reserved():  # the best of every proxy started, once they are all in
            best = max((v for v in self._measured.values() if v is not None), default=None)
            if self._proxy_running or (best is not None and waiting[key] <= best):
                return None
            return self._layouts[key]
        if self._full_running or (
            len(self._predicted) < self.explore_first and self._proxy_running
        ):
            return None
        best = max((v for v in self._measured.values() if v is not None), default=None)
        if best is None or waiting[key] > best * (1 + self.margin):
            return self._layouts[key]
        return None

    # -- what finished ------------------------------------------------------------------------

    def full_scale_result(self, record: TrialLike, result: TrialResult) -> TrialResult:
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

    def settle(self, finished: Sequence[tuple[TrialLike, TrialResult]]) -> None:
        """Learn from finished trials (as recorded, after :meth:`full_scale_result`) and
        tell the wrapped strategy what they say of each layout at full scale."""
        observed: list[tuple[ParallelLayout, TrialResult]] = []
        told: list[tuple[ParallelLayout, Objective]] = []
        for record, result in finished:
            key = record.layout.key()
            value = result.objective(self.space.objective)
            if record.proxy_dp is not None:
                self._proxy_running.discard(key)
                # Not a verdict when the smaller shard may be why: a larger proxy tells. With
                # none, only a full-scale trial could, and those are kept for confirmations:
                # the wrapped strategy hears it ran out.
                if result.status is TrialState.OOM and self._retried(record):
                    continue
                if isinstance(value, float):
                    correction = float(result.metrics.get("fidelity", {}).get("correction", 1))
                    self._predicted[key] = value / correction
                else:
                    self._judged.add(key)
            else:
                self._full_running.discard(key)
                self._measured[key] = value if isinstance(value, float) else None
                if key in self._predicted:
                    if isinstance(value, float):
                        self._pairs.append((self._predicted[key], value))
                    continue  # the wrapped strategy was told of it by its proxy
            observed.append((record.layout, result))
            told.append((record.layout, value))
        if told:
            self.inner.observe(observed)
            self.inner.tell(told)

    def _retried(self, record: TrialLike) -> bool:
        """Whether a proxy's out-of-memory is measured again on a larger proxy (when
        nothing condemns the layout and one is left)."""
        space, dp = self.space, record.proxy_dp
        if dp is None or self._condemns(record):
            return False
        if choose_proxy(space.model, record.layout, space.allocation, space.estimate, dp + 1):
            self._retry[record.layout.key()] = dp + 1
            return True
        return False

    def _condemns(self, record: TrialLike) -> bool:
        plan = self._plan(record)
        space = self.space
        return plan is None or proxy_oom_is_full_scale(
            space.model, plan, space.allocation, space.estimate
        )

    def _started(self, layout: ParallelLayout, proxy_dp: int | None) -> None:
        key = layout.key()
        self._made += 1
        self._layouts[key] = layout
        self._retry.pop(key, None)
        (self._full_running if proxy_dp is None else self._proxy_running).add(key)

    def replay(self, history: Sequence[TrialLike]) -> None:
        """Rebuild the state from a campaign's stored trials, in their order (resume)."""
        self.inner.exclude(record.layout for record in history)
        for record in history:
            self._started(record.layout, record.proxy_dp)
            if record.state.finished:
                self.settle([(record, TrialResult(record.state, record.metrics))])

    # -- the Strategy interface ---------------------------------------------------------------

    def exclude(self, layouts: Iterable[ParallelLayout]) -> None:
        self.inner.exclude(layouts)

    def observe(self, results: Sequence[tuple[ParallelLayout, TrialResult]]) -> None:
        """Unused: :meth:`settle` needs the records (proxy or full scale), not layouts."""

    def tell(self, results: Sequence[tuple[ParallelLayout, Objective]]) -> None:
        """Unused: see :meth:`observe`."""

    def allows(self, layout: ParallelLayout) -> bool:
        return self.inner.allows(layout)

    def close(self) -> None:
        self.inner.close()
