"""Search strategies: who decides which layout runs next.

A :class:`Strategy` owns ask/tell and the pruning predicate, so the driver never needs to know
how proposals are made, and a better strategy (online memory calibration, transfer from
another campaign) can replace one without touching the driver. Every strategy guarantees:

* no layout is proposed twice (its ``seen`` set also holds what the store already has);
* fewer than ``n`` proposals only when nothing unseen is left to propose.

``default`` searches only what the rules and the memory estimate allow, starts from the
estimate's best layouts, and falls back to the next best predicted layout when DeepHyper
re-proposes a point. ``cbo-raw`` and ``random`` are the baselines a user without parsearch
would have: DeepHyper's CBO, or uniform sampling, over the raw product of the searched
dimensions, with nothing pruned and nothing seeded.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from parsearch.campaign.candidates import Candidate, Candidates, point_of, raw_layout
from parsearch.campaign.optimizer import BayesianOptimizer, CBOSettings, Objective
from parsearch.config import ParallelLayout
from parsearch.errors import ParsearchError
from parsearch.estimate import Prediction
from parsearch.space import SearchSpace

DEFAULT_CBO = CBOSettings()


class StrategyError(ParsearchError):
    """An unknown strategy name or setting."""

    exit_code = 2


@dataclass(frozen=True)
class Proposal:
    """A layout to try, who proposed it, and what the estimate expects of it.

    ``origin`` is ``initial`` (a seed from the estimate's ranking), ``optimizer`` (DeepHyper),
    ``fallback`` (the next best predicted layout, when DeepHyper repeated itself) or
    ``random``. ``prediction`` is ``None`` for layouts that break a rule.
    """

    layout: ParallelLayout
    origin: str
    prediction: Prediction | None


class Strategy(abc.ABC):
    """Owns a campaign's ask/tell loop and its pruning predicate."""

    name: ClassVar[str]

    def __init__(self, space: SearchSpace, *, seed: int):
        self.space = space
        self.seed = seed
        self.seen: set[str] = set()
        self.optimizer: BayesianOptimizer | None = None

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

    def tell(self, results: Sequence[tuple[ParallelLayout, Objective]]) -> None:
        """Finished layouts with their objective (or ``"F_<state>"``), for the optimiser."""
        if self.optimizer is not None and results:
            self.optimizer.tell([(point_of(self.space, lay), value) for lay, value in results])

    def allows(self, layout: ParallelLayout) -> bool:
        """Whether this strategy would run ``layout`` (its pruning predicate)."""
        return True

    def close(self) -> None:
        """Release what the strategy holds (DeepHyper's temporary directory)."""
        if self.optimizer is not None:
            self.optimizer.close()


class GuidedStrategy(Strategy):
    """CBO over the layouts that divide and are predicted to fit, seeded by the estimate."""

    name = "default"

    def __init__(
        self,
        space: SearchSpace,
        *,
        seed: int,
        keep_predicted_oom: bool = False,
        n_seeds: int | None = None,
        settings: CBOSettings = DEFAULT_CBO,
    ):
        super().__init__(space, seed=seed)
        plan = space.plan()
        plan.require_runnable(keep_predicted_oom=keep_predicted_oom)
        self.candidates = Candidates(space, plan, keep_predicted_oom=keep_predicted_oom)
        if n_seeds is None:
            n_seeds = max(4, len(space.searched) + 1)
        self.seeds = diverse_top(self.candidates.ranked, n_seeds)
        if space.searched:
            self.optimizer = BayesianOptimizer(
                space.searched,
                seed=seed,
                settings=settings,
                allowed=self.candidates.points(),
                n_initial_points=max(1, len(self.seeds)),
            )
        self._cursor = 0
        self._pending: set[str] = set()

    def _propose(self, n: int) -> Iterator[Proposal]:
        seeds = [c for c in self.seeds if c.layout.key() not in self.seen][:n]
        for candidate in seeds:
            yield Proposal(candidate.layout, "initial", candidate.prediction)
        wanted = n - len(seeds)
        if wanted <= 0:
            return
        taken: set[str] = set()
        if self.optimizer is not None:
            # DeepHyper does not know which of its earlier proposals still run; asking for
            # that many more lets a batch strategy (topk) skip them and still fill ``n``.
            for point in self.optimizer.ask(wanted + len(self._pending)):
                layout = self.space.layout_from_point(point)
                candidate = self.candidates.by_key.get(layout.key()) if layout else None
                if candidate is None:
                    continue
                key = candidate.layout.key()
                if key in self.seen or key in taken:
                    continue
                taken.add(key)
                yield Proposal(candidate.layout, "optimizer", candidate.prediction)
                if len(taken) == wanted:
                    return
        for _ in range(wanted - len(taken)):
            candidate = self._next_best_unseen(taken)
            if candidate is None:
                return
            taken.add(candidate.layout.key())
            yield Proposal(candidate.layout, "fallback", candidate.prediction)

    def _next_best_unseen(self, taken: set[str]) -> Candidate | None:
        ranked = self.candidates.ranked
        while self._cursor < len(ranked):
            candidate = ranked[self._cursor]
            key = candidate.layout.key()
            if key not in self.seen and key not in taken:
                return candidate
            self._cursor += 1
        return None

    def ask(self, n: int) -> list[Proposal]:
        proposals = super().ask(n)
        self._pending.update(p.layout.key() for p in proposals)
        return proposals

    def tell(self, results: Sequence[tuple[ParallelLayout, Objective]]) -> None:
        self._pending.difference_update(layout.key() for layout, _ in results)
        super().tell(results)

    def allows(self, layout: ParallelLayout) -> bool:
        return layout in self.candidates


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


def diverse_top(ranked: Sequence[Candidate], n: int) -> list[Candidate]:
    """The best predicted layout of each (tp, pp) pair, best pairs first, up to ``n``.

    The estimate is surest about memory and least sure about communication, which is what
    tp and pp trade; seeding one layout per pair lets the first measurements correct the
    estimate where it is weakest instead of confirming n variations of one guess. If the
    space has fewer pairs than ``n``, the next best layouts fill in.
    """
    chosen: list[Candidate] = []
    pairs: set[tuple[int, int]] = set()
    for candidate in ranked:
        pair = (candidate.layout.tp, candidate.layout.pp)
        if pair not in pairs:
            pairs.add(pair)
            chosen.append(candidate)
        if len(chosen) == n:
            return chosen
    keys = {c.layout.key() for c in chosen}
    rest = [c for c in ranked if c.layout.key() not in keys]
    return chosen + rest[: n - len(chosen)]


STRATEGIES: dict[str, type[Strategy]] = {
    GuidedStrategy.name: GuidedStrategy,
    RawCBOStrategy.name: RawCBOStrategy,
    RandomStrategy.name: RandomStrategy,
}


def make_strategy(
    name: str, space: SearchSpace, *, seed: int, keep_predicted_oom: bool = False
) -> Strategy:
    """The strategy called ``name`` for ``space`` (``keep_predicted_oom`` applies to default)."""
    if name == GuidedStrategy.name:
        return GuidedStrategy(space, seed=seed, keep_predicted_oom=keep_predicted_oom)
    if name in STRATEGIES:
        return STRATEGIES[name](space, seed=seed)
    raise StrategyError(f"unknown strategy {name!r}; valid: {sorted(STRATEGIES)}")
