"""Search strategies: who decides which layout runs next.

A :class:`Strategy` owns ask/tell and the pruning predicate, so the driver never needs to know
how proposals are made, and a better strategy (online memory calibration, transfer from
another campaign) can replace one without touching the driver. Every strategy guarantees:

* no layout is proposed twice (its ``seen`` set also holds what the store already has);
* fewer than ``n`` proposals only when nothing unseen is left to propose.

``default`` searches what the rules allow and the memory estimate, calibrated online by the
trials' measurements, expects to fit; it starts from the calibrated estimate's best layouts
and lets DeepHyper propose one trial in three. ``cbo-raw`` and ``random`` are the baselines
a user without parsearch would have: DeepHyper's CBO, or uniform sampling, over the raw
product of the searched dimensions, with nothing pruned and nothing seeded.
"""

from __future__ import annotations

import abc
import itertools
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np

from parsearch.config import ParallelLayout
from parsearch.errors import ParsearchError
from parsearch.estimate import Prediction
from parsearch.estimate.proxy import ProxyPlan
from parsearch.result import TrialResult, TrialState
from parsearch.search.calibration import CalibratedEstimate
from parsearch.search.candidates import Candidate, point_of, raw_layout
from parsearch.search.optimizer import BayesianOptimizer, CBOSettings, Objective
from parsearch.search.owed import OWED_TOP, Measured, owed, owed_count
from parsearch.search.residual import (
    EstimateFrame,
    Plateau,
    ResidualField,
    log_expected_improvement,
)
from parsearch.search.warm_start import WarmStart
from parsearch.space import SearchSpace

DEFAULT_CBO = CBOSettings()
# ``--settle``: a campaign ends once no untried layout's calibrated objective, at this many
# posterior spreads of the residual field above its mean, beats the best measured.
SETTLE_SPREADS = 2.0
# A layout pruned by inference alone is tried for its expected gain only while it fits
# with at least this probability: below it, its out-of-memory trial is the likely outcome.
RESCUE_PROBABILITY = 0.1
# What DeepHyper's surrogate learns: ``estimate``, what the calibrated estimate gets wrong
# (its surrogate is the estimate plus a residual field, told log objectives); ``raw``, the
# objective itself with DeepHyper's own surrogate (``CBOSettings.surrogate_model``).
CBO_FRAMES = ("estimate", "raw")


class StrategyError(ParsearchError):
    """An unknown strategy name or setting."""

    exit_code = 2


@dataclass(frozen=True)
class Proposal:
    """A layout to try, who proposed it, and what the estimate expects of it.

    ``origin`` is ``initial`` (a seed from the estimate's ranking), ``optimizer`` (DeepHyper),
    ``estimate`` (the calibrated estimate's best untried layout), ``fallback`` (the next best
    predicted layout, when DeepHyper repeated itself), ``owed`` (one of the layouts it
    believed best before its first trial that the budget still owes a trial,
    :mod:`parsearch.search.owed`) or
    ``random``. ``prediction`` is
    ``None`` for layouts that break a rule. ``proxy`` says to measure the layout by a proxy
    trial at fewer replicas (:mod:`parsearch.search.proxy_phase`); ``None``: at full scale.
    """

    layout: ParallelLayout
    origin: str
    prediction: Prediction | None
    proxy: ProxyPlan | None = None


@dataclass(frozen=True)
class Placement:
    """Where and when a strategy's trials run, as the backend running them says.

    ``room(nodes)``: how many more trials of ``nodes`` nodes the backend starts now (it
    knows lost nodes and places a ``local`` backend's trials by slot; ``None``: unknown, a
    strategy driven by hand counts its own trials' nodes). ``clock()``: the backend's time
    in seconds, on which trials' run times are learnt (a virtual one in the node-hour
    benchmark). The driver hands one to every strategy (:meth:`Strategy.place`), so a
    strategy that sizes or times its trials needs nothing from the driver but this.
    """

    room: Callable[[int], int] | None = None
    clock: Callable[[], float] = time.monotonic


class TrialLike(Protocol):
    """What a strategy reads of a stored trial (a ``TrialRecord``)."""

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
    @property
    def origin(self) -> str: ...


def told_value(record: TrialLike) -> Objective:
    """What the optimiser is told of a stored trial: its objective, or ``"F_<state>"``."""
    if record.state is TrialState.OK and record.objective is not None:
        return float(record.objective)
    return f"F_{record.state.value}"


class Strategy(abc.ABC):
    """Owns a campaign's ask/tell loop and its pruning predicate.

    The driver talks to every strategy through this interface alone, so a new strategy
    needs no change to it: :meth:`start` with the store's trials when a session begins,
    :meth:`place` with the backend's placement and clock, :meth:`ask` for trials,
    :meth:`record_result` for what a finished trial stores, :meth:`finished` with what
    finished. ``sized`` says whether trials may span fewer nodes than the allocation.
    """

    name: ClassVar[str]
    # Whether proposals may span fewer nodes than the allocation (``Proposal.proxy``): the
    # driver then asks for one trial at a time while a node is free, and starts each once
    # the backend has room for its nodes.
    sized: ClassVar[bool] = False

    def __init__(self, space: SearchSpace, *, seed: int):
        self.space = space
        self.seed = seed
        self.seen: set[str] = set()
        self.optimizer: BayesianOptimizer | None = None
        self.placement = Placement()

    def place(self, placement: Placement) -> None:
        """Where its trials run: the backend's room and clock (the driver calls this before
        the first :meth:`ask`)."""
        self.placement = placement

    def start(self, history: Sequence[TrialLike], *, budget: int) -> None:
        """A session begins with ``history``, the campaign's stored trials in order (none
        for a new campaign), and ``budget`` trials in all: never propose what the store has,
        and learn what finished, as if it had been told live."""
        self.exclude(record.layout for record in history)
        finished = [record for record in history if record.state.finished]
        self.observe([(r.layout, TrialResult(r.state, r.metrics)) for r in finished])
        self.tell([(r.layout, told_value(r)) for r in finished])

    def record_result(self, record: TrialLike, result: TrialResult) -> TrialResult:
        """What the store records of a finished trial (a proxy's full-scale figures, say):
        the result as measured unless a strategy measures by proxy."""
        return result

    def finished(self, results: Sequence[tuple[TrialLike, TrialResult]]) -> None:
        """Trials that finished, as recorded (:meth:`record_result`): :meth:`observe` then
        :meth:`tell`, all at once."""
        if not results:
            return
        self.observe([(record.layout, result) for record, result in results])
        objective = self.space.objective
        self.tell([(record.layout, result.objective(objective)) for record, result in results])

    def campaign_settings(self) -> dict[str, str | bool]:
        """What a campaign stores of this strategy so that ``resume`` rebuilds it
        (:func:`~parsearch.search.factory.make_strategy`'s arguments): its name, whether it
        measures by proxies and whether it settles (a ``settle`` setting that is not ``None``)."""
        return {
            "strategy": self.name,
            "proxy": False,
            "settle": getattr(self, "settle", None) is not None,
        }

    def exclude(self, layouts: Iterable[ParallelLayout]) -> None:
        """Never propose these layouts (they are in the store already, say on resume)."""
        self.seen.update(layout.key() for layout in layouts)

    def ask(self, n: int) -> list[Proposal]:
        """Up to ``n`` distinct layouts never proposed before; fewer when none are left."""
        proposals: list[Proposal] = []
        if n <= 0:
            return proposals
        for proposal in self._propose(n):
            key = proposal.layout.key()
            if key not in self.seen:
                self.seen.add(key)
                proposals.append(proposal)
                if len(proposals) == n:
                    break
        return proposals

    @abc.abstractmethod
    def _propose(self, n: int) -> Iterable[Proposal]:
        """Proposals in order of preference; :meth:`ask` drops repeats and stops at ``n``.

        Implementations must yield at least ``n`` unseen layouts when that many are left.
        """

    def observe(self, results: Sequence[tuple[ParallelLayout, TrialResult]]) -> None:
        """What finished trials measured (peak memory...), given just before :meth:`tell`.

        A strategy that calibrates its estimate from measurements overrides this.
        """
        return None

    def tell(self, results: Sequence[tuple[ParallelLayout, Objective]]) -> None:
        """Finished layouts with their objective (or ``"F_<state>"``), for the optimiser."""
        if self.optimizer is not None and results:
            self.optimizer.tell([(point_of(self.space, lay), value) for lay, value in results])

    def allows(self, layout: ParallelLayout) -> bool:
        """Whether this strategy would run ``layout`` (its pruning predicate)."""
        return True

    @property
    def settled(self) -> bool:
        """Whether it has nothing left to propose because no untried layout is expected to
        beat the best measured one (rather than because none is left)."""
        return False

    def close(self) -> None:
        """Release what the strategy holds (DeepHyper's temporary directory)."""
        if self.optimizer is not None:
            self.optimizer.close()


class GuidedStrategy(Strategy):
    """CBO and an online-calibrated estimate over the layouts that divide and fit.

    Every layout that divides is a candidate; the ones it proposes are those the calibrated
    memory estimate expects to fit (all of them with ``keep_predicted_oom``, those expected
    to fit first), ranked by :meth:`scores` (the calibrated predicted objective,
    :class:`~parsearch.search.calibration.CalibratedEstimate`, times what a residual field
    learnt of where the machine departs from it), those whose calibrated steps are expected
    to exceed the trial timeout last. All of it is recomputed after every result, so a
    layout first predicted out of memory comes in once measured peaks show the estimate too
    pessimistic, and layouts near the wall drop out once they show it too optimistic; a
    layout whose twin (the same but for gradient accumulation, the same predicted memory)
    fitted is never pruned by the global fit
    (:class:`~parsearch.search.local_memory.LocalMemory`). What the calibration prunes is
    inference, not a verdict: a layout the estimate expects to fit that the calibrated
    memory prunes, and no measurement of it or its twins rules out, is tried once its
    expected gain (probability of fitting times its score's gain over the best measured)
    beats that of the allowed layouts (:meth:`_with_rescues`). In order, it proposes:

    1. ``initial``: while fewer than ``n_seeds`` layouts have been tried, the best ranked
       layout of a (tp, pp) pair not tried yet (:func:`diverse_top`, re-ranked as results
       come in): the first measurements then differ in what the estimate is least sure of,
       which is what the step-time calibration needs to tell its parts apart; once one
       of them ran out of memory, each pair's layout worth most times its probability of
       fitting (:meth:`_by_expected_objective`);
    2. then, of every ``optimizer_every`` proposals, one is DeepHyper's (``optimizer``: the
       best of its acquisition among the ``region`` best-ranked untried layouts, every one
       expected to fit with ``region=None``) and the others the best ranked untried layout
       (``estimate``); when DeepHyper has nothing new to offer, the next ranked
       (``fallback``). With ``cbo_frame="estimate"`` DeepHyper's surrogate is the
       calibrated estimate plus the residual field below, told the log objective of every
       result (:class:`~parsearch.search.surrogate.EstimateSurrogate`): its acquisition
       (an upper confidence bound, on DeepHyper's own exploration schedule) scores its
       proposals in the estimate's frame, and the model it learns is the one the ranking
       reads; with ``"raw"``, its own surrogate learns the objective from scratch.
       Once ``optimizer_patience`` of DeepHyper's results in a row raised nothing, its
       turns are the ranking's for the rest of the campaign (:meth:`_optimizer_earns`).

    The estimate, once calibrated, is a far better prior than anything a surrogate learns
    from a dozen points, so it leads, but as a prior mean, not a cage: a Gaussian process
    (scikit-learn's) on ``log(measured / calibrated)``
    (:class:`~parsearch.search.residual.ResidualField`)
    re-ranks the layouts around each measurement, and once ``patience`` trials have brought
    no gain (:class:`~parsearch.search.residual.Plateau`) the ranking adds ``explore``
    times its posterior spread, so the search looks where the estimate was never checked
    (``benchmarks/search_efficiency.py`` measures these choices on machines of other
    shapes than the estimate). ``warm_start`` calibrates before the first trial from
    another campaign (:mod:`parsearch.search.warm_start`). Whatever the ranking does, the
    layouts it believed best before the first trial are tried within the budget unless a
    twin's measurement rules them out (``owed``, :mod:`parsearch.search.owed`; ``owe=False``
    drops the rule, for the benchmark's comparison).
    """

    name = "default"

    def __init__(
        self,
        space: SearchSpace,
        *,
        seed: int,
        keep_predicted_oom: bool = False,
        n_seeds: int | None = None,
        settings: CBOSettings = DEFAULT_CBO,
        warm_start: WarmStart | None = None,
        optimizer_every: int = 3,
        region: int | None = 32,
        residual: bool = True,
        patience: int = 6,
        explore: float = 2.0,
        acquisition: str = "mean",
        settle: float | None = None,
        cbo_frame: str = "estimate",
        owe: bool = True,
        optimizer_patience: int | None = 3,
    ):
        super().__init__(space, seed=seed)
        if cbo_frame not in CBO_FRAMES:
            raise StrategyError(f"unknown cbo_frame {cbo_frame!r}; valid: {list(CBO_FRAMES)}")
        plan = space.plan()
        plan.require_runnable(keep_predicted_oom=keep_predicted_oom)
        self.keep_predicted_oom = keep_predicted_oom
        items = [Candidate(layout, prediction) for layout, prediction in plan.feasible]
        items += [Candidate(layout, prediction) for layout, prediction in plan.predicted_oom]
        self.estimate = CalibratedEstimate(space, items)
        # Which items the uncalibrated estimate expects to fit: only these are ever tried
        # against the calibrated memory's verdict (see _with_rescues).
        self._estimate_fits = np.arange(len(items)) < len(plan.feasible)
        self._measured: list[Measured] = []
        self.budget: int | None = None
        self.owe = owe
        if warm_start is not None:
            warm_start.apply(self.estimate)
        # What the search believes best before its first trial: each is tried within the
        # budget unless a twin's measurement rules it out (owed, issue 39).
        self.believed_top = self._believed_top()
        self._keys = [c.key for c in items]
        self.optimizer_every = optimizer_every
        self.region = region
        self.residual = ResidualField([c.layout for c in items]) if residual else None
        self.plateau = Plateau(patience)
        self.explore = explore
        self.acquisition = acquisition
        self.settle = settle
        self._made = 0  # proposals after the initial ones, for the optimizer's share
        self.optimizer_patience = optimizer_patience
        self._optimizer_keys: set[str] = set()  # what DeepHyper proposed
        self._optimizer_dry = 0  # its results in a row, since its last, that gained nothing
        self._pending: set[str] = set()
        if n_seeds is None:
            n_seeds = max(4, len(space.searched) + 1)
        self.n_seeds = n_seeds
        self.seeds = diverse_top(self.candidates.ranked, n_seeds)
        self._frame = None
        if cbo_frame == "estimate":
            self._frame = EstimateFrame(self.estimate.objective, self._empty_field, self._item_of)
        if space.searched:
            self.optimizer = BayesianOptimizer(
                space.searched,
                seed=seed,
                settings=settings,
                allowed=self._region_points(),
                # In the estimate's frame its surrogate learns from the first result on.
                n_initial_points=1 if self._frame is not None else max(1, n_seeds),
                frame=self._frame,
            )

    def _empty_field(self) -> ResidualField:
        """A residual field like the ranking's with no measurement (for DeepHyper's
        surrogate, fitted on what DeepHyper is told)."""
        if self.residual is not None:
            return self.residual.empty()
        return ResidualField([c.layout for c in self.estimate.items])

    def _item_of(self, point: dict) -> int | None:
        layout = self.space.layout_from_point(point)
        return None if layout is None else self.estimate.index.get(layout.key())

    @property
    def candidates(self) -> RankedCandidates:
        """What this strategy would run now, best first."""
        return RankedCandidates([self.estimate.items[i] for i in self._ranking()])

    def _ranking(self) -> np.ndarray:
        """Indices of the allowed items: those expected to finish within the trial timeout
        first, each group by calibrated objective (with ``keep_predicted_oom``, those
        expected to fit in memory before the others), with the layouts pruned only by
        inference merged in by expected gain (:meth:`_with_rescues`); while settling, only
        those that could still beat the best (:meth:`_hopeful`)."""
        fits = self.estimate.fits()
        in_time = self.estimate.in_time()
        expected = self._expected()
        key = (-self._scores(*expected), ~in_time)
        if self.keep_predicted_oom:
            order = np.lexsort((*key, ~fits))
        else:
            allowed = np.flatnonzero(fits)
            order = allowed[np.lexsort(tuple(column[allowed] for column in key))]
            order = self._with_rescues(order, fits, in_time, expected)
        if self._settling():
            order = order[self._hopeful(*expected)[order]]
        return order

    def _rescuable(self, fits: np.ndarray, probability: np.ndarray) -> np.ndarray:
        """Items pruned by inference alone: the estimate says they fit, the calibration
        and the local evidence say they may not, and no measurement of them or of a twin
        says they do not (``probability`` is then at least :data:`RESCUE_PROBABILITY`)."""
        return self._estimate_fits & ~fits & (probability >= RESCUE_PROBABILITY)

    def _with_rescues(
        self,
        order: np.ndarray,
        fits: np.ndarray,
        in_time: np.ndarray,
        expected: tuple[np.ndarray, np.ndarray | None, np.ndarray | None],
    ) -> np.ndarray:
        """``order`` with the untried layouts pruned only by inference merged in, each
        before the first untried allowed one whose expected gain it beats.

        The expected gain of a layout is its probability of fitting
        (:meth:`~parsearch.search.calibration.CalibratedEstimate.fit_probability`) times
        its expected improvement over the best measured objective, the calibrated objective
        times the residual field's posterior
        (:func:`~parsearch.search.residual.log_expected_improvement`).
        A layout pruned because the wall its neighbours hit might be lower than it needs
        is then measured before the budget goes to layouts predicted far below it (which
        can gain little), and not while an allowed layout is expected to gain as much.
        """
        objective, mean, spread = expected
        best = self.plateau.best
        if best <= 0 or mean is None or spread is None:
            return order
        probability = self.estimate.fit_probability()
        unseen = np.fromiter((key not in self.seen for key in self._keys), dtype=bool)
        candidates = np.flatnonzero(self._rescuable(fits, probability) & unseen & in_time)
        if not len(candidates):
            return order
        kappa = self.explore if self.plateau.stuck else 0.0
        log_mean = np.log(objective) + mean + kappa * spread
        improvement = np.exp(log_expected_improvement(log_mean, spread, np.log(best)))
        gain = probability * improvement
        rescues = candidates[np.argsort(-gain[candidates], kind="stable")]
        merged: list[int] = []
        taken = 0
        for item in order:
            while taken < len(rescues) and unseen[item] and gain[rescues[taken]] > gain[item]:
                merged.append(int(rescues[taken]))
                taken += 1
            merged.append(int(item))
        return np.array(merged, dtype=int)

    def _expected(self) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """The calibrated objective of every item, and the residual field's posterior mean
        and spread there (``None`` before it has a measurement)."""
        objective = self.estimate.objective()
        if self.residual is None or not self.residual.measurements:
            return objective, None, None
        return objective, *self.residual.posterior(objective)

    def scores(self) -> np.ndarray:
        """What each item is expected to reach: the calibrated objective, times the learnt
        residual's posterior mean, and, once the search is stuck (no gain for ``patience``
        trials), its posterior spread times ``explore``: the search then looks where the
        estimate has not been checked yet."""
        return self._scores(*self._expected())

    def _scores(
        self, objective: np.ndarray, mean: np.ndarray | None, spread: np.ndarray | None
    ) -> np.ndarray:
        if mean is None or spread is None:
            return objective
        kappa = self.explore if self.plateau.stuck else 0.0
        if self.acquisition == "ei" and self.plateau.best > 0:
            log_mean = np.log(objective) + mean + kappa * spread
            return log_expected_improvement(log_mean, spread, np.log(self.plateau.best))
        return objective * np.exp(mean + kappa * spread)

    def _unseen_ranked(self) -> list[Candidate]:
        return [self.estimate.items[i] for i in self._ranking() if self._keys[i] not in self.seen]

    def _settling(self) -> bool:
        """Whether untried layouts are judged by whether they could still beat the best:
        with ``settle``, once the seeds have been measured."""
        return (
            self.settle is not None
            and self.residual is not None
            and self.residual.measurements >= self.n_seeds
            and self.plateau.best > 0
        )

    def _hopeful(self, objective: np.ndarray, mean: np.ndarray, spread: np.ndarray) -> np.ndarray:
        """Items that could still beat the best measured objective: their calibrated
        objective times the residual field's posterior mean and ``settle`` posterior
        spreads (the optimistic end of what the estimate has learnt of this machine)."""
        return objective * np.exp(mean + self.settle * spread) > self.plateau.best

    @property
    def settled(self) -> bool:
        return self._settling() and not self._unseen_ranked()

    def _region_points(self) -> list[dict]:
        ranked = self._unseen_ranked()
        if self.region is not None:
            ranked = ranked[: self.region]
        return [point_of(self.space, c.layout) for c in ranked]

    def _believed_top(self) -> list[tuple[ParallelLayout, Prediction]]:
        """The :data:`~parsearch.search.owed.OWED_TOP` best layouts by what is known before
        the first trial: the uncalibrated estimate expects them to fit, and so does the
        estimate as a warm start calibrated it (another campaign's out-of-memory trials
        are measurements too), and their steps are expected to finish within the trial
        timeout (a layout expected to time out is not expected to run at all)."""
        believed = self._estimate_fits & self.estimate.fits() & self.estimate.in_time()
        objective = self.estimate.objective()
        order = np.flatnonzero(believed)
        order = order[np.argsort(-objective[order], kind="stable")][:OWED_TOP]
        return [(self.estimate.items[i].layout, self.estimate.items[i].prediction) for i in order]

    def start(self, history: Sequence[TrialLike], *, budget: int) -> None:
        self.budget = budget
        # What DeepHyper proposed in an earlier session still counts for or against its turn.
        self._optimizer_keys.update(r.layout.key() for r in history if r.origin == "optimizer")
        super().start(history, budget=budget)

    def _optimizer_earns(self) -> bool:
        """Whether DeepHyper keeps its turn: not once ``optimizer_patience`` of its results
        in a row raised the best by nothing (``None``: always). Its share then goes to the
        ranking for the rest of the campaign, and it is told no more results (it will not be
        asked again, and each tell refits its surrogate).

        In the estimate's frame DeepHyper learns the same residual as the ranking, so its
        proposals are the ranking's with more exploration: on the benchmark's truths it gave
        9 of 180 first hits for 30% of the trials, and once it had raised nothing three times
        its later turns found nothing the ranking would not have (issue 39; the figures are
        in ``benchmarks/README.md``)."""
        return self.optimizer_patience is None or self._optimizer_dry < self.optimizer_patience

    def owed(self) -> list[tuple[int, ParallelLayout]]:
        """The believed best layouts (rank, layout) not proposed yet and ruled out by no
        twin's measurement (:func:`parsearch.search.owed.owed`), as many as the budget
        owes (:func:`parsearch.search.owed.owed_count`)."""
        index, items = self.estimate.index, self.estimate.items
        predictions = {
            key: items[index[key]].prediction
            for key in {m.layout.key() for m in self._measured}
            if key in index
        }
        top = self.believed_top
        if self.budget is not None:
            top = top[: owed_count(self.budget)]
        return owed(self.space, top, self._measured, predictions, self.seen)

    def _owed_now(self) -> list[Proposal]:
        """The owed layouts, once the budget left has no trial to spare for them: the
        search proposes as it would until then, and never ends with one untried."""
        if self.budget is None or not self.owe:
            return []
        due = self.owed()
        if not due or len(due) < self.budget - len(self.seen):
            return []
        index = self.estimate.index
        return [
            Proposal(layout, "owed", self.estimate.items[index[layout.key()]].prediction)
            for _, layout in due
        ]

    def _propose(self, n: int) -> Iterator[Proposal]:
        owed_now = self._owed_now()
        yield from owed_now
        n -= len(owed_now)
        if n <= 0:
            return
        ranked = self._unseen_ranked()
        initial = max(0, min(n, self.n_seeds - len(self.seen)))
        tried = {
            model_split(c.layout)
            for c, key in zip(self.estimate.items, self._keys, strict=True)
            if key in self.seen
        }
        fresh = [c for c in ranked if model_split(c.layout) not in tried]
        if initial and self.estimate.local.measured_oom:
            fresh = self._by_expected_objective(fresh)
        taken: set[str] = set()
        for candidate in diverse_top(fresh or ranked, initial) if initial else []:
            taken.add(candidate.key)
            yield Proposal(candidate.layout, "initial", candidate.prediction)
        rest = n - len(taken)
        shares = range(self._made, self._made + rest)
        wanted = sum(1 for i in shares if i % self.optimizer_every == self.optimizer_every - 1)
        self._made += rest
        if not self._optimizer_earns():
            wanted = 0
        proposed = 0
        if self.optimizer is not None and wanted:
            allowed = {c.key: c for c in ranked}
            # DeepHyper's turn goes to a layout the ranking would not propose next (its own
            # picks of this ask and the one after): in the estimate's frame its acquisition
            # often agrees with the ranking, and a turn that repeats it explores nothing.
            untaken = (c.key for c in ranked if c.key not in taken)
            own = set(itertools.islice(untaken, rest - wanted + 1))
            # DeepHyper does not know which of its earlier proposals still run; asking for
            # that many more lets a batch strategy (topk) skip them and still fill ``n``.
            for point in self.optimizer.ask(wanted + len(self._pending) + len(own)):
                layout = self.space.layout_from_point(point)
                candidate = allowed.get(layout.key()) if layout else None
                if candidate is None or candidate.key in taken or candidate.key in own:
                    continue
                taken.add(candidate.key)
                self._optimizer_keys.add(candidate.key)
                proposed += 1
                yield Proposal(candidate.layout, "optimizer", candidate.prediction)
                if proposed == wanted:
                    break
        estimate_picks = rest - wanted
        for candidate in ranked:
            if proposed == rest:
                return
            if candidate.key in taken:
                continue
            taken.add(candidate.key)
            origin = "estimate" if estimate_picks > 0 else "fallback"
            estimate_picks -= 1
            proposed += 1
            yield Proposal(candidate.layout, origin, candidate.prediction)

    def _by_expected_objective(self, candidates: list[Candidate]) -> list[Candidate]:
        """``candidates`` by score times probability of fitting, best first: once trials of
        the first wave ran out of memory, the rest of it is chosen from the corrected
        memory (a pair's best layout at the wall it just learnt of is likely out of memory
        too; one a little below it is worth more)."""
        probability = self.estimate.fit_probability()
        worth = self.scores() * probability
        index = self.estimate.index
        return sorted(candidates, key=lambda c: -worth[index[c.key]])

    def ask(self, n: int) -> list[Proposal]:
        proposals = super().ask(n)
        self._pending.update(p.layout.key() for p in proposals)
        return proposals

    def observe(self, results: Sequence[tuple[ParallelLayout, TrialResult]]) -> None:
        for layout, result in results:
            peak = result.metrics.get("peak_mem_bytes")
            if result.ok and isinstance(peak, int | float) and peak > 0:
                self.estimate.measured_peak(layout, float(peak))

    def tell(self, results: Sequence[tuple[ParallelLayout, Objective]]) -> None:
        self._pending.difference_update(layout.key() for layout, _ in results)
        for layout, value in results:
            measured = None if isinstance(value, str) else float(value)
            state = TrialState.OK if measured is not None else _failed_state(value)
            self._measured.append(Measured(layout, state, measured))
            if layout.key() in self._optimizer_keys:
                gained = self.plateau.gains(measured)
                self._optimizer_dry = 0 if gained else self._optimizer_dry + 1
            self.plateau.add(measured)
            if value == f"F_{TrialState.OOM.value}":
                self.estimate.out_of_memory(layout)
            elif value == f"F_{TrialState.TIMEOUT.value}":
                self.estimate.timed_out(layout)
            elif measured is not None:
                self.estimate.measured_objective(layout, measured)
                i = self.estimate.index.get(layout.key())
                if self.residual is not None and i is not None:
                    self.residual.add(i, measured)
        if self.optimizer is not None and results and self._optimizer_earns():
            region = self._region_points()
            if region:
                self.optimizer.restrict(region)
            self.optimizer.tell(
                [(point_of(self.space, layout), self._told(value)) for layout, value in results]
            )

    def _told(self, value: Objective) -> Objective:
        """What DeepHyper is told of a result: in the estimate's frame, the log objective
        (its surrogate learns ``log measured - log calibrated``); a failure as it is."""
        if self._frame is None or isinstance(value, str) or value <= 0:
            return value
        return math.log(value)

    def allows(self, layout: ParallelLayout) -> bool:
        i = self.estimate.index.get(layout.key())
        if i is None:
            return False
        if self.keep_predicted_oom:
            return True
        fits = self.estimate.fits()
        return bool(fits[i] or self._rescuable(fits, self.estimate.fit_probability())[i])


@dataclass(frozen=True)
class RankedCandidates:
    """Layouts a guided strategy would run now, best first (a snapshot)."""

    ranked: list[Candidate]

    def __len__(self) -> int:
        return len(self.ranked)

    def __contains__(self, layout: ParallelLayout) -> bool:
        key = layout.key()
        return any(c.layout.key() == key for c in self.ranked)


class _RawStrategy(Strategy):
    """Common ground of the baselines: the raw product space, in a seeded random order."""

    def __init__(self, space: SearchSpace, *, seed: int):
        super().__init__(space, seed=seed)
        points = list(space.points())
        order = np.random.default_rng(seed).permutation(len(points))
        self._shuffled = [raw_layout(space, points[i]) for i in order]
        self._cursor = 0

    def _proposal(self, layout: ParallelLayout, origin: str) -> Proposal:
        prediction = None if self.space.violations(layout) else self.space.predict(layout)
        return Proposal(layout, origin, prediction)

    def _random_unseen(self, n: int, taken: set[str]) -> Iterator[Proposal]:
        count = 0
        while count < n and self._cursor < len(self._shuffled):
            layout = self._shuffled[self._cursor]
            self._cursor += 1
            if layout.key() not in self.seen and layout.key() not in taken:
                count += 1
                yield self._proposal(layout, "random")


class RawCBOStrategy(_RawStrategy):
    """DeepHyper's CBO on the raw space: no pruning, no estimate seeding (a baseline)."""

    name = "cbo-raw"

    def __init__(self, space: SearchSpace, *, seed: int, settings: CBOSettings = DEFAULT_CBO):
        super().__init__(space, seed=seed)
        if space.searched:
            self.optimizer = BayesianOptimizer(space.searched, seed=seed, settings=settings)

    def _propose(self, n: int) -> Iterator[Proposal]:
        taken: set[str] = set()
        if self.optimizer is not None:
            for point in self.optimizer.ask(n):
                layout = raw_layout(self.space, point)
                if layout.key() in self.seen or layout.key() in taken:
                    continue
                taken.add(layout.key())
                yield self._proposal(layout, "optimizer")
        yield from self._random_unseen(n - len(taken), taken)


class RandomStrategy(_RawStrategy):
    """Uniform sampling without replacement over the raw space (a baseline)."""

    name = "random"

    def _propose(self, n: int) -> Iterator[Proposal]:
        return self._random_unseen(n, set())


def model_split(layout: ParallelLayout) -> tuple[int, int, int]:
    """How a layout splits the model itself (tp, cp, pp): what a first wave spreads over."""
    return layout.tp, layout.cp, layout.pp


def diverse_top(ranked: Sequence[Candidate], n: int) -> list[Candidate]:
    """The best predicted layout of each (tp, cp, pp) split, best splits first, up to ``n``.

    The estimate is surest about memory and least sure about communication, which is what
    tp, cp and pp trade; seeding one layout per split lets the first measurements correct the
    estimate where it is weakest instead of confirming n variations of one guess. If the
    space has fewer pairs than ``n``, the next best layouts fill in.
    """
    chosen: list[Candidate] = []
    pairs: set[tuple[int, int, int]] = set()
    for candidate in ranked:
        pair = model_split(candidate.layout)
        if pair not in pairs:
            pairs.add(pair)
            chosen.append(candidate)
        if len(chosen) == n:
            return chosen
    keys = {c.key for c in chosen}
    rest = [c for c in ranked if c.key not in keys]
    return chosen + rest[: n - len(chosen)]


STRATEGIES: dict[str, type[Strategy]] = {
    GuidedStrategy.name: GuidedStrategy,
    RawCBOStrategy.name: RawCBOStrategy,
    RandomStrategy.name: RandomStrategy,
}


def _failed_state(value: Objective) -> TrialState:
    """The state a told failure (``"F_<state>"``) names; ``error`` for any other value."""
    try:
        return TrialState(str(value).removeprefix("F_"))
    except ValueError:
        return TrialState.ERROR
