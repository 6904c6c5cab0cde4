"""Expert parallelism in the built-in trainer trains like one process: ep 2 over data
parallel ranks with ZeRO-3 (the MoE layers kept out of FSDP, reduced by hand), and in a
4-rank world ep 2 folded over tp 2 (each tp rank routing its slice of the tokens), over
tp 2 · cp 2 with sequence parallelism, and over dp 2 under a 2-stage pipeline with
full recompute (the dispatch runs again in backward).

Each launch compares every rank's gradients after one step with one process's gradients of
the whole global batch (balance loss included) and the two steps' losses with one
process's, through :mod:`test_context_parallel`'s launcher. Then an MoE space runs through
``parsearch run``.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from bench_helpers import tiny_spec
from test_context_parallel import (  # noqa: F401 (reference: a fixture)
    launch,
    reference,
    two_trials_through_the_cli,
)

from parsearch.result import TrialResult
from parsearch.trial import TrialSpec

# Layer 0 dense, layers 1-3 MoE: 4 experts top-2 with a shared expert.
MOE = {
    "arch": "llama",
    "num_kv_heads": 2,
    "moe": {
        "num_experts": 4,
        "top_k": 2,
        "expert_ffn_hidden_size": 32,
        "shared_expert_ffn_hidden_size": 16,
        "first_dense_layers": 1,
    },
}


def moe_spec(tp: int = 1, pp: int = 1, dp: int = 1, *, ep: int = 2, cp: int = 1, **layout):
    """:func:`tiny_spec` of the MoE model with an allocation of the layout's world."""
    trainer = {"steps": 1, "warmup_steps": 1}  # the gradients are compared too
    spec = tiny_spec(tp, pp, dp, model=MOE, trainer=trainer, ep=ep, cp=cp, **layout)
    world = spec.layout.world_size
    return replace(
        spec,
        trial_id=spec.layout.short(),
        allocation=replace(spec.allocation, devices_per_node=world),
    )


LAUNCHES = {
    2: [moe_spec(1, 1, 2, zero_stage=3)],
    4: [
        moe_spec(2, 1, 2),
        moe_spec(2, 1, 1, cp=2, sequence_parallel=True),
        moe_spec(1, 2, 2, recompute="full"),
    ],
}

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


def first_balance_loss(spec: TrialSpec) -> float:
    """One process's balance loss (summed over the MoE layers) of the whole global batch
    at the initial weights."""
    from parsearch.trainers.builtin.model import Transformer, loss_fn, materialize
    from parsearch.trainers.builtin.parallelize import moe_layers
    from parsearch.trainers.builtin.trainer import synthetic_batch

    with torch.device("meta"):
        model = Transformer(spec.model)
    materialize(model, torch.device("cpu"), spec.seed)
    tokens = synthetic_batch(spec)
    loss_fn(model(tokens[:, :-1]), tokens[:, 1:]).backward()
    return sum(float(moe.balance_record[0]) for moe in moe_layers(model))


@pytest.mark.parametrize("world", sorted(LAUNCHES), ids=lambda w: f"world{w}")
def test_expert_parallel_trains_like_one_process(world, tmp_path, reference):  # noqa: F811
    balance = first_balance_loss(LAUNCHES[world][0])
    assert balance > 0.01 * 3, balance  # 3 MoE layers, each at least the coefficient
    for spec, item in zip(LAUNCHES[world], launch(LAUNCHES[world], tmp_path), strict=True):
        result = TrialResult.from_dict(item["result"])
        name = spec.layout.short()
        assert result.ok, (name, result.error)
        want = reference(spec)[:2]
        assert result.metrics["losses"] == pytest.approx(want, abs=1e-4), name
        assert item["grad_error"] < 1e-4, (name, "largest relative gradient error", item)
        assert result.metrics["balance_losses"][0] == pytest.approx(balance, rel=1e-5), name


# A tiny MoE model on 2 CPU ranks; its only layouts are ep 1 and ep 2, both dp 2.
MOE_SPACE = {
    "name": "moe-cpu",
    "model": {"arch": "llama", "num_layers": 2, "hidden_size": 32, "num_heads": 2,
              "vocab_size": 64, "seq_length": 16,
              "moe": {"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 16}},
    "allocation": {"nodes": 1, "devices_per_node": 2, "device": "cpu", "device_memory": "256MiB",
                   "peak_tflops": 0.05},
    "search": {"tp": [1], "pp": [1], "mbs": [1], "ep": [1, 2]},
    "global_batch": 2,
    "trainer": {"kind": "builtin", "steps": 1, "warmup_steps": 1, "timeout": 120},
}  # fmt: skip


@pytest.mark.e2e
def test_an_moe_trial_runs_through_the_cli(tmp_path):
    """Both layouts run on the local backend and, training the same model on the same
    tokens, report the same losses."""
    _, frame = two_trials_through_the_cli(MOE_SPACE, tmp_path)
    assert sorted(frame["ep"]) == [1, 2], frame
    rows = zip(frame["ep"], frame["losses"], strict=True)
    losses = {int(ep): json.loads(text) for ep, text in rows}
    assert losses[1] == pytest.approx(losses[2], abs=1e-4), losses
    rows = zip(frame["ep"], frame["balance_losses"], strict=True)
    balance = {int(ep): json.loads(text) for ep, text in rows}
    assert balance[1] == pytest.approx(balance[2], rel=1e-5), balance
