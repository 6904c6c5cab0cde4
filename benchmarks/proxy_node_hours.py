"""Node-hours to a full-scale-confirmed layout: proxy mode against full-scale-only trials.

Both modes run the real driver in-process (``parsearch.run_campaign``, ``proxy=True`` or
not) with the default strategy and a real store, on a :class:`ClockedTruth` backend: the
machines of :mod:`truths` (rescaled estimate, independent model, random field) and of
:mod:`proxy_truths` (a DP reduction whose proxy error differs by layout, ``dp-skew``; memory
that runs out at full scale where the proxy fits, ``dp-wall``), memory as is or
``--memory heavier``/``lighter``, answering each trial on the allocation's nodes under a
virtual clock. A trial holds ``spec.nodes`` nodes for :data:`truths.STARTUP_S` plus its
timed steps (a proxy its own, at dp'), several at once when they fit; the driver starts
each as soon as its nodes are free. The plain campaign has ``--budget`` trials; the proxy
campaign ``--proxy-budget`` times as many, so that it runs at least as many node-hours.

*Node-hours to target*: the allocation's node-hours from the start to the end of the first
full-scale trial whose truth-measured objective is within 97% of the exhaustive full-scale
optimum (idle nodes count: the allocation is held), and the trials' own node-hours (busy
only). *Idle share*: the allocation's unused share up to that moment. *Final quality*: the
truth's measured objective of the campaign's answer (``store.best``: a full-scale trial, or
a proxy's layout measured by the truth when the budget ended before a confirmation) over
the optimum, at the end of the budget. *At equal node-hours*: the proxy campaign's answer
when it has held the allocation as long as the plain campaign held it for its whole budget
(the full-scale trial with the best recorded objective among those finished by then; 0
with none), against the plain campaign's final answer. *Trials to target*: the plain
campaign's trials up to its first within 97%; the node-hour ratio is also given over the
seeds where that is 4 or more (where proxies have something to save).

    .venv/bin/python benchmarks/proxy_node_hours.py [--seeds 10] [--budget 24]
        [--proxy-budget 2] [--spaces gpt-175b-frontier gpt-1t-frontier]
        [--truths rescaled independent field dp-skew dp-wall] [--memory "as is"] [--settle]
"""

from __future__ import annotations

import argparse
import heapq
import statistics
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from proxy_truths import PROXY_TRUTHS
from search_efficiency import TARGET, exhaustive_optimum, space_named
from truths import MEMORY, STARTUP_S, TRUTHS, Truth

import parsearch
from parsearch.backends import Finished
from parsearch.errors import BackendError
from parsearch.result import TrialResult, TrialState
from parsearch.store import TrialRecord, open_store
from parsearch.trial import TrialSpec


class ClockedTruth:
    """A truth's allocation under a virtual clock: trials hold nodes for their duration."""

    name = "truth"

    def __init__(self, truth: Truth):
        self.truth = truth
        self.nodes = truth.space.allocation.nodes
        self.free = self.nodes
        self.now = 0.0
        self._heap: list[tuple[float, int, str, int, TrialResult]] = []
        self._count = 0
        self.spans: dict[str, tuple[float, float, int]] = {}  # trial id: start, end, nodes

    @property
    def capacity(self) -> int:
        return 1

    def room_for(self, nodes: int) -> int:
        return self.free // nodes

    def clock(self) -> float:
        return self.now

    def free_slots(self) -> int:
        return self.room_for(self.nodes)

    def submit(self, spec: TrialSpec) -> list[str]:
        if spec.nodes > self.free:
            raise BackendError(f"{spec.nodes} nodes wanted, {self.free} free")
        result = self.truth.measure(spec.layout)
        space = self.truth.space
        if result.status is TrialState.TIMEOUT:
            held = STARTUP_S + space.trial_timeout_s
        else:
            held = STARTUP_S + (result.duration_s or 0.0)
        self.free -= spec.nodes
        end = self.now + held
        self.spans[spec.trial_id] = (self.now, end, spec.nodes)
        heapq.heappush(self._heap, (end, self._count, spec.trial_id, spec.nodes, result))
        self._count += 1
        return ["truth"]

    def poll(self, timeout_s: float) -> list[Finished]:
        """Jump the clock to the next finish; every trial ending then is reported."""
        if not self._heap:
            return []
        self.now = self._heap[0][0]
        done = []
        while self._heap and self._heap[0][0] <= self.now:
            _, _, trial_id, nodes, result = heapq.heappop(self._heap)
            self.free += nodes
            done.append(Finished(trial_id, result))
        return done

    def cancel(self, trial_id: str) -> None:
        raise BackendError("nothing is cancelled in this benchmark")

    def close(self) -> None:
        self._heap = []

    def describe(self) -> dict[str, Any]:
        return {"truth": self.truth.name, "seed": self.truth.seed}

    def busy_node_seconds(self, until: float) -> float:
        return sum(
            nodes * max(0.0, min(end, until) - start) for start, end, nodes in self.spans.values()
        )


ALL_TRUTHS: dict[str, type[Truth]] = {**TRUTHS, **PROXY_TRUTHS}
DEFAULT_TRUTHS = ["rescaled", "independent", "field", *PROXY_TRUTHS]


@dataclass(frozen=True)
class Outcome:
    space: str
    truth: str
    seed: int
    proxy: bool
    allocation_node_h: float | None  # to target, idle included (None: not reached)
    trial_node_h: float | None  # to target, busy only
    idle_share: float | None  # of the allocation, to target
    final_quality: float  # the answer's truth-measured objective / optimum
    trials: int
    proxies: int
    answer_full_scale: bool
    trials_to_target: int | None  # trials started up to the first within 97%
    end_node_h: float  # the allocation's node-hours at the campaign's end
    ooms: int  # trials out of memory (proxies or full scale)
    # Full-scale trials that succeeded: (end, allocation node-hours; recorded objective;
    # the truth's objective over the optimum), for the answer at a given node-hour count.
    confirmed: tuple[tuple[float, float, float], ...] = ()

    def quality_at(self, node_h: float) -> float:
        """The answer's quality once the allocation has been held ``node_h`` node-hours:
        the best recorded full-scale trial finished by then (0 with none)."""
        done = [(recorded, quality) for end, recorded, quality in self.confirmed if end <= node_h]
        return max(done)[1] if done else 0.0


def campaign(
    space_name: str,
    truth_name: str,
    seed: int,
    budget: int,
    proxy: bool,
    memory: float = 1.0,
    settle: bool = False,
) -> Outcome:
    space = space_named(space_name)
    truth = ALL_TRUTHS[truth_name](space, seed, memory)
    optimum, _ = exhaustive_optimum(truth)
    backend = ClockedTruth(truth)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "p.db"
        parsearch.run_campaign(
            space,
            db,
            backend=backend,
            strategy="default",
            budget=budget,
            seed=seed,
            proxy=proxy,
            settle=settle,
        )
        with open_store(db, readonly=True) as store:
            campaign = store.get_campaign()
            trials = store.trials(campaign.id)
            answer = store.best(campaign.id)
    slug = campaign.name
    nodes = backend.nodes
    reached_at, trials_to_target = None, None
    confirmed = []
    for index, trial in enumerate(trials, 1):
        if trial.proxy_dp is not None or trial.state is not TrialState.OK:
            continue
        value = _measured(truth, trial)
        end = backend.spans[f"{slug}-{trial.number:05d}-a{trial.attempt}"][1]
        if value is not None and trial.objective is not None:
            confirmed.append((nodes * end / 3600, trial.objective, value / optimum))
        reached = value is not None and value >= TARGET * optimum
        if reached and (reached_at is None or end < reached_at):
            reached_at, trials_to_target = end, index
    final = 0.0 if answer is None else (_measured(truth, answer) or 0.0) / optimum
    ended = max((end for _, end, _ in backend.spans.values()), default=0.0)
    busy = None if reached_at is None else backend.busy_node_seconds(reached_at)
    return Outcome(
        space=space_name,
        truth=truth_name,
        seed=seed,
        proxy=proxy,
        allocation_node_h=None if reached_at is None else nodes * reached_at / 3600,
        trial_node_h=None if busy is None else busy / 3600,
        idle_share=None if reached_at is None or busy is None else 1 - busy / (nodes * reached_at),
        final_quality=final,
        trials=len(trials),
        proxies=sum(1 for t in trials if t.proxy_dp is not None),
        answer_full_scale=answer is not None and answer.proxy_dp is None,
        trials_to_target=trials_to_target,
        end_node_h=nodes * ended / 3600,
        ooms=sum(1 for t in trials if t.state is TrialState.OOM),
        confirmed=tuple(confirmed),
    )


def _measured(truth: Truth, trial: TrialRecord) -> float | None:
    """The truth's full-scale objective of the trial's layout (what a full-scale run of it
    reports; for a full-scale trial, what it measured)."""
    result = truth.measure(trial.layout)
    return float(result.metrics[truth.space.objective]) if result.ok else None


def summarise(outcomes: list[Outcome]) -> str:
    pairs: dict[tuple[str, str, int], dict[bool, Outcome]] = {}
    for o in outcomes:
        pairs.setdefault((o.space, o.truth, o.seed), {})[o.proxy] = o
    lines = [
        "| space | truth | seeds | reached (proxy / full) | node-h ratio median | worst "
        "| median where full needs >= 4 trials (seeds) "
        "| trial node-h ratio median | idle share to target, median / worst "
        "| final quality proxy / full (median) "
        "| at equal node-h proxy / full, median | worst | OOM share proxy / full "
        "| proxies per campaign |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    groups: dict[tuple[str, str], list[dict[bool, Outcome]]] = {}
    for (space, truth, _), pair in sorted(pairs.items()):
        groups.setdefault((space, truth), []).append(pair)
    every: list[dict[bool, Outcome]] = []
    for (space, truth), group in groups.items():
        every += group
        lines.append(_row(space, truth, group))
    lines.append(_row("all", "all", every))
    return "\n".join(lines)


def _row(space: str, truth: str, group: list[dict[bool, Outcome]]) -> str:
    inf = float("inf")
    ratios, trial_ratios, idles, long_ratios = [], [], [], []
    for pair in group:
        p, f = pair[True], pair[False]
        if f.allocation_node_h is None:
            continue  # full scale never reached the target: no reference
        ratios.append(p.allocation_node_h / f.allocation_node_h if p.allocation_node_h else inf)
        if f.trials_to_target is not None and f.trials_to_target >= 4:
            long_ratios.append(ratios[-1])
        trial_ratios.append(p.trial_node_h / f.trial_node_h if p.trial_node_h else inf)
        if p.idle_share is not None:
            idles.append(p.idle_share)
    reached_p = sum(1 for pair in group if pair[True].allocation_node_h is not None)
    reached_f = sum(1 for pair in group if pair[False].allocation_node_h is not None)
    quality_p = statistics.median(pair[True].final_quality for pair in group)
    quality_f = statistics.median(pair[False].final_quality for pair in group)
    proxies = statistics.median(pair[True].proxies for pair in group)
    # The proxy campaign's answer once it has held the allocation as long as the plain one.
    equal = [
        (pair[True].quality_at(pair[False].end_node_h), pair[False].final_quality) for pair in group
    ]
    deficit = min(equal, key=lambda qs: qs[0] - qs[1])
    oom_p = sum(pair[True].ooms for pair in group) / sum(pair[True].trials for pair in group)
    oom_f = sum(pair[False].ooms for pair in group) / sum(pair[False].trials for pair in group)
    return (
        f"| {space} | {truth} | {len(group)} | {reached_p} / {reached_f} "
        f"| {_r(statistics.median(ratios)) if ratios else '-'} "
        f"| {_r(max(ratios)) if ratios else '-'} "
        f"| {_r(statistics.median(long_ratios)) if long_ratios else '-'} ({len(long_ratios)}) "
        f"| {_r(statistics.median(trial_ratios)) if trial_ratios else '-'} "
        f"| {_pct(statistics.median(idles)) if idles else '-'} / "
        f"{_pct(max(idles)) if idles else '-'} "
        f"| {quality_p:.1%} / {quality_f:.1%} "
        f"| {statistics.median(q for q, _ in equal):.1%} / "
        f"{statistics.median(q for _, q in equal):.1%} "
        f"| {deficit[0]:.1%} / {deficit[1]:.1%} | {_pct(oom_p)} / {_pct(oom_f)} "
        f"| {proxies:g} |"
    )


def _r(value: float) -> str:
    return "never" if value == float("inf") else f"{value:.2f}"


def _pct(value: float) -> str:
    return f"{value:.0%}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--budget", type=int, default=24)
    parser.add_argument(
        "--proxy-budget", type=float, default=2.0, help="the proxy campaign's budget, in budgets"
    )
    parser.add_argument("--spaces", nargs="+", default=["gpt-175b-frontier", "gpt-1t-frontier"])
    parser.add_argument("--truths", nargs="+", default=DEFAULT_TRUTHS, choices=list(ALL_TRUTHS))
    parser.add_argument("--memory", default="as is", choices=list(MEMORY))
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--settle", action="store_true", help="both campaigns run --settle")
    args = parser.parse_args(argv)
    outcomes = []
    memory = MEMORY[args.memory]
    for space in args.spaces:
        for truth in args.truths:
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                for proxy in (False, True):
                    budget = round(args.budget * args.proxy_budget) if proxy else args.budget
                    outcome = campaign(space, truth, seed, budget, proxy, memory, args.settle)
                    outcomes.append(outcome)
                    print(replace(outcome, confirmed=()), file=sys.stderr, flush=True)
    print(summarise(outcomes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
