"""A space's ``exclude`` rules: checked when the space loads, counted by plan, never searched."""

import copy
import json

import pytest

from parsearch.cli import main
from parsearch.errors import SpaceError
from parsearch.search.candidates import layout_problems, raw_layout
from parsearch.space import space_from_dict

SPACE = {
    "model": {"num_layers": 4, "hidden_size": 64, "num_heads": 4, "vocab_size": 128,
              "seq_length": 32},
    "allocation": {"nodes": 1, "devices_per_node": 4, "device_memory": "1GiB",
                   "peak_tflops": 0.05, "device": "cpu"},
    "search": {"tp": [1, 2, 4], "pp": [1, 2], "mbs": [1, 2], "zero_stage": [0, 1]},
    "global_batch": 8,
    "exclude": [
        {"when": {"zero_stage": 0}, "unless": {"tp": 1, "pp": 1}, "reason": "no DDP with tp/pp"}
    ],
}  # fmt: skip


def with_rules(*rules):
    data = copy.deepcopy(SPACE)
    data["exclude"] = list(rules)
    return data


def refused(layout):
    return layout.zero_stage == 0 and (layout.tp > 1 or layout.pp > 1)


def test_excluded_layouts_are_counted_with_their_reason_and_never_candidates():
    space = space_from_dict(SPACE, source="s.yaml")
    plan = space.plan()
    assert dict(plan.excluded) == {"no DDP with tp/pp": plan.excluded_count}
    assert plan.excluded_count > 0
    kept = plan.feasible + plan.predicted_oom
    assert kept and not any(refused(layout) for layout, _ in kept)
    assert any(layout.zero_stage == 0 for layout, _ in kept)  # tp1 pp1 DDP is allowed
    counted = plan.not_dividing_count + plan.excluded_count + len(plan.predicted_oom)
    assert plan.total == counted + len(plan.feasible)


def test_a_raw_strategy_records_an_excluded_point_with_the_rules_reason():
    space = space_from_dict(SPACE, source="s.yaml")
    point = {"tp": 2, "pp": 1, "mbs": 1, "zero_stage": 0}
    assert layout_problems(space, raw_layout(space, point)) == ["no DDP with tp/pp"]
    assert layout_problems(space, raw_layout(space, {**point, "zero_stage": 1})) == []


def test_rules_survive_the_stores_round_trip():
    """The store keeps the space as loaded (a dict): the rules come back with it."""
    space = space_from_dict(json.loads(json.dumps(SPACE)), source="campaign in store")
    assert space.exclusions == space_from_dict(SPACE).exclusions


def test_a_value_list_matches_any_of_its_values():
    rule = {"when": {"tp": [2, 4], "mbs": 2}, "reason": "r"}
    space = space_from_dict(with_rules(rule), source="s.yaml")
    excluded = {(layout.tp, layout.mbs) for layout, _ in space.plan().feasible}
    assert not excluded & {(2, 2), (4, 2)}
    assert (1, 2) in excluded or space.plan().predicted_oom


@pytest.mark.parametrize(
    ("rules", "field", "message"),
    [
        ({"when": {"zero_stage": 0}}, "exclude[0].reason", "is required"),
        ({"when": {"zero_stage": 0}, "reason": " "}, "exclude[0].reason", "is required"),
        ({"reason": "r"}, "exclude[0].when", "is required"),
        ({"when": {}, "reason": "r"}, "exclude[0].when", "at least one field"),
        ({"when": {"zero_stages": 0}, "reason": "r"}, "exclude[0].when.zero_stages",
         "did you mean 'zero_stage'"),
        ({"when": {"tp": "2"}, "reason": "r"}, "exclude[0].when.tp", "must be an integer"),
        ({"when": {"tp": 8}, "reason": "r"}, "exclude[0].when.tp", "matches no candidate"),
        ({"when": {"tp": []}, "reason": "r"}, "exclude[0].when.tp", "empty list"),
        ({"when": {"recompute": "most"}, "reason": "r"}, "exclude[0].when.recompute", "one of"),
        ({"when": {"tp": 2}, "unless": {"pp": 3}, "reason": "r"}, "exclude[0].unless.pp",
         "matches no candidate"),
        ({"when": {"tp": 2}, "reason": "r", "why": "x"}, "exclude[0].why", "unknown key"),
        ("tp > 1", "exclude[0]", "must be a mapping"),
    ],
)  # fmt: skip
def test_a_bad_rule_is_a_load_error_naming_the_rule_and_field(rules, field, message):
    with pytest.raises(SpaceError) as caught:
        space_from_dict(with_rules(rules), source="s.yaml")
    assert caught.value.field == field
    assert message in str(caught.value) and "s.yaml" in str(caught.value)


def test_exclude_must_be_a_list():
    data = with_rules()
    data["exclude"] = {"when": {"tp": 2}, "reason": "r"}
    with pytest.raises(SpaceError, match="must be a list of rules"):
        space_from_dict(data, source="s.yaml")


def test_rules_that_leave_nothing_say_so():
    data = with_rules({"when": {"mbs": [1, 2]}, "reason": "nothing at all"})
    with pytest.raises(SpaceError) as caught:
        space_from_dict(data, source="s.yaml").plan().require_runnable()
    assert caught.value.field == "exclude" and "nothing at all" in str(caught.value)


def test_plan_prints_the_excluded_count_and_reason(tmp_path, capsys):
    import yaml

    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(SPACE))
    assert main(["plan", str(path), "--format", "json"]) == 0
    counts = json.loads(capsys.readouterr().out)["counts"]
    assert counts["excluded"] > 0
    assert main(["plan", str(path)]) == 0
    assert "excluded:" in capsys.readouterr().out
