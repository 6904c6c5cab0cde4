"""Expert parallelism in the built-in trainer trains like one process: ep 2 over data
parallel ranks with ZeRO-3 (the MoE layers kept out of FSDP, reduced by hand), and in a
4-rank world ep 2 folded over tp 2 (each tp rank routing its slice of the tokens), over
tp 2 · cp 2 with sequence parallelism, and over dp 2 under a 2-stage pipeline.

Each launch compares every rank's gradients after one step with one process's gradients of
the whole global batch (balance loss included) and the five steps' losses with one
process's, through :mod:`test_context_parallel`'s launcher. Then an MoE space runs through
``parsearch run``.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest
import yaml
from bench_helpers import tiny_spec
from test_context_parallel import ROOT, launch, reference  # noqa: F401 (a fixture)

import parsearch
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
    spec = tiny_spec(tp, pp, dp, model=MOE, ep=ep, cp=cp, **layout)
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
        moe_spec(1, 2, 2),
    ],
}

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


@pytest.mark.parametrize("world", sorted(LAUNCHES), ids=lambda w: f"world{w}")
def test_expert_parallel_trains_like_one_process(world, tmp_path, reference):  # noqa: F811
    for spec, item in zip(LAUNCHES[world], launch(LAUNCHES[world], tmp_path), strict=True):
        result = TrialResult.from_dict(item["result"])
        name = spec.layout.short()
        assert result.ok, (name, result.error)
        assert result.metrics["losses"] == pytest.approx(reference(spec), abs=1e-4), name
        assert item["grad_error"] < 1e-4, (name, "largest relative gradient error", item)
