"""The replay truth: a published sweep's measurements answer the benchmark's trials.

Hagemann et al. (arXiv 2311.05610) published every run of their LLaMA layout sweeps on
A100s (``benchmarks/replay/hagemann2023.csv``); the space files beside it search exactly
one sweep each. These tests hold the transcription to the spreadsheets' figures, the space
files to the sweeps' layouts, and a real campaign (driver, store, default strategy) to
what the sweep measured.
"""

import csv

import numpy as np
import pytest
from truths import REPLAY_CSV, REPLAY_DIR, PublishedSweep, TruthBackend

import parsearch
from parsearch.config import ParallelLayout
from parsearch.result import TrialState
from parsearch.search.factory import make_strategy
from parsearch.store import open_store

SWEEPS = sorted(path.stem for path in REPLAY_DIR.glob("*.yaml"))
# Layouts of a space that the sweep did not run with FlashAttention-2 (the spreadsheets
# have no row for them): 13B tp1 pp1 mbs8 either way and tp2 pp2 mbs1 with checkpointing;
# 65B tp4 pp2 mbs2 with checkpointing.
UNMEASURED = {"llama-13b-2k-a100-64": 3, "llama-65b-2k-a100-128": 1}
# Runs outside their space: the 30B sweep also ran 60 layers on 8 and 16 stages (uneven
# stages, which parsearch does not divide; none of them is that sweep's best).
OUTSIDE_PP = {"llama-30b-8k-a100-128": {8, 16}}


def replay(name: str, seed: int = 0) -> PublishedSweep:
    return PublishedSweep(parsearch.load_space(REPLAY_DIR / f"{name}.yaml"), seed)


def layout(space, tp: int, pp: int, mbs: int, recompute: str) -> ParallelLayout:
    dp = space.world_size // (tp * pp)
    gas = space.global_batch // (dp * mbs)
    return ParallelLayout(tp, pp, dp, mbs, gas, zero_stage=1, recompute=recompute)


def test_every_sweep_has_a_space_file_and_five_sweeps_are_replayed():
    with REPLAY_CSV.open(newline="") as file:
        sweeps = {row["sweep"] for row in csv.DictReader(file)}
    assert sweeps == set(SWEEPS)
    assert len(SWEEPS) == 5


@pytest.mark.parametrize("name", SWEEPS)
def test_the_space_searches_exactly_the_layouts_the_sweep_ran(name):
    truth = replay(name)
    plan = truth.space.plan()
    dividing = [lay for lay, _ in plan.feasible + plan.predicted_oom]
    keys = {(lay.tp, lay.pp, lay.mbs, lay.recompute) for lay in dividing}
    outside = {run for run in truth.runs if run not in keys}
    assert {pp for _, pp, _, _ in outside} == OUTSIDE_PP.get(name, set())
    unmeasured = [lay for lay in dividing if truth.measure(lay).status is TrialState.ERROR]
    assert len(unmeasured) == UNMEASURED.get(name, 0)
    assert len(keys) == len(dividing), "the space varies something the sweep did not"


@pytest.mark.parametrize("name", SWEEPS)
def test_the_declared_global_batch_matches_the_published_mfu(name):
    """MFU x peak x GPUs x step time / model FLOPs per token is the tokens per step
    (PaLM's MFU, as the paper computes it: 6N + 12 L H Q T per token); the space's
    global batch must give the same within the parameter count's rounding."""
    space = replay(name).space
    model = space.model
    layer = 4 * model.hidden_size**2 + 3 * model.hidden_size * model.ffn_hidden_size
    params = model.num_layers * layer + 2 * model.vocab_size * model.hidden_size
    per_token = 6 * params + 12 * model.num_layers * model.hidden_size * model.seq_length
    with REPLAY_CSV.open(newline="") as file:
        runs = [r for r in csv.DictReader(file) if r["sweep"] == name and r["status"] == "ok"]
    for run in runs:
        tokens = float(run["mfu"]) * 312e12 * space.world_size * float(run["step_time_s"])
        ratio = tokens / per_token / (space.global_batch * model.seq_length)
        assert 0.95 < ratio < 1.1, (run["trial_id"], ratio)


def test_a_trial_reports_what_the_sweep_measured():
    truth = replay("llama-13b-2k-a100-64")
    space = truth.space
    # Trial 132307 of the 13B spreadsheet: tp1 pp2 mbs1, no checkpointing, 33.6951 s.
    ran = truth.measure(layout(space, 1, 2, 1, "none"))
    assert ran.status is TrialState.OK
    assert ran.metrics["step_time_s"] == pytest.approx(33.6951)
    assert ran.metrics["tokens_per_s"] == pytest.approx(2048 * 2048 / 33.6951)
    assert "peak_mem_bytes" not in ran.metrics  # the sweep published none
    # Trial 132314: tp1 pp1 mbs1 without checkpointing ran out of memory.
    oom = truth.measure(layout(space, 1, 1, 1, "none"))
    assert oom.status is TrialState.OOM and "132314" in oom.error
    missing = truth.measure(layout(space, 1, 1, 8, "full"))
    assert missing.status is TrialState.ERROR and "not measured" in missing.error


def test_a_replay_has_no_memory_directions():
    space = parsearch.load_space(REPLAY_DIR / "llama-13b-2k-a100-64.yaml")
    with pytest.raises(ValueError, match="memory is as measured"):
        PublishedSweep(space, 0, mem_factor=1.2)


def test_the_default_strategy_finds_the_sweeps_best_layout_in_a_real_campaign(tmp_path):
    """LLaMA 65B on 128 A100s: the sweep's best layout (tp2 pp8 mbs1, no checkpointing,
    49.7% MFU) is 16% ahead of the next; the campaign must run it within its first five
    trials (the estimate's picks: DeepHyper's first proposal comes later), record the
    sweep's out-of-memory layouts as such, and rank it best."""
    truth = replay("llama-65b-2k-a100-128")
    space = truth.space
    best = max(
        (lay for lay, _ in space.plan().feasible + space.plan().predicted_oom),
        key=lambda lay: truth.measure(lay).metrics.get("tokens_per_s", 0.0),
    )
    assert (best.tp, best.pp, best.mbs, best.recompute) == (2, 8, 1, "none")
    store_path = tmp_path / "replay.db"
    parsearch.run_campaign(
        space,
        store_path,
        backend=TruthBackend(truth),
        strategy=make_strategy("default", space, seed=0),
        budget=5,
        seed=0,
    )
    with open_store(store_path, readonly=True) as store:
        trials = store.trials(store.get_campaign().id)
    assert len(trials) == 5
    assert best.key() in [trial.layout.key() for trial in trials]
    for trial in trials:
        assert trial.state is truth.measure(trial.layout).status
    ok = [t for t in trials if t.state is TrialState.OK]
    assert max(ok, key=lambda t: t.metrics["tokens_per_s"]).layout.key() == best.key()


def test_the_separating_margin_says_whether_any_weighting_of_the_parts_tells_oom_apart():
    from estimate_fidelity import separating_margin

    # Ran at (state, activations) = (0.3, 0.3) and (0.6, 0.1); out of memory at (0.2, 0.9).
    parts = np.array([[0.3, 0.3], [0.6, 0.1], [0.2, 0.9]])
    oom = np.array([False, False, True])
    assert separating_margin(parts, oom) > 0.2  # activations weighed up separate them
    # Summed, the out-of-memory run (1.1) is above both (0.6, 0.7): one scale separates too.
    assert separating_margin(parts.sum(axis=1, keepdims=True), oom) > 0
    # An out-of-memory run that needs less of every part than one that ran: no weighting.
    parts = np.array([[0.5, 0.5], [0.4, 0.4]])
    margin = separating_margin(parts, np.array([False, True]))
    assert margin < 0
    # The best weighting misses by the gap, in units of the wall.
    assert margin == pytest.approx(-1 / 9, abs=1e-6)


def test_the_parts_order_rules_out_what_needs_more_of_every_part_than_an_oom_run():
    from estimate_fidelity import dominance_verdicts

    # (state, activations): out of memory at (0.5, 0.5); (0.6, 0.5) ran out too and was
    # expected to fit, (0.4, 0.9) ran out but needs less state: not implied by the order;
    # (0.5, 0.6) ran although it needs more of both: the order would wrongly rule it out.
    parts = np.array([[0.5, 0.5], [0.6, 0.5], [0.4, 0.9], [0.5, 0.6], [0.3, 0.3]])
    oom = np.array([True, True, True, False, False])
    fits = np.array([False, True, True, True, True])
    assert dominance_verdicts(parts, oom, fits) == (1, 1)
    # Nothing out of memory: nothing ruled out.
    assert dominance_verdicts(parts, np.zeros(5, dtype=bool), fits) == (0, 0)
