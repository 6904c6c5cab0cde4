"""Stores of campaigns at the scales a dashboard must show right, written through the store API.

Each campaign's numbers are chosen, not simulated, so a test knows which magnitudes the
page must print: objective values around 1, 100 and 1e5, memory from MiB to hundreds of
GiB, from 5 to 500 trials, with out-of-memory and failed trials among them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from parsearch.result import TrialResult, TrialState
from parsearch.space import load_space
from parsearch.store import open_store

ROOT = Path(__file__).parent.parent
SPACES = ROOT / "search_spaces"
MIB, GIB = 2**20, 2**30


@dataclass(frozen=True)
class Scale:
    """A campaign to write: its space, objective, size and the ranges of its numbers."""

    name: str
    space: str
    objective: str
    trials: int
    value: tuple[float, float]  # the objective of ok trials, uniformly in this range
    memory: tuple[float, float]  # peak memory per rank, bytes
    # Values the page once printed 10x or 100x too small (issue #28): given to the first trials.
    exact: tuple[float, ...] = ()


SCALES = (
    Scale("small", "tiny-cpu.yaml", "tflops_per_device", 5, (0.55, 1.45), (9 * MIB, 23 * MIB),
          exact=(1.0, 0.5)),
    Scale("mid", "llama3-8b-h200.yaml", "tflops_per_device", 150, (90.0, 610.0),
          (20 * GIB, 130 * GIB), exact=(469.5, 599.8, 100.0, 150.0, 600.0)),
    Scale("huge", "gpt-22b-frontier.yaml", "tokens_per_s", 500, (4.0e4, 1.6e5),
          (100 * GIB, 640 * GIB), exact=(1.0e5, 150000.0)),
)  # fmt: skip


def write_campaign(store, scale: Scale, seed: int = 0, nodes: int = 4) -> None:
    """``scale``'s campaign: trials over the space's layouts, mostly ok, some out of memory
    (with a reason in raw bytes, as an older trainer wrote it) and some failed."""
    space = load_space(SPACES / scale.space)
    plan = space.plan()
    layouts = [layout for layout, _ in plan.feasible + plan.predicted_oom]
    assert len(layouts) >= scale.trials, (scale.name, len(layouts))
    rng = random.Random(seed)
    campaign = store.create_campaign(
        scale.name,
        space.raw,
        space_path=str(SPACES / scale.space),
        budget=scale.trials,
        backend="simulate",
        objective_metric=scale.objective,
    )
    exact = list(scale.exact)
    for i, layout in enumerate(layouts[: scale.trials]):
        value = exact.pop(0) if exact else rng.uniform(*scale.value)
        memory = rng.uniform(*scale.memory)
        predicted = {
            scale.objective: value * rng.uniform(0.85, 1.15),
            "peak_mem_bytes": memory * rng.uniform(0.85, 1.15),
        }
        if i == 1 and scale.name == "mid":
            predicted[scale.objective] = 590.2
        record = store.add_trial(campaign.id, layout, predicted=predicted)
        hosts = [f"node{(i * 2 + k) % nodes:02d}" for k in range(2)]
        store.mark_running(record.id, hosts, attempt=1)
        roll = rng.random() if i >= 3 else 0.0
        if roll > 0.9:
            cap = int(scale.memory[1])
            result = TrialResult(
                TrialState.OOM,
                metrics={"peak_mem_bytes": cap + 1234567},
                error=f"measured peak {cap + 1234567} B exceeds the cap of {cap} B",
                duration_s=rng.uniform(5, 50),
            )
        elif roll > 0.85:
            result = TrialResult(TrialState.ERROR, error="simulated crash", duration_s=3.0)
        else:
            metrics = {
                "tokens_per_s": value * 7 if scale.objective != "tokens_per_s" else value,
                "tflops_per_device": value if scale.objective == "tflops_per_device" else 150.0,
                "mfu": rng.uniform(0.2, 0.6),
                "step_time_s": rng.uniform(0.2, 20),
                "peak_mem_bytes": memory,
            }
            result = TrialResult(TrialState.OK, metrics=metrics, duration_s=rng.uniform(10, 400))
        objective = result.metrics[scale.objective] if result.ok else None
        store.finish_trial(record.id, result, objective)
    store.update_campaign(campaign.id, status="finished")


def write_store(path: Path, scales=SCALES) -> Path:
    with open_store(path) as store:
        for scale in scales:
            write_campaign(store, scale)
    return path
