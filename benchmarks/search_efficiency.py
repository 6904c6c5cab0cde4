"""Search efficiency: how many trials each strategy needs to reach 97% of the true optimum.

Every campaign runs the real driver in-process, with a real store (a temporary file) and
the ``simulate`` backend, one slot, for ``--budget`` trials. The strategies:

* ``default``: parsearch's (rules + calibrated estimate + DeepHyper CBO, see
  :class:`parsearch.campaign.strategy.GuidedStrategy`);
* ``cbo-raw``: DeepHyper's CBO on the raw product of the searched dimensions;
* ``random``: uniform sampling without replacement over the raw space;
* ``grid``: the order a person would try (:class:`PersonGrid`).

**What "true" means.** The simulated machine is *not* the estimate. Its answer for a layout
is the ``simulate`` backend's for a *mismatched* copy of the space (:data:`MACHINES`): other
compute efficiency and small-GEMM penalty, a slower inter-node network, less overlap of the
data-parallel reduction, higher collective latency and another runtime memory overhead
(the offset); times the backend's per-layout log-normal noise (sigma ``NOISE``, seeded by
the campaign seed and the layout, so a layout always measures the same in one seed); and
peak memory the mismatched copy's prediction times the backend's ``mem_factor``, above the
space's limit an out-of-memory trial. The exhaustive optimum of a seed is the best
objective that machine reports over every layout that divides (a few thousand ``simulate``
calls); reaching 97% of it means a trial measured at least 0.97 of that. Two machines: one
whose memory the estimate underestimates ("heavier": ~+15%) and one it overestimates
("lighter": ~-15%).

Trials are every proposal the driver records, including raw-space layouts that do not
divide (``infeasible``: recorded without running). ``random``'s trials to target beyond the
budget are read off its proposal order, which does not depend on results. ``ms/trial`` is
the driver's wall time per trial (ask, three store transactions, tell) with trials answered
instantly, while ``--jobs`` campaigns share the machine. ``--settings`` compares settings
of the default strategy instead (:data:`VARIANTS`), an ablation of online calibration
included.

    .venv/bin/python benchmarks/search_efficiency.py [--quick] [--settings] [--seeds N]
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from parsearch.backends.simulate import SimulateBackend, SimulateSettings, simulate_trial
from parsearch.campaign.calibration import CalibratedEstimate
from parsearch.campaign.api import run_campaign
from parsearch.campaign.optimizer import CBOSettings
from parsearch.campaign.strategy import (
    DEFAULT_CBO,
    GuidedStrategy,
    Proposal,
    RandomStrategy,
    Strategy,
    make_strategy,
)
from parsearch.config import RECOMPUTE_CHOICES, ParallelLayout
from parsearch.result import TrialResult, TrialState
from parsearch.space import SearchSpace, load_space
from parsearch.store import TrialRecord, open_store
from parsearch.trial import TrialSpec

ROOT = Path(__file__).resolve().parent.parent
SPACES = (
    "gpt-22b-frontier",
    "gpt-175b-frontier",
    "gpt-1t-frontier",
    "llama3-8b-h200",
    "llama3-70b-h100",
)
STRATEGY_NAMES = ("default", "cbo-raw", "random", "grid")
TARGET = 0.97
NOISE = 0.05
GIB = 2**30
WARM_SOURCE, WARM_TARGET, WARM_SOURCE_BUDGET = "gpt-175b-frontier", "gpt-1t-frontier", 30


@dataclass(frozen=True)
class Machine:
    """How the simulated machine departs from the space's estimate (factors on its knobs)."""

    name: str
    compute_efficiency: float = 0.48 / 0.55
    small_gemm_penalty: float = 4.0
    inter_node_bandwidth: float = 0.5
    dp_exposed: float = 0.7 / 0.3
    collective_latency: float = 100e-6 / 30e-6
    runtime_overhead_gib: float = 0.0
    mem_factor: float = 1.0

    def truth(self, space: SearchSpace) -> SearchSpace:
        estimate, allocation = space.estimate, space.allocation
        estimate = dataclasses.replace(
            estimate,
            compute_efficiency=estimate.compute_efficiency * self.compute_efficiency,
            gemm_half_efficiency_elements=estimate.gemm_half_efficiency_elements
            * self.small_gemm_penalty,
            dp_overlap=1 - (1 - estimate.dp_overlap) * self.dp_exposed,
            collective_latency_s=estimate.collective_latency_s * self.collective_latency,
            runtime_overhead_bytes=int(
                estimate.runtime_overhead_bytes + self.runtime_overhead_gib * GIB
            ),
        )
        allocation = dataclasses.replace(
            allocation,
            inter_node_bandwidth_bytes_per_s=allocation.inter_node_bandwidth_bytes_per_s
            * self.inter_node_bandwidth,
        )
        return dataclasses.replace(space, estimate=estimate, allocation=allocation)

    def backend(self, seed: int) -> SimulateSettings:
        return SimulateSettings(noise=NOISE, mem_factor=self.mem_factor, seed=seed)


MACHINES = (
    Machine("heavier", runtime_overhead_gib=1.0, mem_factor=1.12),
    Machine("lighter", runtime_overhead_gib=-1.0, mem_factor=0.88),
)


class FrozenEstimate(CalibratedEstimate):
    """An estimate deaf to measurements: the ablation of online calibration."""

    def measured_objective(self, layout: ParallelLayout, objective: float) -> None:
        return None

    def measured_peak(self, layout: ParallelLayout, peak_bytes: float) -> None:
        return None

    def out_of_memory(self, layout: ParallelLayout) -> None:
        return None

    def timed_out(self, layout: ParallelLayout) -> None:
        return None


@dataclass(frozen=True)
class Variant:
    """A setting of the default strategy, for ``--settings``."""

    name: str
    slots: int = 1
    optimizer_every: int = 3
    region: int = 32
    cbo: CBOSettings = DEFAULT_CBO
    calibrated: bool = True

    def build(self, space: SearchSpace, seed: int) -> Strategy:
        strategy = GuidedStrategy(
            space,
            seed=seed,
            settings=self.cbo,
            optimizer_every=self.optimizer_every,
            region=self.region,
        )
        if not self.calibrated:
            strategy.estimate = FrozenEstimate(space, strategy.estimate.items)
        return strategy


VARIANTS = (
    Variant("default (ET, sampling, topk, CBO 1 in 3 of top 32)"),
    Variant("no online calibration (ablation)", calibrated=False),
    Variant("no CBO proposals (CBO still told)", optimizer_every=10**9),
    Variant("CBO 1 in 2", optimizer_every=2),
    Variant("CBO 1 in 3 of top 128", region=128),
    Variant("RF surrogate", cbo=CBOSettings(surrogate_model="RF")),
    Variant("acq_optimizer mixedga", cbo=CBOSettings(acq_optimizer="mixedga")),
    Variant("8 slots, topk", slots=8),
    Variant("8 slots, qUCB", slots=8, cbo=CBOSettings(multi_point_strategy="qUCB")),
)


class PersonGrid(Strategy):
    """A grid in the order a person would try, knowing the divisibility rules but not memory.

    Model parallelism grows slowest first: for each pp (ascending), tp within a node
    (ascending), tp across nodes only after every in-node tp; for each (tp, pp) the
    micro-batch ascending and, for each, gradient accumulation descending (the largest
    batch first: it amortises the pipeline bubble); then recompute none, selective, full;
    ZeRO stage ascending; sequence parallel off, then on. Results change nothing.
    """

    name = "grid"

    def __init__(self, space: SearchSpace, *, seed: int):
        super().__init__(space, seed=seed)
        per_node = space.allocation.devices_per_node
        plan = space.plan()
        layouts = [layout for layout, _ in plan.feasible + plan.predicted_oom]

        def order(layout: ParallelLayout) -> tuple:
            return (
                layout.tp > per_node,
                layout.pp,
                layout.tp,
                layout.mbs,
                -layout.gas,
                RECOMPUTE_CHOICES.index(layout.recompute),
                layout.zero_stage,
                layout.sequence_parallel,
            )

        self._order = sorted(layouts, key=order)
        self._predictions = dict(plan.feasible + plan.predicted_oom)

    def _propose(self, n: int) -> Iterator[Proposal]:
        count = 0
        for layout in self._order:
            if count == n:
                return
            if layout.key() not in self.seen:
                count += 1
                yield Proposal(layout, "grid", self._predictions[layout])


@dataclass(frozen=True)
class Task:
    """Every strategy's campaign on one space, machine and seed (one exhaustive optimum)."""

    space: str
    machine: Machine
    seed: int
    budget: int
    strategies: tuple[str | Variant, ...] = STRATEGY_NAMES
    warm: bool = False


@dataclass(frozen=True)
class Outcome:
    """One campaign: objectives in trial order (``None``: failed), states, driver time."""

    space: str
    machine: Machine
    seed: int
    strategy: str
    warm: bool
    budget: int
    objectives: list[float | None]
    states: list[str]
    seconds_per_trial: float
    optimum: float
    optimum_predicted_oom: bool
    uncapped_trials: int | None = None

    @property
    def label(self) -> str:
        return self.strategy + (" + warm start (175B)" if self.warm else "")

    def best_so_far(self) -> np.ndarray:
        values = np.array([v if v is not None else 0.0 for v in self.objectives])
        curve = np.maximum.accumulate(values) / self.optimum if len(values) else values
        return np.pad(curve, (0, self.budget - len(curve)), mode="edge")

    def trials_to_target(self) -> int | None:
        if self.uncapped_trials is not None:
            return self.uncapped_trials
        reached = np.flatnonzero(self.best_so_far() >= TARGET)
        return int(reached[0]) + 1 if len(reached) else None

    def fraction(self, state: TrialState) -> float:
        return self.states.count(state.value) / max(1, len(self.states))


@cache
def space_named(name: str) -> SearchSpace:
    return load_space(ROOT / "search_spaces" / f"{name}.yaml")


def measure(space: SearchSpace, machine: Machine, seed: int, layout: ParallelLayout) -> TrialResult:
    """What the simulated machine reports for ``layout`` in ``seed``."""
    truth = machine.truth(space)
    spec = TrialSpec(
        trial_id="probe",
        model=truth.model,
        layout=layout,
        allocation=truth.allocation,
        trainer=dict(truth.trainer),
        timeout_s=truth.trial_timeout_s,
        seed=seed,
    )
    return simulate_trial(truth, spec, machine.backend(seed))


def exhaustive_optimum(
    space: SearchSpace, machine: Machine, seed: int
) -> tuple[float, ParallelLayout]:
    """The best objective the simulated machine reports over every dividing layout."""
    plan = space.plan()
    best = (0.0, plan.feasible[0][0])
    for layout, _ in plan.feasible + plan.predicted_oom:
        result = measure(space, machine, seed, layout)
        if result.ok:
            best = max(best, (float(result.metrics[space.objective]), layout))
    return best


def build_strategy(
    entry: str | Variant, space: SearchSpace, seed: int, warm_store: Path | None
) -> Strategy:
    if isinstance(entry, Variant):
        return entry.build(space, seed)
    if entry == "grid":
        return PersonGrid(space, seed=seed)
    warm_start = None if warm_store is None else str(warm_store)
    return make_strategy(entry, space, seed=seed, warm_start=warm_start)


def campaign(
    space_name: str,
    machine: Machine,
    entry: str | Variant,
    seed: int,
    budget: int,
    store_path: Path,
    warm_store: Path | None = None,
) -> tuple[list[TrialRecord], float]:
    """Drive one campaign into ``store_path``; its trials and the driver's s/trial."""
    space = space_named(space_name)
    slots = entry.slots if isinstance(entry, Variant) else 1
    strategy = build_strategy(entry, space, seed, warm_store)
    backend = SimulateBackend(machine.truth(space), machine.backend(seed), slots)
    start = time.perf_counter()
    run_campaign(space, store_path, backend=backend, strategy=strategy, budget=budget, seed=seed)
    wall = time.perf_counter() - start
    with open_store(store_path, readonly=True) as store:
        trials = store.trials(store.get_campaign().id)
    return trials, wall / max(1, len(trials))


def run_task(task: Task) -> list[Outcome]:
    """Each of the task's strategies (and the warm-started default) in a fresh store."""
    space = space_named(task.space)
    optimum, best_layout = exhaustive_optimum(space, task.machine, task.seed)
    hidden = not space.fits(space.predict(best_layout))
    runs = [(entry, False) for entry in task.strategies]
    runs += [("default", True)] if task.warm else []
    outcomes = []
    for entry, warm in runs:
        with tempfile.TemporaryDirectory() as tmp:
            warm_store = None
            if warm:
                warm_store = Path(tmp) / "source.db"
                campaign(
                    WARM_SOURCE, task.machine, "default", task.seed, WARM_SOURCE_BUDGET, warm_store
                )
            trials, per_trial = campaign(
                task.space, task.machine, entry, task.seed, task.budget, Path(tmp) / "b.db",
                warm_store,
            )  # fmt: skip
        uncapped = None
        if entry == "random":
            uncapped = random_trials_to_target(space, task.machine, task.seed, optimum)
        outcomes.append(
            Outcome(
                space=task.space,
                machine=task.machine,
                seed=task.seed,
                strategy=entry.name if isinstance(entry, Variant) else entry,
                warm=warm,
                budget=task.budget,
                objectives=[t.objective if t.state is TrialState.OK else None for t in trials],
                states=[t.state.value for t in trials],
                seconds_per_trial=per_trial,
                optimum=optimum,
                optimum_predicted_oom=hidden,
                uncapped_trials=uncapped,
            )
        )
    return outcomes


def random_trials_to_target(
    space: SearchSpace, machine: Machine, seed: int, optimum: float
) -> int | None:
    """Position of the first good layout in random search's order (independent of results)."""
    strategy = RandomStrategy(space, seed=seed)
    for number, proposal in enumerate(strategy.ask(sum(1 for _ in space.points())), 1):
        if space.violations(proposal.layout):
            continue
        result = measure(space, machine, seed, proposal.layout)
        if result.ok and result.metrics[space.objective] >= TARGET * optimum:
            return number
    return None


def tasks(
    seeds: int, budget: int, spaces: Sequence[str], strategies: tuple[str | Variant, ...]
) -> list[Task]:
    """One task per space, machine and seed; the 1T space also warm-started from 175B."""
    warm = strategies == STRATEGY_NAMES
    return [
        Task(space, machine, seed, budget, strategies, warm=warm and space == WARM_TARGET)
        for machine in MACHINES
        for space in spaces
        for seed in range(seeds)
    ]


def summarise(outcomes: list[Outcome], budget: int) -> str:
    """The results table, and how often the uncalibrated estimate prunes the optimum."""
    groups: dict[tuple[str, str, str], list[Outcome]] = {}
    for outcome in outcomes:
        key = (outcome.machine.name, outcome.space, outcome.label)
        groups.setdefault(key, []).append(outcome)
    lines = [
        f"| machine | space | strategy | median trials to {TARGET:.0%} | worst | reached "
        f"| OOM | infeasible | ms/trial |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for (machine, space, strategy), group in groups.items():
        needed = [o.trials_to_target() for o in group]
        reached = [n for n in needed if n is not None]
        ranked = sorted(n if n is not None else float("inf") for n in needed)
        median = statistics.median(ranked)
        lines.append(
            f"| {machine} | {space} | {strategy} | {_count(median, budget)} "
            f"| {_count(ranked[-1], budget)} | {len(reached)}/{len(group)} "
            f"| {statistics.fmean(o.fraction(TrialState.OOM) for o in group):.0%} "
            f"| {statistics.fmean(o.fraction(TrialState.INFEASIBLE) for o in group):.0%} "
            f"| {1e3 * statistics.median(o.seconds_per_trial for o in group):.0f} |"
        )
    hidden: dict[tuple[str, str], dict[int, bool]] = {}
    for outcome in outcomes:
        hidden.setdefault((outcome.machine.name, outcome.space), {})[outcome.seed] = (
            outcome.optimum_predicted_oom
        )
    lines += ["", "| machine | space | seeds whose optimum the uncalibrated estimate prunes |"]
    lines.append("|---|---|---:|")
    for (machine, space), seeds in hidden.items():
        lines.append(f"| {machine} | {space} | {sum(seeds.values())}/{len(seeds)} |")
    return "\n".join(lines)


def _count(value: float, budget: int) -> str:
    if value == float("inf"):
        return "not reached"
    text = f"{value:g}"
    return text + " (beyond budget)" if value > budget else text


def figure(outcomes: list[Outcome], spaces: Sequence[str], budget: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        len(MACHINES),
        len(spaces),
        figsize=(3.6 * len(spaces), 3.2 * len(MACHINES)),
        sharex=True,
        sharey=True,
        squeeze=False,
    )
    styles = {"default": "C0", "cbo-raw": "C1", "random": "C2", "grid": "C3"}
    for row, machine in enumerate(MACHINES):
        for col, space in enumerate(spaces):
            ax = axes[row][col]
            for warm in (False, True):
                for strategy in STRATEGY_NAMES:
                    group = [
                        o
                        for o in outcomes
                        if (o.machine, o.space, o.strategy, o.warm)
                        == (machine, space, strategy, warm)
                    ]
                    if not group:
                        continue
                    curve = np.median([o.best_so_far() for o in group], axis=0)
                    trials = np.arange(1, budget + 1)
                    ax.plot(
                        trials,
                        curve,
                        color=styles[strategy],
                        linestyle="--" if warm else "-",
                        label=group[0].label,
                    )
            ax.axhline(TARGET, color="grey", linewidth=0.8, linestyle=":")
            ax.set_xscale("log")
            ax.set_ylim(0, 1.02)
            ax.set_title(f"{space}, {machine.name} machine", fontsize=9)
            if col == 0:
                ax.set_ylabel("best so far / optimum (median)")
            if row == len(MACHINES) - 1:
                ax.set_xlabel("trial")
    handles, labels = [], []
    for ax in axes.flat:
        for handle, text in zip(*ax.get_legend_handles_labels(), strict=True):
            if text not in labels:
                handles.append(handle)
                labels.append(text)
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=9)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 seeds, budget 40, for CI")
    parser.add_argument("--seeds", type=int, help="seeds per space (default 10; 5 with --settings)")
    parser.add_argument("--budget", type=int, help="trials per campaign (100; 40 with --settings)")
    parser.add_argument("--jobs", type=int, default=2, help="campaigns run at once")
    parser.add_argument("--spaces", nargs="+", default=list(SPACES), choices=SPACES)
    parser.add_argument(
        "--settings",
        action="store_true",
        help="compare settings of the default strategy (CBO share, surrogate, acquisition "
        "optimiser, batch strategy with 8 slots) instead of the four strategies",
    )
    parser.add_argument(
        "--figure", type=Path, default=ROOT / "benchmarks" / "search_efficiency.png"
    )
    args = parser.parse_args()
    seeds = args.seeds or (5 if args.settings else 10)
    budget = args.budget or (40 if args.settings else 100)
    if args.quick:
        seeds, budget = 3, 40
    strategies = VARIANTS if args.settings else STRATEGY_NAMES
    todo = tasks(seeds, budget, args.spaces, strategies)
    start = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        outcomes = [o for found in pool.map(run_task, todo, chunksize=1) for o in found]
    print(summarise(outcomes, budget))
    if not args.settings:
        figure(outcomes, args.spaces, budget, args.figure)
    print(
        f"\n{len(todo)} tasks, {seeds} seeds, budget {budget}, "
        f"{time.perf_counter() - start:.0f} s"
        + ("" if args.settings else f"; figure {args.figure}")
    )


if __name__ == "__main__":
    main()
