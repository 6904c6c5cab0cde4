"""Search-space files: every shipped space loads and plans; bad input gets a clear error."""

from pathlib import Path

import pytest
import yaml

from parsearch.errors import SpaceError
from parsearch.space import load_space, space_from_dict

SPACES = sorted((Path(__file__).parent.parent / "search_spaces").glob("*.yaml"))
VALID = {
    "model": {
        "num_layers": 4,
        "hidden_size": 64,
        "num_heads": 4,
        "vocab_size": 128,
        "seq_length": 32,
    },
    "allocation": {
        "nodes": 1,
        "devices_per_node": 4,
        "device_memory": "1GiB",
        "peak_tflops": 0.05,
        "device": "cpu",
    },
    "search": {"tp": [1, 2, 4], "pp": {"pow2": [1, 4]}, "mbs": {"range": [1, 3]}, "gas": [1, 2]},
}


def _space(**changes):
    data = yaml.safe_load(yaml.safe_dump(VALID))
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = data
        for parent in parents:
            node = node[parent]
        if value is _DELETE:
            del node[leaf]
        else:
            node[leaf] = value
    return data


_DELETE = object()


def test_shipped_spaces_include_the_required_set():
    names = {path.stem for path in SPACES}
    assert {"tiny-cpu", "gpt-22b-frontier", "gpt-175b-frontier", "gpt-1t-frontier"} <= names
    assert any(name.startswith("llama") for name in names)


@pytest.mark.parametrize("path", SPACES, ids=lambda p: p.stem)
def test_shipped_space_loads_plans_and_has_runnable_layouts(path):
    space = load_space(path)
    plan = space.plan()
    plan.require_runnable()
    counted = plan.not_dividing_count + plan.excluded_count + len(plan.predicted_oom)
    assert plan.total == counted + len(plan.feasible)
    best_layout, best = plan.feasible[0]
    assert space.violations(best_layout) == []
    assert best.peak_mem_bytes <= space.memory_limit_bytes
    assert "Sources" in path.read_text() or "Source" in path.read_text()


def test_frontier_spaces_use_the_study_hardware():
    for name, nodes in (
        ("gpt-22b-frontier", 16),
        ("gpt-175b-frontier", 128),
        ("gpt-1t-frontier", 384),
    ):
        space = load_space(Path(SPACES[0]).parent / f"{name}.yaml")
        assert space.allocation.nodes == nodes
        assert space.allocation.devices_per_node == 8
        assert space.allocation.device_memory_bytes == 64 * 2**30
        assert space.allocation.peak_flops_per_device == pytest.approx(191.5e12)


def test_ranges_expand_and_dp_is_derived():
    space = space_from_dict(_space())
    assert space.dimensions["pp"] == (1, 2, 4)
    assert space.dimensions["mbs"] == (1, 2, 3)
    layout = space.layout_from_point({"tp": 2, "pp": 1, "mbs": 3, "gas": 2})
    assert (layout.dp, layout.global_batch) == (2, 12)
    assert space.layout_from_point({"tp": 4, "pp": 4, "mbs": 1, "gas": 1}) is None


def test_fixed_global_batch_derives_gas():
    data = _space(global_batch=8, search__gas=_DELETE)
    space = space_from_dict(data)
    layout = space.layout_from_point({"tp": 1, "pp": 2, "mbs": 2})
    assert (layout.dp, layout.gas, layout.global_batch) == (2, 2, 8)
    assert space.layout_from_point({"tp": 1, "pp": 1, "mbs": 3}) is None


@pytest.mark.parametrize(
    ("changes", "field", "fragment"),
    [
        ({"modle": {}}, "modle", "did you mean 'model'"),
        ({"model__hidden": 64}, "model.hidden", "did you mean 'hidden_size'"),
        ({"model__num_layers": "four"}, "model.num_layers", "positive integer"),
        ({"model__num_heads": 5}, "model", "multiple of model.num_heads"),
        ({"model__vocab_size": _DELETE}, "model.vocab_size", "required"),
        ({"allocation__device_memory": "lots"}, "allocation.device_memory", "64GiB"),
        ({"allocation__nodes": 0}, "allocation.nodes", "positive integer"),
        ({"allocation__device": "tpu"}, "allocation.device", "'cuda' or 'cpu'"),
        ({"search__tp": []}, "search.tp", "empty"),
        ({"search__pp": {"pow2": [5, 7]}}, "search.pp", "no power of two"),
        ({"search__mbs": {"range": [4, 2]}}, "search.mbs.range", "empty"),
        ({"search__mbs": {"between": [1, 2]}}, "search.mbs", "pow2"),
        ({"search__gas": [1, 2.5]}, "search.gas", "integers"),
        ({"search__gas": _DELETE}, "search.gas", "global_batch"),
        ({"search__dp": [1, 2]}, "search.dp", "derived"),
        ({"search__recompute": ["some"]}, "search.recompute", "selective"),
        ({"search__zero_stage": [0, 5]}, "search.zero_stage", "0, 1, 2 or 3"),
        ({"search__cp": [1, 3, 32]}, "search.cp", "cp 3, 32 cannot split seq_length 32"),
        ({"search__cp": [1, 3, 32]}, "search.cp", "valid values up to 32: 1, 2, 4, 8, 16"),
        ({"search__cp": [0, 2]}, "search.cp", "integers >= 1"),
        ({"model__moe": {"num_experts": 8}}, "model.moe.top_k", "required"),
        (
            {"model__moe": {"num_experts": 8, "top_k": 9, "expert_ffn_hidden_size": 8}},
            "model.moe",
            "top_k (9) must be at most model.moe.num_experts (8)",
        ),
        (
            {"model__moe": {"num_experts": 8, "top_k": 2, "expert_ffn": 8}},
            "model.moe.expert_ffn",
            "did you mean 'expert_ffn_hidden_size'",
        ),
        (
            {
                "model__moe": {
                    "num_experts": 8,
                    "top_k": 2,
                    "expert_ffn_hidden_size": 8,
                    "capacity_factor": 0,
                }
            },
            "model.moe.capacity_factor",
            "positive",
        ),
        ({"objective": "speed"}, "objective", "tokens_per_s"),
        ({"trainer": {"kind": "magic"}}, "trainer.kind", "builtin"),
        ({"trainer": {"steps": 0}}, "trainer.steps", "positive"),
        ({"trainer": {"schedule": "zb"}}, "trainer.schedule", "1f1b"),
        ({"estimate": {"dp_overlap": 2}}, "estimate.dp_overlap", "(0, 1]"),
        ({"memory_cap": -1}, "memory_cap", "> 0"),
    ],
)
def test_bad_input_names_file_field_and_valid_values(changes, field, fragment):
    with pytest.raises(SpaceError) as caught:
        space_from_dict(_space(**changes), source="my-space.yaml")
    message = str(caught.value)
    assert message.startswith("my-space.yaml"), message
    assert caught.value.field == field, message
    assert fragment in message, message


def test_top_level_must_be_a_mapping():
    with pytest.raises(SpaceError, match="must be a mapping"):
        space_from_dict(["tp", "pp"], source="x.yaml")


def test_malformed_yaml_reports_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("model:\n  num_layers: 4\n   hidden_size: [1, 2\n")
    with pytest.raises(SpaceError, match=r"broken.yaml: not valid YAML at line \d+"):
        load_space(path)


def test_missing_file():
    with pytest.raises(SpaceError, match="file not found"):
        load_space("/nonexistent/space.yaml")


def test_world_size_nothing_divides():
    space = space_from_dict(
        _space(allocation__devices_per_node=3, search__tp=[2, 4], search__pp=[2, 4]),
        source="odd.yaml",
    )
    with pytest.raises(SpaceError, match=r"no layout of the .* divides") as caught:
        space.plan().require_runnable()
    assert "World size is 3" in str(caught.value)
    assert caught.value.field == "search"


def test_model_that_no_layout_fits():
    space = space_from_dict(_space(allocation__device_memory="1MiB"), source="big.yaml")
    with pytest.raises(SpaceError, match="predicted to run out of memory") as caught:
        space.plan().require_runnable()
    assert "the limit is 1 MiB" in str(caught.value)
    space.plan().require_runnable(keep_predicted_oom=True)


def test_memory_cap_lowers_the_limit():
    space = space_from_dict(_space(memory_cap="512MiB"))
    assert space.memory_limit_bytes == 512 * 2**20
