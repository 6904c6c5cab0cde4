"""How much time the campaign driver itself costs per trial, on the simulate backend.

Prints four tables:

1. **Overhead per evaluation** (ask + record + tell) with 1 and 16 slots, trials answered
   instantly (``delay=0``), so every second measured is the driver's: DeepHyper's ask and
   tell, and the store's three fsynced transactions a trial (queued, running, finished).
   Median and mean per evaluation over the first 50, 200 and 500 evaluations, and the median
   around the 50th, 200th and 500th (the last 10%: the surrogate grows with the history).
2. **Slot utilisation** with 16 slots and 2-second trials (``--trial-s``): busy slot-seconds
   over available slot-seconds while trials were being started (the ramp-down at the end,
   when the budget leaves slots empty on purpose, is reported apart).
3. **One round of asking for 512 free slots** after 200 told results, on a space with
   enough candidates (the 1T space with recompute and ZeRO searched too).
4. **Driver time per trial against slots** (1 to 512), 500 instant trials each.

    .venv/bin/python benchmarks/driver_overhead.py [--quick] [--trial-s 2]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from parsearch.backends import create_backend
from parsearch.campaign.driver import Driver, DriverSettings
from parsearch.campaign.lease import Lease
from parsearch.config import ParallelLayout
from parsearch.search.strategy import GuidedStrategy, Proposal
from parsearch.space import SearchSpace, load_space, space_from_dict
from parsearch.store import SQLiteStore, open_store

ROOT = Path(__file__).resolve().parent.parent
SPACE_1T = ROOT / "search_spaces" / "gpt-1t-frontier.yaml"


class Clock:
    """Per-trial costs, attributed by layout key: a batch call's time is shared evenly."""

    def __init__(self) -> None:
        self.cost: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.order: list[str] = []

    def charge(self, keys: list[str], part: str, seconds: float) -> None:
        for key in keys:
            self.cost[key][part] += seconds / max(1, len(keys))

    def per_trial(self) -> list[float]:
        return [sum(self.cost[key].values()) for key in self.order]

    def parts(self) -> dict[str, float]:
        totals: dict[str, float] = defaultdict(float)
        for key in self.order:
            for part, seconds in self.cost[key].items():
                totals[part] += seconds
        return {part: seconds / len(self.order) for part, seconds in totals.items()}


class TimedStrategy:
    """The real strategy, with its ask and tell timed per trial."""

    def __init__(self, strategy: GuidedStrategy, clock: Clock):
        self.strategy, self.clock = strategy, clock

    def ask(self, n: int) -> list[Proposal]:
        start = time.perf_counter()
        proposals = self.strategy.ask(n)
        keys = [p.layout.key() for p in proposals]
        self.clock.charge(keys, "ask", time.perf_counter() - start)
        self.clock.order += keys
        return proposals

    def finished(self, results: Sequence[tuple[Any, Any]]) -> None:
        """The driver's one call per batch of results: observe and tell, timed together."""
        start = time.perf_counter()
        self.strategy.finished(results)
        keys = [record.layout.key() for record, _ in results]
        self.clock.charge(keys, "tell", time.perf_counter() - start)

    def __getattr__(self, name: str) -> Any:
        # The rest of the strategy interface (place, start, sized, settled, ...) untimed.
        return getattr(self.strategy, name)


class TimedStore:
    """The real store; the three writes a trial costs are timed, the rest passes through."""

    def __init__(self, store: SQLiteStore, clock: Clock):
        self.store, self.clock = store, clock
        self.layouts: dict[int, str] = {}

    def add_trial(self, campaign_id: int, layout: ParallelLayout, **kwargs: Any):
        start = time.perf_counter()
        record = self.store.add_trial(campaign_id, layout, **kwargs)
        self.layouts[record.id] = layout.key()
        self.clock.charge([layout.key()], "store", time.perf_counter() - start)
        return record

    def mark_running(self, trial_id: int, *args: Any, **kwargs: Any):
        start = time.perf_counter()
        record = self.store.mark_running(trial_id, *args, **kwargs)
        self.clock.charge([self.layouts[trial_id]], "store", time.perf_counter() - start)
        return record

    def finish_trial(self, trial_id: int, *args: Any):
        start = time.perf_counter()
        record = self.store.finish_trial(trial_id, *args)
        self.clock.charge([self.layouts[trial_id]], "store", time.perf_counter() - start)
        return record

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def big_space() -> SearchSpace:
    """The 1T space with recompute and ZeRO searched too: ~20 000 points, enough to ask
    512 new candidates after 200 results."""
    raw = copy.deepcopy(yaml.safe_load(SPACE_1T.read_text()))
    raw["search"]["recompute"] = ["none", "selective", "full"]
    raw["search"]["zero_stage"] = [0, 1, 2]
    return space_from_dict(raw, source=f"{SPACE_1T} + recompute, zero_stage")


def campaign(
    space: SearchSpace,
    *,
    budget: int,
    slots: int,
    delay_s: float,
    jitter: float = 0.0,
    seed: int = 0,
) -> tuple[Clock, float, list[Any]]:
    """Run one simulate campaign in a fresh store; return the clock, wall time and trials."""
    clock = Clock()
    with tempfile.TemporaryDirectory() as tmp, open_store(Path(tmp) / "bench.db") as store:
        record = store.create_campaign("bench", space.raw, seed=seed, budget=budget)
        strategy = GuidedStrategy(space, seed=seed)
        backend = create_backend(
            "simulate",
            space,
            slots=slots,
            options={"delay": str(delay_s), "jitter": str(jitter), "noise": "0.05"},
        )
        with Lease(store, record.id) as lease:
            driver = Driver(
                store=TimedStore(store, clock),  # type: ignore[arg-type]
                campaign=record,
                space=space,
                backend=backend,
                strategy=TimedStrategy(strategy, clock),  # type: ignore[arg-type]
                lease=lease,
                settings=DriverSettings(budget=budget, poll_s=0.05),
            )
            start = time.perf_counter()
            driver.run()
            wall = time.perf_counter() - start
        strategy.close()
        return clock, wall, store.trials(record.id)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def overhead_table(space: SearchSpace, budgets: list[int]) -> None:
    print("\n1. Driver overhead per evaluation (ask + record + tell), simulate, delay 0")
    print(f"   space {space.name}; ms per evaluation")
    print(
        f"   {'slots':>5} {'evals':>5} {'median':>8} {'mean':>8} {'median at N':>12} "
        f"{'ask':>7} {'tell':>7} {'store':>7} {'wall/eval':>10}"
    )
    top = max(budgets)
    for slots in (1, 16):
        clock, wall, _ = campaign(space, budget=top, slots=slots, delay_s=0.0)
        costs = clock.per_trial()
        for n in budgets:
            first = costs[:n]
            window = costs[int(0.9 * n) : n]
            parts = Clock()
            parts.cost, parts.order = clock.cost, clock.order[:n]
            share = parts.parts()
            print(
                f"   {slots:>5} {n:>5} {1e3 * median(first):>8.1f} "
                f"{1e3 * statistics.fmean(first):>8.1f} {1e3 * median(window):>12.1f} "
                f"{1e3 * share.get('ask', 0):>7.1f} {1e3 * share.get('tell', 0):>7.1f} "
                f"{1e3 * share.get('store', 0):>7.1f} "
                f"{1e3 * wall / top if n == top else float('nan'):>10.1f}"
            )


def utilisation_table(space: SearchSpace, trial_s: float, rounds: int) -> None:
    slots = 16
    budget = slots * rounds
    print(f"\n2. Slot utilisation: {slots} slots, {trial_s:g}-s trials, {budget} trials")
    for jitter in (0.0, 0.5):
        print(
            f"   trial length {trial_s:g} s x U[{1 - jitter:g}, {1 + jitter:g}]"
            + (" (all 16 finish together: the worst case)" if not jitter else "")
        )
        utilisation(space, trial_s, jitter, slots, budget)


def utilisation(space: SearchSpace, trial_s: float, jitter: float, slots: int, budget: int):
    _, wall, trials = campaign(space, budget=budget, slots=slots, delay_s=trial_s, jitter=jitter)
    busy = sum(t.finished_at - t.started_at for t in trials)
    first = min(t.started_at for t in trials)
    last_start = max(t.started_at for t in trials)
    last_end = max(t.finished_at for t in trials)
    steady = [t for t in trials if t.started_at <= last_start]
    steady_busy = sum(min(t.finished_at, last_start) - t.started_at for t in steady)
    print(
        f"     while starting trials: {steady_busy / (slots * (last_start - first)):.1%} "
        f"of slot-seconds busy"
    )
    print(
        f"     whole campaign:        {busy / (slots * (last_end - first)):.1%} "
        f"(the last round ramps down: the budget leaves slots empty)"
    )
    print(f"     wall {wall:.1f} s for {budget} trials on {slots} slots")


def ask_512_table(space: SearchSpace) -> None:
    print("\n3. One round of asking for 512 free slots after 200 told results")
    strategy = GuidedStrategy(space, seed=0)
    try:
        told = 0
        while told < 200:
            proposals = strategy.ask(16)
            strategy.tell([(p.layout, _objective(space, p.layout)) for p in proposals])
            told += len(proposals)
        start = time.perf_counter()
        proposals = strategy.ask(512)
        took = time.perf_counter() - start
        origins = defaultdict(int)
        for p in proposals:
            origins[p.origin] += 1
    finally:
        strategy.close()
    print(
        f"   {len(strategy.candidates)} candidates; ask(512) took {took:.3f} s; "
        f"{len(proposals)} distinct proposals: {dict(origins)}"
    )


def _objective(space: SearchSpace, layout: ParallelLayout) -> float | str:
    prediction = space.predict(layout)
    return prediction.tokens_per_s if space.fits(prediction) else "F_oom"


def slots_table(space: SearchSpace, budget: int, slot_counts: list[int]) -> None:
    print(f"\n4. Driver time per trial against slots ({budget} instant trials, {space.name})")
    print(f"   {'slots':>5} {'wall/trial ms':>14} {'ask':>7} {'tell':>7} {'store':>7}")
    for slots in slot_counts:
        clock, wall, _ = campaign(space, budget=budget, slots=slots, delay_s=0.0)
        share = clock.parts()
        print(
            f"   {slots:>5} {1e3 * wall / budget:>14.1f} {1e3 * share.get('ask', 0):>7.1f} "
            f"{1e3 * share.get('tell', 0):>7.1f} {1e3 * share.get('store', 0):>7.1f}"
        )


def size_table(names: list[str], budget: int, repeats: int) -> None:
    """``plan`` and the driver's time per proposal by space size, each against the first
    space (today's 1T), measured in the same run: the bigger spaces of MoE and CP searches
    must stay as quick to plan and to propose from."""
    print(f"\n5. Space size: plan seconds and driver ms per proposal ({budget} instant trials)")
    print(
        f"   {'space':<22} {'layouts':>8} {'feasible':>8} {'plan s':>7} {'x':>5} "
        f"{'ask ms':>7} {'x':>5} {'wall ms':>8}"
    )
    base: tuple[float, float] | None = None
    for name in names:
        path = ROOT / "search_spaces" / f"{name}.yaml"
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            plan = load_space(path).plan()
            times.append(time.perf_counter() - start)
        plan_s = statistics.median(times)
        space = load_space(path)
        clock, wall, _ = campaign(space, budget=budget, slots=1, delay_s=0.0)
        ask_ms = 1e3 * clock.parts().get("ask", 0.0)
        base = base or (plan_s, ask_ms)
        print(
            f"   {name:<22} {plan.total:>8} {len(plan.feasible):>8} {plan_s:>7.2f} "
            f"{plan_s / base[0]:>5.2f} {ask_ms:>7.1f} {ask_ms / base[1]:>5.2f} "
            f"{1e3 * wall / budget:>8.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller budgets, for CI")
    parser.add_argument("--trial-s", type=float, default=2.0, help="trial length for table 2")
    parser.add_argument(
        "--sizes",
        nargs="+",
        metavar="SPACE",
        help="only table 5, over these shipped spaces (the first is the baseline), e.g. "
        "gpt-1t-frontier deepseek-v3-h200",
    )
    args = parser.parse_args()
    if args.sizes:
        size_table(args.sizes, 30 if args.quick else 60, 1 if args.quick else 3)
        return
    space_1t = load_space(SPACE_1T)
    big = big_space()
    budgets = [20, 50] if args.quick else [50, 200, 500]
    overhead_table(space_1t, budgets)
    utilisation_table(space_1t, args.trial_s, 3 if args.quick else 10)
    ask_512_table(big)
    slots_table(big, 100 if args.quick else 500, [1, 16, 64, 512])


if __name__ == "__main__":
    main()
