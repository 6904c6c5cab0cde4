"""Node-hours to a full-scale-confirmed layout: proxy mode against full-scale-only trials.

Both modes run the real driver in-process (``parsearch.run_campaign``, ``proxy=True`` or
not) with the default strategy and a real store, on a :class:`ClockedTruth` backend: the
machines of :mod:`truths` (rescaled estimate, independent model, random field; memory as
is) answering each trial on the allocation's nodes under a virtual clock. A trial holds
``spec.nodes`` nodes for :data:`truths.STARTUP_S` plus its timed steps (a proxy its own,
at dp'), several at once when they fit; the driver starts each as soon as its nodes are
free.

*Node-hours to target*: the allocation's node-hours from the start to the end of the first
full-scale trial whose truth-measured objective is within 97% of the exhaustive full-scale
optimum (idle nodes count: the allocation is held), and the trials' own node-hours (busy
only). *Idle share*: the allocation's unused share up to that moment. *Final quality*: the
truth's measured objective of the campaign's answer (``store.best``: a full-scale trial, or
a proxy's layout measured by the truth when the budget ended before a confirmation) over
the optimum, at the end of the budget.

    .venv/bin/python benchmarks/proxy_node_hours.py [--seeds 10] [--budget 24]
        [--spaces gpt-175b-frontier gpt-1t-frontier] [--truths rescaled independent field]
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

from search_efficiency import TARGET, exhaustive_optimum, space_named
from truths import STARTUP_S, TRUTHS, Truth

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


def campaign(space_name: str, truth_name: str, seed: int, budget: int, proxy: bool) -> Outcome:
    space = space_named(space_name)
    truth = TRUTHS[truth_name](space, seed, 1.0)
    optimum, _ = exhaustive_optimum(truth)
    backend = ClockedTruth(truth)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "p.db"
        parsearch.run_campaign(
            space, db, backend=backend, strategy="default", budget=budget, seed=seed, proxy=proxy
        )
        with open_store(db, readonly=True) as store:
            campaign = store.get_campaign()
            trials = store.trials(campaign.id)
            answer = store.best(campaign.id)
    slug = campaign.name
    reached_at = None
    for trial in trials:
        if trial.proxy_dp is not None or trial.state is not TrialState.OK:
            continue
        value = _measured(truth, trial)
        if value is not None and value >= TARGET * optimum:
            end = backend.spans[f"{slug}-{trial.number:05d}-a{trial.attempt}"][1]
            reached_at = end if reached_at is None else min(reached_at, end)
    final = 0.0 if answer is None else (_measured(truth, answer) or 0.0) / optimum
    nodes = backend.nodes
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
        "| trial node-h ratio median | idle share to target, median / worst "
        "| final quality proxy / full (median) | proxies per campaign |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
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
    ratios, trial_ratios, idles = [], [], []
    for pair in group:
        p, f = pair[True], pair[False]
        if f.allocation_node_h is None:
            continue  # full scale never reached the target: no reference
        ratios.append(p.allocation_node_h / f.allocation_node_h if p.allocation_node_h else inf)
        trial_ratios.append(p.trial_node_h / f.trial_node_h if p.trial_node_h else inf)
        if p.idle_share is not None:
            idles.append(p.idle_share)
    reached_p = sum(1 for pair in group if pair[True].allocation_node_h is not None)
    reached_f = sum(1 for pair in group if pair[False].allocation_node_h is not None)
    quality_p = statistics.median(pair[True].final_quality for pair in group)
    quality_f = statistics.median(pair[False].final_quality for pair in group)
    proxies = statistics.median(pair[True].proxies for pair in group)
    return (
        f"| {space} | {truth} | {len(group)} | {reached_p} / {reached_f} "
        f"| {_r(statistics.median(ratios)) if ratios else '-'} "
        f"| {_r(max(ratios)) if ratios else '-'} "
        f"| {_r(statistics.median(trial_ratios)) if trial_ratios else '-'} "
        f"| {_pct(statistics.median(idles)) if idles else '-'} / "
        f"{_pct(max(idles)) if idles else '-'} "
        f"| {quality_p:.1%} / {quality_f:.1%} | {proxies:g} |"
    )


def _r(value: float) -> str:
    return "never" if value == float("inf") else f"{value:.2f}"


def _pct(value: float) -> str:
    return f"{value:.0%}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--budget", type=int, default=24)
    parser.add_argument("--spaces", nargs="+", default=["gpt-175b-frontier", "gpt-1t-frontier"])
    parser.add_argument("--truths", nargs="+", default=list(TRUTHS))
    args = parser.parse_args(argv)
    outcomes = []
    for space in args.spaces:
        for truth in args.truths:
            for seed in range(args.seeds):
                for proxy in (False, True):
                    outcome = campaign(space, truth, seed, args.budget, proxy)
                    outcomes.append(outcome)
                    print(replace(outcome), file=sys.stderr, flush=True)
    print(summarise(outcomes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
