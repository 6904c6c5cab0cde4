"""The strategy's interface to the driver: a strategy the driver has never heard of, whose
trials differ in size, runs through ``parsearch.run_campaign`` with the backend's placement
and clock handed to it, what it says a trial measured stored, and what finished told back;
and a resume hands it the store's trials and the budget."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path

import parsearch
from parsearch.backends.simulate import SimulateBackend, SimulateSettings
from parsearch.estimate.proxy import choose_proxy
from parsearch.result import TrialResult, TrialState
from parsearch.search.strategy import Placement, Proposal, Strategy, TrialLike
from parsearch.space import SearchSpace
from parsearch.store import open_store

SPACE = Path(__file__).parent.parent / "search_spaces" / "gpt-22b-frontier.yaml"


class Clocked(SimulateBackend):
    """The simulate backend with a clock of its own (counting the driver's reads)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reads = 0

    def clock(self) -> float:
        self.reads += 1
        return 1000.0 + self.reads


class Halves(Strategy):
    """Every layout that fits as a proxy at half its replicas or fewer, smallest first; it
    marks what each trial records, and remembers what the driver told it."""

    name = "halves"
    sized = True

    def __init__(self, space: SearchSpace):
        super().__init__(space, seed=0)
        self.layouts = [layout for layout, _ in space.plan().feasible]
        self.started: tuple[int, int] | None = None
        self.asked: list[int] = []
        self.clocks: list[float] = []
        self.rooms: list[int] = []
        self.told: list[tuple[int | None, TrialState]] = []

    def start(self, history: Sequence[TrialLike], *, budget: int) -> None:
        self.started = (len(history), budget)
        super().start(history, budget=budget)

    def ask(self, n: int) -> list[Proposal]:
        self.asked.append(n)
        self.clocks.append(self.placement.clock())
        proposals = super().ask(n)
        if proposals and self.placement.room is not None and proposals[0].proxy is not None:
            self.rooms.append(self.placement.room(proposals[0].proxy.nodes))
        return proposals

    def _propose(self, n: int) -> Iterator[Proposal]:
        space = self.space
        for layout in self.layouts:
            plan = choose_proxy(space.model, layout, space.allocation, space.estimate)
            if plan is not None and plan.dp <= layout.dp // 2:
                yield Proposal(layout, "halves", space.predict(layout), proxy=plan)

    def record_result(self, record: TrialLike, result: TrialResult) -> TrialResult:
        return dataclasses.replace(result, metrics={**result.metrics, "halves": 1})

    def finished(self, results: Sequence[tuple[TrialLike, TrialResult]]) -> None:
        self.told += [(record.proxy_dp, result.status) for record, result in results]
        super().finished(results)


def test_a_new_sized_strategy_runs_through_the_driver_by_its_interface_alone(tmp_path):
    space = parsearch.load_space(SPACE)
    backend = Clocked(space, SimulateSettings(seed=1, mem_factor=0.9), slots=1)
    strategy = Halves(space)
    db = tmp_path / "halves.db"
    summary = parsearch.run_campaign(space, db, backend=backend, strategy=strategy, budget=5)
    assert summary.finished == 5
    assert strategy.started == (0, 5)
    assert strategy.asked and set(strategy.asked) == {1}  # sized: one trial at a time
    assert strategy.clocks and all(c > 1000.0 for c in strategy.clocks)  # the backend's clock
    assert strategy.rooms and max(strategy.rooms) >= 1  # its placement: nodes free or not
    assert strategy.placement.room is not None
    assert [strategy.placement.room(n) for n in (1, 2, 16)] == [16, 8, 1]  # all free now
    with open_store(db, readonly=True) as store:
        campaign = store.get_campaign()
        trials = store.trials(campaign.id)
    assert campaign.settings["strategy"] == "halves" and not campaign.settings["proxy"]
    assert all(t.proxy_dp is not None and t.proxy_dp <= t.layout.dp // 2 for t in trials)
    assert all(t.metrics.get("halves") == 1 for t in trials if t.state is TrialState.OK)
    assert sorted(strategy.told) == sorted((t.proxy_dp, t.state) for t in trials)


def test_resume_hands_the_stored_trials_and_the_budget_to_start(tmp_path):
    space = parsearch.load_space(SPACE)
    db = tmp_path / "resume.db"
    backend = SimulateBackend(space, SimulateSettings(seed=1, mem_factor=0.9), slots=1)
    parsearch.run_campaign(space, db, backend=backend, strategy="random", budget=3)
    strategy = Halves(space)
    placed: list[Placement] = []
    strategy.place = placed.append  # type: ignore[method-assign]
    with open_store(db, readonly=True) as store:
        history = store.trials(store.get_campaign().id)
    strategy.start(history, budget=7)
    assert strategy.started == (3, 7)
    assert {t.layout.key() for t in history} <= strategy.seen  # never proposed again
