"""Search efficiency: trials and node-hours each strategy needs to reach 97% of the optimum.

Every campaign runs the real driver in-process through ``parsearch.run_campaign``, with a
real store (a temporary file) and a :class:`truths.TruthBackend` (one slot, trials answered
at once), for ``--budget`` trials. The strategies:

* ``default``: parsearch's (rules + calibrated estimate with local memory evidence and a
  residual field + DeepHyper CBO, see :class:`parsearch.search.strategy.GuidedStrategy`);
* ``cbo-raw``: DeepHyper's CBO on the raw product of the searched dimensions;
* ``random``: uniform sampling without replacement over the raw space;
* ``grid``: the order a person would try (:class:`PersonGrid`).

**What "true" means.** The machine is *not* the estimate: :mod:`truths` has a rescaled
estimate, an independent analytic model written from the papers and the estimate times a
smooth random field, each with three memory directions (as is, x1.2, x0.85) and a per-layout
noise; a memory wall (the independent model with the optimum at 99.4% of the device where
the estimate sees room, its own memory only); and published sweeps replayed. Each cell's
table row also says which source of proposals made each first hit. The exhaustive optimum of
a cell is the best the truth reports over every layout that divides; reaching 97% of it
means a trial measured at least 0.97 of it. Beside it, trials to a *layout* within 3% of the
best layout, both judged by their noiseless throughput
(:meth:`Outcome.trials_to_layout_target`): where layouts tie within the noise, the first
criterion rewards finding the luckiest draw, the second finding a good layout.

Trials are every proposal the driver records, including raw-space layouts that do not
divide (``infeasible``: recorded without running). ``random``'s trials to target beyond the
budget are read off its proposal order, which does not depend on results. Node-hours count
each trial as the allocation's nodes x (a fixed start-up + its timed steps), see
:meth:`truths.Truth.node_seconds`. ``ms/trial`` is the driver's wall time per trial with
trials answered instantly, while ``--jobs`` campaigns share the machine. ``--settings``
compares settings of the default strategy instead (:data:`VARIANTS`).

    .venv/bin/python benchmarks/search_efficiency.py [--quick] [--settings] [--seeds N]
        [--truths ...] [--memory ...] [--spaces ...] [--strategies ...]
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
from truths import (
    MEMORY,
    REPLAY_DIR,
    TRUTHS,
    MemoryWall,
    PublishedSweep,
    RandomField,
    Truth,
    TruthBackend,
)

from parsearch.campaign.api import run_campaign
from parsearch.campaign.warm_start import load_warm_start
from parsearch.config import RECOMPUTE_CHOICES, ParallelLayout
from parsearch.result import TrialState
from parsearch.search.calibration import CalibratedEstimate
from parsearch.search.factory import make_strategy
from parsearch.search.optimizer import CBOSettings
from parsearch.search.residual import CATEGORY_DISTANCE, NUMERIC, ResidualField
from parsearch.search.strategy import (
    DEFAULT_CBO,
    GuidedStrategy,
    Proposal,
    RandomStrategy,
    Strategy,
)
from parsearch.space import SearchSpace, load_space
from parsearch.store import TrialRecord, open_store

ROOT = Path(__file__).resolve().parent.parent
SPACES = (
    "gpt-22b-frontier",
    "gpt-175b-frontier",
    "gpt-1t-frontier",
    "llama3-8b-h200",
    "llama3-70b-h100",
)
# The published sweeps the replay truth answers (and only it: their measurements are the truth).
REPLAY_SPACES = tuple(sorted(path.stem for path in REPLAY_DIR.glob("*.yaml")))
STRATEGY_NAMES = ("default", "cbo-raw", "random", "grid")
TARGET = 0.97
WARM_SOURCE, WARM_TARGET, WARM_SOURCE_BUDGET = "gpt-175b-frontier", "gpt-1t-frontier", 30


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


class GlobalMemoryEstimate(CalibratedEstimate):
    """Memory feasibility from the global fit alone, without local evidence (ablation)."""

    def fits(self) -> np.ndarray:
        return self.memory.fits(self.predicted_mem)


@dataclass(frozen=True)
class Variant:
    """A setting of the default strategy, for ``--settings``."""

    name: str
    slots: int = 1
    optimizer_every: int = 3
    region: int | None = 32
    cbo: CBOSettings = DEFAULT_CBO
    calibrated: bool = True
    local_memory: bool = True
    residual: bool = True
    explore: float = 2.0
    patience: int = 6
    acquisition: str = "mean"
    residual_length: float = 1.0  # the residual field's correlation length, log2 steps
    category_distance: float = CATEGORY_DISTANCE  # and a differing category, in lengths
    settle: float | None = None  # end once nothing untried is this many spreads above best
    n_seeds: int | None = None  # one per (tp, pp) pair first; None: searched dimensions + 1
    field_kernel: bool = False  # the residual field with the random-field truth's own kernel
    cbo_frame: str = "estimate"  # what DeepHyper learns: the estimate's residual, or "raw"
    owe: bool = True  # the believed best ten tried within the budget unless a twin rules out
    # The estimate's memory scaled by this before the first trial: told how much heavier the
    # truth's memory is (heavier: 1.2), the bound that learning it online can approach.
    memory_told: float = 1.0
    optimizer_patience: int | None = 3  # DeepHyper's turn given back after this many dry

    def build(self, space: SearchSpace, seed: int) -> Strategy:
        strategy = GuidedStrategy(
            space,
            seed=seed,
            settings=self.cbo,
            optimizer_every=self.optimizer_every,
            region=self.region,
            residual=self.residual,
            explore=self.explore,
            patience=self.patience,
            acquisition=self.acquisition,
            settle=self.settle,
            n_seeds=self.n_seeds,
            cbo_frame=self.cbo_frame,
            owe=self.owe,
            optimizer_patience=self.optimizer_patience,
        )
        prior = (self.residual_length, self.category_distance)
        if self.residual and prior != (1.0, CATEGORY_DISTANCE):  # the default's field otherwise
            strategy.residual = ResidualField(
                [c.layout for c in strategy.estimate.items],
                length=self.residual_length,
                category_distance=self.category_distance,
            )
        if self.field_kernel:
            strategy.residual.features = field_kernel_coordinates(space, seed, strategy)
        if not self.calibrated:
            strategy.estimate = FrozenEstimate(space, strategy.estimate.items)
        elif not self.local_memory:
            strategy.estimate = GlobalMemoryEstimate(space, strategy.estimate.items)
        if self.memory_told != 1.0:
            strategy.estimate.predicted_mem *= self.memory_told
            strategy.estimate.local.predicted *= self.memory_told
        return strategy


def field_kernel_coordinates(space: SearchSpace, seed: int, strategy: GuidedStrategy) -> np.ndarray:
    """The residual field's coordinates under which its kernel is the random-field truth's
    own (:class:`truths.RandomField`: each searched dimension's value index over the
    correlation length drawn for it), for ``--truths field`` only: a strategy that knew how
    the truth was drawn. Numeric columns come first in the field's features (at most
    :data:`~parsearch.search.residual.NUMERIC`, the rest equal, so no category term)."""
    truth = RandomField(space, seed)
    if len(truth.names) > NUMERIC:
        raise ValueError(f"field-kernel: {space.name} searches more than {NUMERIC} dimensions")
    coordinates = np.zeros_like(strategy.residual.features)
    for column, name in enumerate(truth.names):
        index = truth.index[name]
        coordinates[:, column] = [
            index[getattr(c.layout, name)] / truth.lengths[column] for c in strategy.estimate.items
        ]
    return coordinates


VARIANTS = (
    Variant("default"),  # CBO in the estimate frame, 1 in 3 of the top 32; local memory
    Variant("previous-default", local_memory=False, residual=False),  # global memory fit
    Variant("no-residual", residual=False),
    Variant("ei", acquisition="ei"),  # expected improvement over the best measured
    Variant("ei-no-plateau", acquisition="ei", explore=0.0),
    Variant("no-plateau", explore=0.0),  # residual field, never widened
    Variant("patience-3", patience=3),  # widened after 3 trials without a 1% gain
    Variant("explore-4", explore=4.0),  # widened twice as far
    Variant("cbo-every-fit", region=None),  # CBO 1 in 3 over every layout expected to fit
    Variant("frozen-estimate", calibrated=False),  # no online calibration (ablation)
    Variant("no-cbo", optimizer_every=10**9),  # CBO still told
    Variant("cbo-1-in-2", optimizer_every=2),
    Variant("cbo-top-128", region=128),
    # DeepHyper on the raw objective with its own surrogate (the default before issue 27):
    Variant("cbo-raw-frame", cbo_frame="raw"),
    Variant("ucb-constant", cbo=CBOSettings(kappa_schedule="constant")),  # kappa 1.96 always
    Variant("rf-surrogate", cbo=CBOSettings(surrogate_model="RF"), cbo_frame="raw"),
    Variant("mixedga", cbo=CBOSettings(acq_optimizer="mixedga")),
    Variant("8-slots-topk", slots=8),
    Variant("8-slots-qucb", slots=8, cbo=CBOSettings(multi_point_strategy="qUCB")),
    Variant("residual-length-2", residual_length=2.0),  # the field's correlation, longer
    Variant("residual-category-1", category_distance=1.0),  # categories nearer
    Variant("residual-2-category-1", residual_length=2.0, category_distance=1.0),
    Variant("settle-2", settle=2.0),  # ends once nothing untried could beat the best
    Variant("seeds-3", n_seeds=3),
    Variant("seeds-9", n_seeds=9),
    Variant("no-owed", owe=False),  # the default before issue 39
    Variant("memory-told-1.2", memory_told=1.2),  # the heavier memory known from the start
    Variant("cbo-keeps-share", optimizer_patience=None),  # the default before issue 39 item 2
    # A bound, not a strategy: what the best residual prior could give on the field truth.
    Variant("field-kernel", field_kernel=True),
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
    """Every strategy's campaign on one space, truth, memory direction and seed."""

    space: str
    truth: str
    memory: str
    seed: int
    budget: int
    strategies: tuple[str | Variant, ...] = STRATEGY_NAMES
    warm: bool = False

    def make_truth(self, space_name: str | None = None) -> Truth:
        space = space_named(space_name or self.space)
        return TRUTHS[self.truth](space, self.seed, MEMORY[self.memory])


@dataclass(frozen=True)
class Outcome:
    """One campaign: objectives in trial order (``None``: failed), states, node-seconds."""

    task: Task
    strategy: str
    warm: bool
    objectives: list[float | None]
    states: list[str]
    node_seconds: list[float]
    seconds_per_trial: float
    optimum: float
    optimum_rank: int | None  # the optimum's rank by the estimate (None: predicted OOM)
    uncapped: tuple[int, float] | None = None  # random's (trials, node-seconds) to target
    # The noiseless objective of each ok trial's layout, and the best layout's (see
    # trials_to_layout_target).
    means: tuple[float | None, ...] = ()
    mean_optimum: float = 0.0
    uncapped_mean: int | None = None  # random's trials to a good layout
    origins: tuple[str, ...] = ()  # who proposed each trial (initial, estimate, optimizer...)

    @property
    def label(self) -> str:
        return self.strategy + (" + warm start (175B)" if self.warm else "")

    def best_so_far(self) -> np.ndarray:
        values = np.array([v if v is not None else 0.0 for v in self.objectives])
        curve = np.maximum.accumulate(values) / self.optimum if len(values) else values
        return np.pad(curve, (0, self.task.budget - len(curve)), mode="edge")

    def trials_to_target(self) -> int | None:
        if self.uncapped is not None:
            return self.uncapped[0]
        reached = np.flatnonzero(self.best_so_far() >= TARGET)
        return int(reached[0]) + 1 if len(reached) else None

    def trials_to_layout_target(self) -> int | None:
        """Trials to the first layout whose own (noiseless) throughput is within 3% of the
        best layout's. The measured optimum above is the best of one noisy draw per
        layout: where several layouts tie within the noise (sigma 5%), reaching 97% of it
        means finding the luckiest draw, which a rerun of the same layout would not repeat
        and no strategy can predict from neighbours."""
        if self.strategy == "random":
            return self.uncapped_mean
        good = [
            i for i, m in enumerate(self.means) if m is not None and m >= TARGET * self.mean_optimum
        ]
        return good[0] + 1 if good else None

    def node_hours_to_target(self) -> float | None:
        if self.uncapped is not None:
            return self.uncapped[1] / 3600
        needed = self.trials_to_target()
        return None if needed is None else sum(self.node_seconds[:needed]) / 3600

    def ooms_to_target(self) -> int | None:
        """Out-of-memory trials up to the one that reached the target (None: not reached
        within the recorded trials)."""
        needed = self.trials_to_target()
        if needed is None or needed > len(self.states):
            return None
        return self.states[:needed].count(TrialState.OOM.value)

    def first_hit_origin(self) -> str | None:
        """Who proposed the trial that first reached the target (``None``: not reached
        within the recorded trials): which source of proposals earns its share."""
        needed = self.trials_to_target()
        if needed is None or needed > len(self.origins):
            return None
        return self.origins[needed - 1]

    def fraction(self, state: TrialState) -> float:
        return self.states.count(state.value) / max(1, len(self.states))


@cache
def space_named(name: str) -> SearchSpace:
    folder = REPLAY_DIR if name in REPLAY_SPACES else ROOT / "search_spaces"
    return load_space(folder / f"{name}.yaml")


def applies(truth: str, memory: str, space: str) -> bool:
    """A replay answers only its own sweep's space, with the memory it measured; the
    simulated truths answer the production spaces, the wall with its own memory only."""
    if truth == PublishedSweep.name:
        return space in REPLAY_SPACES and memory == "as is"
    if truth == MemoryWall.name:
        return space not in REPLAY_SPACES and memory == "as is"
    return space not in REPLAY_SPACES


def exhaustive_optimum(truth: Truth, *, noisy: bool = True) -> tuple[float, ParallelLayout]:
    """The best objective the truth reports over every dividing layout (without
    ``noisy``: the best layout's own mean)."""
    space = truth.space
    plan = space.plan()
    best = (0.0, plan.feasible[0][0])
    for layout, _ in plan.feasible + plan.predicted_oom:
        result = truth.measure(layout, noisy=noisy)
        if result.ok:
            best = max(best, (float(result.metrics[space.objective]), layout))
    return best


def estimate_rank(space: SearchSpace, layout: ParallelLayout) -> int | None:
    """Where the estimate ranks ``layout`` among those it predicts to fit."""
    ranked = sorted(space.plan().feasible, key=lambda item: -getattr(item[1], space.objective))
    keys = [candidate.key() for candidate, _ in ranked]
    return keys.index(layout.key()) + 1 if layout.key() in keys else None


def build_strategy(
    entry: str | Variant, space: SearchSpace, seed: int, warm_store: Path | None
) -> Strategy:
    if isinstance(entry, Variant):
        return entry.build(space, seed)
    if entry == "grid":
        return PersonGrid(space, seed=seed)
    warm_start = None if warm_store is None else load_warm_start(warm_store)
    return make_strategy(entry, space, seed=seed, warm_start=warm_start)


def campaign(
    truth: Truth,
    entry: str | Variant,
    budget: int,
    store_path: Path,
    warm_store: Path | None = None,
) -> tuple[list[TrialRecord], float]:
    """Drive one campaign on ``truth`` into ``store_path``; its trials and the driver's
    s/trial."""
    space, seed = truth.space, truth.seed
    slots = entry.slots if isinstance(entry, Variant) else 1
    strategy = build_strategy(entry, space, seed, warm_store)
    start = time.perf_counter()
    run_campaign(
        space, store_path, backend=TruthBackend(truth, slots), strategy=strategy,
        budget=budget, seed=seed,
    )  # fmt: skip
    wall = time.perf_counter() - start
    with open_store(store_path, readonly=True) as store:
        trials = store.trials(store.get_campaign().id)
    return trials, wall / max(1, len(trials))


def run_task(task: Task) -> list[Outcome]:
    """Each of the task's strategies (and the warm-started default) in a fresh store."""
    truth = task.make_truth()
    space = truth.space
    optimum, best_layout = exhaustive_optimum(truth)
    mean_optimum, _ = exhaustive_optimum(truth, noisy=False)
    runs = [(entry, False) for entry in task.strategies]
    runs += [("default", True)] if task.warm else []
    outcomes = []
    for entry, warm in runs:
        with tempfile.TemporaryDirectory() as tmp:
            warm_store = None
            if warm:
                warm_store = Path(tmp) / "source.db"
                source = task.make_truth(WARM_SOURCE)
                campaign(source, "default", WARM_SOURCE_BUDGET, warm_store)
            trials, per_trial = campaign(truth, entry, task.budget, Path(tmp) / "b.db", warm_store)
        uncapped = uncapped_mean = None
        if entry == "random":
            uncapped = random_to_target(truth, optimum)
            to_mean = random_to_target(truth, mean_optimum, noisy=False)
            uncapped_mean = None if to_mean is None else to_mean[0]
        outcomes.append(
            Outcome(
                task=task,
                strategy=entry.name if isinstance(entry, Variant) else entry,
                warm=warm,
                objectives=[t.objective if t.state is TrialState.OK else None for t in trials],
                states=[t.state.value for t in trials],
                node_seconds=[trial_node_seconds(truth, t) for t in trials],
                seconds_per_trial=per_trial,
                optimum=optimum,
                optimum_rank=estimate_rank(space, best_layout),
                uncapped=uncapped,
                means=tuple(mean_objective(truth, t) for t in trials),
                mean_optimum=mean_optimum,
                uncapped_mean=uncapped_mean,
                origins=tuple(t.origin for t in trials),
            )
        )
    return outcomes


def trial_node_seconds(truth: Truth, trial: TrialRecord) -> float:
    """What a recorded trial cost on the truth's machine (nothing if it never ran)."""
    if trial.state is TrialState.INFEASIBLE:
        return 0.0
    return truth.node_seconds(truth.measure(trial.layout))


def mean_objective(truth: Truth, trial: TrialRecord) -> float | None:
    """The noiseless objective of an ok trial's layout (``None`` for a failed trial)."""
    if trial.state is not TrialState.OK:
        return None
    result = truth.measure(trial.layout, noisy=False)
    return float(result.metrics[truth.space.objective]) if result.ok else None


def random_to_target(
    truth: Truth, optimum: float, *, noisy: bool = True
) -> tuple[int, float] | None:
    """Trials and node-seconds random search spends to its first good layout (its order
    does not depend on results, so this reads past the budget)."""
    space = truth.space
    strategy = RandomStrategy(space, seed=truth.seed)
    spent = 0.0
    for number, proposal in enumerate(strategy.ask(sum(1 for _ in space.points())), 1):
        if space.violations(proposal.layout):
            continue
        result = truth.measure(proposal.layout)
        spent += truth.node_seconds(result)
        if noisy:
            value = result.metrics[space.objective] if result.ok else 0.0
        else:
            value = mean_objective_of(truth, proposal.layout, result)
        if value >= TARGET * optimum:
            return number, spent
    return None


def mean_objective_of(truth: Truth, layout: ParallelLayout, result) -> float:
    if not result.ok:
        return 0.0
    mean = truth.measure(layout, noisy=False)
    return float(mean.metrics[truth.space.objective]) if mean.ok else 0.0


def tasks(
    seeds: int,
    budget: int,
    spaces: Sequence[str],
    truths: Sequence[str],
    memories: Sequence[str],
    strategies: tuple[str | Variant, ...],
    warm: bool,
) -> list[Task]:
    """One task per seed, truth, memory direction and space where the truth applies
    (seed-major, so the progress lines of a run stopped early cover every cell); the 1T
    space also warm-started from 175B when ``warm``."""
    return [
        Task(space, truth, memory, seed, budget, strategies, warm=warm and space == WARM_TARGET)
        for seed in range(seeds)  # seed-major: a run stopped early covers every cell
        for truth in truths
        for memory in memories
        for space in spaces
        if applies(truth, memory, space)
    ]


def summarise(outcomes: list[Outcome], budget: int) -> str:
    """The results table: trials and node-hours to the target, failures, driver time."""
    groups: dict[tuple[str, str, str, str], list[Outcome]] = {}
    for outcome in outcomes:
        task = outcome.task
        groups.setdefault((task.truth, task.memory, task.space, outcome.label), []).append(outcome)
    lines = [
        f"| truth | memory | space | strategy | median trials to {TARGET:.0%} | worst | reached "
        f"| median node-h to {TARGET:.0%} | to a layout within 3% of the best: median / worst "
        f"(reached) | trials run | campaign node-h | OOM | OOM to {TARGET:.0%} | infeasible "
        "| ms/trial | first hit from | optimum's estimate rank |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for (truth, memory, space, strategy), group in sorted(groups.items()):
        needed = [o.trials_to_target() for o in group]
        reached = [n for n in needed if n is not None]
        ranked = sorted(n if n is not None else float("inf") for n in needed)
        hours = sorted(
            h if h is not None else float("inf") for h in (o.node_hours_to_target() for o in group)
        )
        ranks = sorted(o.optimum_rank or 0 for o in group)
        to_layout = sorted(
            n if n is not None else float("inf")
            for n in (o.trials_to_layout_target() for o in group)
        )
        found = sum(n != float("inf") for n in to_layout)
        ooms = [n for n in (o.ooms_to_target() for o in group) if n is not None]
        lines.append(
            f"| {truth} | {memory} | {space} | {strategy} "
            f"| {_count(statistics.median(ranked), budget)} "
            f"| {_count(ranked[-1], budget)} | {len(reached)}/{len(group)} "
            f"| {_hours(statistics.median(hours))} "
            f"| {_count(statistics.median(to_layout), budget)} / {_count(to_layout[-1], budget)} "
            f"({found}/{len(group)}) "
            f"| {statistics.median(len(o.states) for o in group):g} "
            f"| {_hours(statistics.median(sum(o.node_seconds) / 3600 for o in group))} "
            f"| {statistics.fmean(o.fraction(TrialState.OOM) for o in group):.0%} "
            f"| {f'{statistics.median(ooms):g}' if ooms else '-'} "
            f"| {statistics.fmean(o.fraction(TrialState.INFEASIBLE) for o in group):.0%} "
            f"| {1e3 * statistics.median(o.seconds_per_trial for o in group):.0f} "
            f"| {_origins(group)} "
            f"| {', '.join(str(r) if r else 'pOOM' for r in ranks)} |"
        )
    totals: dict[str, list[Outcome]] = {}
    for outcome in outcomes:
        totals.setdefault(outcome.label, []).append(outcome)
    lines.append("")
    lines += [
        f"first hits of {label}: {_origins(group)}" for label, group in sorted(totals.items())
    ]
    return "\n".join(lines)


def _origins(group: Sequence[Outcome]) -> str:
    """How many first hits each source of proposals made, with the share of all trials it
    proposed: a source that proposes much and hits nothing is spending the budget."""
    hits: dict[str, int] = {}
    proposed: dict[str, int] = {}
    for outcome in group:
        origin = outcome.first_hit_origin()
        if origin is not None:
            hits[origin] = hits.get(origin, 0) + 1
        for source in outcome.origins:
            proposed[source] = proposed.get(source, 0) + 1
    total = max(1, sum(proposed.values()))
    return ", ".join(
        f"{source} {hits.get(source, 0)} ({count / total:.0%} of trials)"
        for source, count in sorted(proposed.items(), key=lambda item: -item[1])
    )


def _count(value: float, budget: int) -> str:
    if value == float("inf"):
        return "not reached"
    text = f"{value:g}"
    return text + " (beyond budget)" if value > budget else text


def _hours(value: float) -> str:
    return "-" if value == float("inf") else f"{value:,.0f}"


def figure(outcomes: list[Outcome], budget: int, path: Path) -> None:
    """Median best-so-far curves: one panel per truth and space, all memory directions."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    truths = sorted({o.task.truth for o in outcomes})
    spaces = sorted({o.task.space for o in outcomes})
    labels = list(dict.fromkeys(o.label for o in outcomes))
    fig, axes = plt.subplots(
        len(truths),
        len(spaces),
        figsize=(3.6 * len(spaces), 3.0 * len(truths)),
        sharex=True,
        sharey=True,
        squeeze=False,
    )
    for row, truth in enumerate(truths):
        for col, space in enumerate(spaces):
            ax = axes[row][col]
            for number, label in enumerate(labels):
                group = [
                    o
                    for o in outcomes
                    if (o.task.truth, o.task.space, o.label) == (truth, space, label)
                ]
                if not group:
                    continue
                curve = np.median([o.best_so_far() for o in group], axis=0)
                ax.plot(
                    np.arange(1, budget + 1),
                    curve,
                    color=f"C{number}",
                    linestyle="--" if "warm" in label else "-",
                    label=label,
                )
            ax.axhline(TARGET, color="grey", linewidth=0.8, linestyle=":")
            ax.set_xscale("log")
            ax.set_ylim(0, 1.02)
            ax.set_title(f"{space}, {truth} truth", fontsize=9)
            if col == 0:
                ax.set_ylabel("best so far / optimum (median)")
            if row == len(truths) - 1:
                ax.set_xlabel("trial")
    handles, names = [], []
    for ax in axes.flat:
        for handle, text in zip(*ax.get_legend_handles_labels(), strict=True):
            if text not in names:
                handles.append(handle)
                names.append(text)
    fig.legend(handles, names, loc="lower center", ncol=min(len(names), 5), fontsize=9)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 seeds, budget 40, for CI")
    parser.add_argument("--seeds", type=int, help="seeds per cell (default 10; 5 with --settings)")
    parser.add_argument("--budget", type=int, help="trials per campaign (60; 40 with --settings)")
    parser.add_argument("--jobs", type=int, default=2, help="campaigns run at once")
    every_space = [*SPACES, *REPLAY_SPACES]
    parser.add_argument("--spaces", nargs="+", default=every_space, choices=every_space)
    parser.add_argument("--truths", nargs="+", default=list(TRUTHS), choices=list(TRUTHS))
    parser.add_argument("--memory", nargs="+", default=list(MEMORY), choices=list(MEMORY))
    parser.add_argument(
        "--strategies",
        nargs="+",
        choices=[*STRATEGY_NAMES, *(v.name for v in VARIANTS)],
        help="strategies (or --settings variants, by name) to run; default: all four",
    )
    parser.add_argument(
        "--settings",
        action="store_true",
        help="compare settings of the default strategy instead of the four strategies",
    )
    parser.add_argument(
        "--figure", type=Path, default=ROOT / "benchmarks" / "search_efficiency.png"
    )
    args = parser.parse_args()
    seeds = args.seeds or (5 if args.settings else 10)
    budget = args.budget or (40 if args.settings else 60)
    if args.quick:
        seeds, budget = 3, 40
    variants = {v.name: v for v in VARIANTS}
    strategies: tuple[str | Variant, ...] = VARIANTS if args.settings else STRATEGY_NAMES
    if args.strategies:
        strategies = tuple(variants.get(name, name) for name in args.strategies)
    warm = strategies == STRATEGY_NAMES
    todo = tasks(seeds, budget, args.spaces, args.truths, args.memory, strategies, warm)
    start = time.perf_counter()
    outcomes: list[Outcome] = []
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        for done, found in enumerate(pool.imap_unordered(run_task, todo), 1):
            outcomes += found
            task = found[0].task
            print(
                f"[{done}/{len(todo)} tasks, {time.perf_counter() - start:.0f} s] {task.truth} "
                f"{task.memory} {task.space} seed {task.seed}: trials to target "
                + ", ".join(
                    f"{o.label} {o.trials_to_target() or '-'} (layout "
                    f"{o.trials_to_layout_target() or '-'}, OOM {o.states.count('oom')})"
                    for o in found
                ),
                file=sys.stderr,
                flush=True,
            )
    print(summarise(outcomes, budget))
    if not args.settings:
        figure(outcomes, budget, args.figure)
    print(
        f"\n{len(todo)} tasks, {seeds} seeds, budget {budget}, "
        f"{time.perf_counter() - start:.0f} s"
        + ("" if args.settings else f"; figure {args.figure}"),
        flush=True,
    )


if __name__ == "__main__":
    main()
