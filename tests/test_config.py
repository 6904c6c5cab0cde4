"""The one place layout rules live: each rule, and the layout/trial round trips."""

import pytest

from parsearch.config import (
    AllocationSpec,
    ModelSpec,
    MoESpec,
    ParallelLayout,
    check_layout,
    layout_violations,
)
from parsearch.errors import LayoutError
from parsearch.trial import TrialSpec

GPT = ModelSpec(num_layers=8, hidden_size=256, num_heads=8, vocab_size=1000, seq_length=64)


def test_valid_layout_has_no_violations():
    layout = ParallelLayout(tp=2, pp=2, dp=2, mbs=1, gas=4)
    assert layout_violations(layout, GPT, world_size=8) == []
    assert layout.world_size == 8
    assert layout.global_batch == 8


@pytest.mark.parametrize(
    ("layout", "world", "global_batch", "fragment"),
    [
        (ParallelLayout(2, 2, 1, 1, 1), 8, None, "world size 8"),
        (ParallelLayout(3, 1, 1, 1, 1), 3, None, "num_heads 8 not divisible by tp 3"),
        (ParallelLayout(1, 3, 1, 1, 1), 3, None, "num_layers 8 not divisible by pp*vpp"),
        (ParallelLayout(1, 2, 1, 1, 4, vpp=8), 2, None, "not divisible by pp*vpp = 2*8"),
        (ParallelLayout(1, 1, 1, 1, 1, vpp=2), 1, None, "vpp > 1 needs pp > 1"),
        (ParallelLayout(1, 2, 1, 1, 3, vpp=2), 2, None, "multiple of pp"),
        (ParallelLayout(1, 1, 2, 1, 1, sequence_parallel=True), 2, None, "needs tp > 1"),
        (ParallelLayout(1, 1, 1, 1, 1, zero_stage=1), 1, None, "needs dp*cp > 1"),
        (ParallelLayout(1, 1, 1, 1, 1, zero_stage=4), 1, None, "0, 1, 2 or 3"),
        (ParallelLayout(1, 1, 2, 2, 2), 2, 16, "!= global batch 16"),
        (ParallelLayout(1, 1, 1, 0, 1), 1, None, "mbs must be >= 1"),
        (ParallelLayout(1, 1, 1, 1, 1, cp=0), 1, None, "cp must be >= 1"),
        (ParallelLayout(2, 1, 1, 1, 1, cp=2), 8, None, "tp*cp*pp*dp = 2*2*1*1 = 4"),
        (ParallelLayout(1, 1, 1, 1, 1, cp=64), 64, None, "not divisible by 2*cp = 2*64"),
        (
            ParallelLayout(8, 1, 1, 1, 1, cp=8, sequence_parallel=True),
            64,
            None,
            "seq_length 64 not divisible by 2*cp = 2*8 times tp 8 (= 128)",
        ),
    ],
)
def test_each_rule_is_reported(layout, world, global_batch, fragment):
    problems = layout_violations(layout, GPT, world, global_batch)
    assert any(fragment in problem for problem in problems), problems
    with pytest.raises(LayoutError, match="invalid"):
        check_layout(layout, GPT, world, global_batch)


MOE = ModelSpec(
    num_layers=4, hidden_size=64, num_heads=4, vocab_size=100, seq_length=32, arch="llama",
    moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=48, first_dense_layers=1),
)  # fmt: skip


@pytest.mark.parametrize(
    ("layout", "model", "world", "fragment"),
    [
        (ParallelLayout(1, 1, 2, 1, 1, ep=2), GPT, 2, "ep > 1 needs a mixture-of-experts"),
        (ParallelLayout(2, 1, 1, 1, 1, etp=2), GPT, 2, "etp > 1 needs a mixture-of-experts"),
        (ParallelLayout(1, 1, 2, 1, 1, ep=16), MOE, 2, "num_experts 8 not divisible by ep 16"),
        (ParallelLayout(4, 1, 1, 1, 1, etp=2), MOE, 4, "etp must be 1 or tp (4), got 2"),
        (ParallelLayout(2, 1, 2, 1, 1, ep=8, etp=2), MOE, 4, "etp*ep = 2*8 does not divide"),
        (ParallelLayout(1, 1, 1, 1, 1, cp=2, ep=4), MOE, 2, "tp*cp*dp = 1*2*1"),
    ],
)
def test_expert_rules_fold_into_the_attention_ranks(layout, model, world, fragment):
    problems = layout_violations(layout, model, world)
    assert any(fragment in problem for problem in problems), problems


def test_experts_fold_into_tp_cp_and_dp_without_ranks_of_their_own():
    assert layout_violations(ParallelLayout(2, 1, 2, 1, 1, ep=4, etp=1), MOE, 4) == []
    assert layout_violations(ParallelLayout(1, 1, 2, 1, 1, cp=2, ep=4), MOE, 4) == []
    assert MOE.moe_layers == 3
    spec = TrialSpec("t", MOE, ParallelLayout(1, 1, 2, 1, 1, ep=2), AllocationSpec(1, 2, 1, 1e12))
    assert TrialSpec.from_dict(spec.to_dict()).model == MOE


def test_gqa_kv_heads_must_divide_by_tp():
    llama = ModelSpec(
        num_layers=4,
        hidden_size=256,
        num_heads=8,
        num_kv_heads=2,
        vocab_size=100,
        seq_length=32,
        arch="llama",
    )
    problems = layout_violations(ParallelLayout(4, 1, 1, 1, 1), llama, 4)
    assert problems == ["num_kv_heads 2 not divisible by tp 4"]


def test_model_rejects_heads_not_dividing_hidden():
    with pytest.raises(LayoutError, match=r"multiple of model\.num_heads"):
        ModelSpec(num_layers=2, hidden_size=100, num_heads=3, vocab_size=10, seq_length=8)


def test_layout_key_is_canonical_and_round_trips():
    layout = ParallelLayout(2, 4, 8, 1, 16, zero_stage=1, recompute="full")
    again = ParallelLayout.from_dict({**layout.to_dict(), "sequence_parallel": "false"})
    assert again == layout
    assert again.key() == layout.key()
    assert ParallelLayout(2, 4, 8, 1, 16).key() != layout.key()
    with pytest.raises(LayoutError, match="unknown layout fields"):
        ParallelLayout.from_dict({**layout.to_dict(), "tpp": 2})


def test_trial_spec_json_round_trip_and_node_count():
    alloc = AllocationSpec(
        nodes=4, devices_per_node=8, device_memory_bytes=2**30, peak_flops_per_device=1e12
    )
    spec = TrialSpec("t1", GPT, ParallelLayout(2, 4, 2, 1, 4), alloc, {"kind": "builtin"}, 30)
    again = TrialSpec.from_json(spec.to_json())
    assert again == spec
    assert spec.nodes == 2
    assert spec.ranks_per_node == 8
