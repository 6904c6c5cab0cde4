"""The built-in trainer's MoE layer, one process: its output is every token's top-k experts
(renormalised weights) plus the shared expert, computed token by token; the balance loss is
its Switch/GShard value; the trainer refuses what it does not run, naming the field."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from bench_helpers import tiny_spec
from test_expert_parallel import MOE

from parsearch.errors import TrainerError
from parsearch.trainers.builtin.model import Transformer, materialize
from parsearch.trainers.builtin.moe import BALANCE_COEFF
from parsearch.trainers.builtin.trainer import refuse_unsupported_moe


@pytest.fixture(scope="module")
def moe_layer():
    spec = tiny_spec(model=MOE)
    with torch.device("meta"):
        model = Transformer(spec.model)
    materialize(model, torch.device("cpu"), spec.seed)
    assert type(model.layers["0"].feed_forward).__name__ == "FeedForward"  # first dense
    return model.layers["1"].feed_forward


def test_moe_output_is_each_tokens_experts_weighted(moe_layer):
    x = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = moe_layer(x)
        probs = moe_layer.router(x).softmax(-1)
        top, chosen = probs.topk(2, dim=-1)
        weights = top / top.sum(-1, keepdim=True)
        want = moe_layer.shared(x)
        e = moe_layer.experts
        for b, s, j in itertools.product(range(2), range(8), range(2)):
            k, t = chosen[b, s, j], x[b, s]
            expert = e.w2[k] @ (F.silu(e.w1[k] @ t) * (e.w3[k] @ t))
            want[b, s] += weights[b, s, j] * expert
    assert (out - want).abs().max() < 1e-5, (out - want).abs().max()


def test_balance_loss_is_coeff_under_uniform_routing(moe_layer):
    """Equal probabilities and equal counts give ``E · Σ (1/E)(1/E) = 1`` times the
    coefficient; all tokens on two experts with their probability give more."""
    uniform = torch.full((1, 8, 4), 0.25)
    spread = torch.arange(8).view(1, 8, 1).repeat(1, 1, 2) % 4
    assert moe_layer._balance_loss(uniform, spread).item() == pytest.approx(BALANCE_COEFF)
    skewed = torch.tensor([0.5, 0.5, 0.0, 0.0]).expand(1, 8, 4)
    pair = torch.tensor([0, 1]).expand(1, 8, 2)
    assert moe_layer._balance_loss(skewed, pair).item() == pytest.approx(2 * BALANCE_COEFF)


@pytest.mark.parametrize(
    ("model", "layout", "field"),
    [
        ({"moe": MOE["moe"] | {"capacity_factor": 1.25}}, {}, "capacity_factor"),
        ({}, {"tp": 2, "etp": 2}, "etp 2"),
        ({"seq_length": 30}, {"tp": 4}, "seq_length 30"),
    ],
)
def test_the_trainer_refuses_what_it_does_not_run(model, layout, field):
    tp = layout.pop("tp", 1)
    spec = tiny_spec(tp, model=MOE | model, ep=1, **layout)
    with pytest.raises(TrainerError, match=field):
        refuse_unsupported_moe(spec)
