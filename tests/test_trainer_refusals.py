"""What a trainer kind does not run is refused by the space before anything runs: the
built-in trainer's expert tensor parallelism and capacity routing are never proposed, and
plan says why; a command trainer refuses nothing of its own."""

from __future__ import annotations

import pytest

from parsearch.errors import SpaceError
from parsearch.space import space_from_dict

MOE_SPACE = {
    "model": {"arch": "llama", "num_layers": 2, "hidden_size": 64, "num_heads": 4,
              "vocab_size": 128, "seq_length": 64,
              "moe": {"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 32}},
    "allocation": {"nodes": 1, "devices_per_node": 4, "device": "cpu",
                   "device_memory": "4GiB", "peak_tflops": 1},
    "search": {"tp": [1, 2], "ep": [1, 2], "etp": [1, 2], "pp": [1], "mbs": [1], "gas": [1]},
}  # fmt: skip


def test_the_built_in_trainer_refuses_expert_tensor_parallelism_before_it_runs():
    plan = space_from_dict(MOE_SPACE).plan()
    runnable = [layout for layout, _ in plan.feasible + plan.predicted_oom]
    assert runnable and all(layout.etp == 1 for layout in runnable), runnable
    assert any("etp 2: the built-in trainer" in reason for reason in plan.excluded), plan.excluded
    (why,) = [r for r in plan.unreachable() if r.startswith("etp2")]
    assert "no layout divides or passes" in why, why


def test_a_command_trainer_keeps_the_layouts_it_may_run():
    data = {**MOE_SPACE, "trainer": {"kind": "command", "command": ["true"], "parser": "json"}}
    plan = space_from_dict(data).plan()
    assert any(layout.etp == 2 for layout, _ in plan.feasible + plan.predicted_oom)
    assert not plan.excluded


def test_capacity_routing_on_the_built_in_trainer_names_the_field():
    data = {**MOE_SPACE, "model": {**MOE_SPACE["model"]}}
    data["model"]["moe"] = {**data["model"]["moe"], "capacity_factor": 1.25}
    with pytest.raises(SpaceError, match=r"capacity_factor 1.25: the built-in trainer routes"):
        space_from_dict(data, source="moe.yaml").plan().require_runnable()
