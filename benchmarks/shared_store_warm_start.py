"""What a shared store's history is worth: trials to 97% of the optimum for GPT-175B on 64
Frontier nodes, cold and warm-started from a 175B campaign on 32 nodes in the same store
(issue 37, item 3).

A new campaign in a store that already holds the same model on the same devices at another
node count warm-starts from it (``parsearch.campaign.warm_start.store_warm_start_source``;
``parsearch run`` says so). The warm start this benchmark builds is the one that path loads:
``load_warm_start(store, name)`` of the 32-node campaign, run first in the same store file.
Both campaigns run the real driver on a :mod:`truths` machine (the same truth and seed at
both node counts, so the machine's departures from the estimate are shared, as they are
between two allocations of one machine), budget 60, one slot, as
``benchmarks/search_efficiency.py`` runs them. Printed per truth and memory direction:
median and worst trials to 97% over the seeds (a campaign that never reached it counts as
budget + 1) and their ratio warm / cold.

    .venv/bin/python benchmarks/shared_store_warm_start.py [--seeds 10] [--source-budget 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml
from search_efficiency import TARGET, campaign, exhaustive_optimum
from truths import MEMORY, TRUTHS, TruthBackend

from parsearch.campaign.api import run_campaign
from parsearch.campaign.warm_start import load_warm_start
from parsearch.result import TrialState
from parsearch.search.factory import make_strategy
from parsearch.space import SearchSpace, space_from_dict
from parsearch.store import open_store

ROOT = Path(__file__).resolve().parent.parent
SPACE = ROOT / "search_spaces" / "gpt-175b-frontier.yaml"
SOURCE_NODES, TARGET_NODES = 32, 64


def space_on(nodes: int) -> SearchSpace:
    data = yaml.safe_load(SPACE.read_text())
    data["allocation"]["nodes"] = nodes
    data["name"] = f"gpt-175b-frontier-{nodes}n"
    return space_from_dict(data, source=f"{SPACE} at {nodes} nodes")


def trials_to_target(store: Path, name: str, optimum: float, budget: int) -> int:
    with open_store(store, readonly=True) as opened:
        trials = opened.trials(opened.get_campaign(name).id)
    values = [t.objective if t.state is TrialState.OK else 0.0 for t in trials]
    reached = np.flatnonzero(np.maximum.accumulate(values) >= TARGET * optimum)
    return int(reached[0]) + 1 if len(reached) else budget + 1


def one_seed(truth_name: str, memory: str, seed: int, budget: int, source_budget: int):
    """(cold, warm) trials to target for one seed."""
    target = TRUTHS[truth_name](space_on(TARGET_NODES), seed, MEMORY[memory])
    source = TRUTHS[truth_name](space_on(SOURCE_NODES), seed, MEMORY[memory])
    optimum, _ = exhaustive_optimum(target)
    with tempfile.TemporaryDirectory() as tmp:
        cold_store = Path(tmp) / "cold.db"
        campaign(target, "default", budget, cold_store)
        cold = trials_to_target(cold_store, target.space.name, optimum, budget)
        shared = Path(tmp) / "shared.db"
        campaign(source, "default", source_budget, shared)
        warm_start = load_warm_start(shared, source.space.name)
        strategy = make_strategy("default", target.space, seed=seed, warm_start=warm_start)
        _run(target, strategy, budget, shared)
        warm = trials_to_target(shared, target.space.name, optimum, budget)
    return cold, warm


def _run(truth, strategy, budget: int, store: Path) -> None:
    run_campaign(
        truth.space, store, backend=TruthBackend(truth, 1), strategy=strategy,
        budget=budget, seed=truth.seed,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--budget", type=int, default=60)
    parser.add_argument("--source-budget", type=int, default=30)
    parser.add_argument("--truths", nargs="+", default=["rescaled", "independent", "field"])
    parser.add_argument("--memory", nargs="+", default=["as is", "heavier"])
    args = parser.parse_args(argv)
    print(
        f"GPT-175B on {TARGET_NODES} Frontier nodes, budget {args.budget}, {args.seeds} seeds;"
        f" warm: after a {args.source_budget}-trial campaign on {SOURCE_NODES} nodes"
        " in the same store"
    )
    print("| truth | memory | cold median (worst) | warm median (worst) | warm / cold |")
    print("|---|---|---|---|---|")
    for truth_name in args.truths:
        for memory in args.memory:
            pairs = []
            for seed in range(args.seeds):
                pairs.append(one_seed(truth_name, memory, seed, args.budget, args.source_budget))
                print(f"  {truth_name} {memory} seed {seed}: {pairs[-1]}", file=sys.stderr)
            cold = statistics.median(c for c, _ in pairs)
            warm = statistics.median(w for _, w in pairs)
            print(
                f"| {truth_name} | {memory} | {cold:g} ({max(c for c, _ in pairs)}) "
                f"| {warm:g} ({max(w for _, w in pairs)}) | {warm / cold:.2f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
