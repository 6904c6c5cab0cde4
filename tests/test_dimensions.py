"""A layout dimension is declared once, and every place that lists dimensions reads it.

Each test takes the declarations (:data:`LAYOUT_DIMENSIONS`) as its truth, so a new
dimension declared in the layout reaches the space, the short form, ``trial --layout``,
the API's filters, command templates and the search's features without touching them; a
listing that names dimensions by hand fails here when one is added.
"""

from __future__ import annotations

import pytest

from parsearch.commands.trial import parse_layout
from parsearch.config import DIMENSIONS_BY_NAME, LAYOUT_DIMENSIONS, ParallelLayout
from parsearch.search.residual import NUMERIC, features
from parsearch.serve.views import BadRequest, TrialFilter, trial_filter, trial_filter_parameters
from parsearch.space import DIMENSIONS, space_from_dict
from parsearch.trainers.command.template import NUMERIC as NUMERIC_PLACEHOLDERS
from parsearch.trainers.command.template import PLACEHOLDERS

SPACE = {
    "model": {"num_layers": 4, "hidden_size": 64, "num_heads": 4, "vocab_size": 128,
              "seq_length": 64},
    "allocation": {"nodes": 1, "devices_per_node": 8, "device": "cpu",
                   "device_memory": "4GiB", "peak_tflops": 1},
    "search": {"tp": [1, 2], "cp": [1, 2, 4], "pp": [1, 2], "mbs": [1], "gas": [2],
               "recompute": ["none", "full"], "sequence_parallel": [False, True],
               "zero_stage": [0, 1]},
}  # fmt: skip


def layouts() -> list[ParallelLayout]:
    space = space_from_dict(SPACE)
    return [layout for layout, _ in space.plan().feasible + space.plan().predicted_oom]


def test_declarations_match_the_layout_fields_in_display_order():
    assert set(DIMENSIONS_BY_NAME) == set(ParallelLayout.__dataclass_fields__)
    assert [d.name for d in LAYOUT_DIMENSIONS][:6] == ["tp", "cp", "ep", "etp", "pp", "dp"]
    assert set(DIMENSIONS) == set(DIMENSIONS_BY_NAME) - {"dp"}


def test_every_layout_of_a_cp_space_reads_back_from_its_short_form():
    space = space_from_dict(SPACE)
    found = layouts()
    assert any(layout.cp == 4 for layout in found), [x.short() for x in found]
    for layout in found:
        assert parse_layout(space, layout.short()) == layout, layout.short()
        assert ParallelLayout.from_dict(layout.to_dict()) == layout


def test_the_short_form_shows_cp_only_above_one():
    assert ParallelLayout(2, 1, 4, 1, 2).short() == "tp2 pp1 dp4 mbs1 gas2"
    assert ParallelLayout(2, 1, 2, 1, 2, cp=2).short() == "tp2 cp2 pp1 dp2 mbs1 gas2"


def test_the_api_filters_and_documents_every_dimension():
    documented = {p["name"] for p in trial_filter_parameters()}
    assert set(DIMENSIONS_BY_NAME) <= documented, documented
    wanted = trial_filter({"cp": "2,4", "zero_stage": "1"})
    assert wanted.layout == {"cp": frozenset({2, 4}), "zero_stage": frozenset({1})}
    with pytest.raises(BadRequest, match="cp"):
        trial_filter({"cp": "0"})


def test_a_filter_on_a_new_dimension_matches_trials_stored_before_it():
    class Stored:  # a trial's stored config from before cp existed
        config = ParallelLayout(1, 1, 2, 1, 1).to_dict() | {}

    Stored.config.pop("cp")
    assert TrialFilter(None, {"cp": frozenset({1})}).matches(Stored)  # type: ignore[arg-type]
    assert not TrialFilter(None, {"cp": frozenset({2})}).matches(Stored)  # type: ignore[arg-type]


def test_every_dimension_is_a_command_template_placeholder():
    for d in LAYOUT_DIMENSIONS:
        assert d.slot in PLACEHOLDERS, d.name
        assert (d.slot in NUMERIC_PLACEHOLDERS) == (d.kind == "int"), d.name
    assert "cp" in PLACEHOLDERS["world_size"]


def test_the_search_features_see_every_dimension():
    found = layouts()
    rows = {tuple(features(layout)) for layout in found}
    assert len(rows) == len(set(found)), "two layouts share the search's coordinates"
    assert len(features(found[0])) == len(LAYOUT_DIMENSIONS)
    assert sum(d.kind == "int" and d.minimum >= 1 for d in LAYOUT_DIMENSIONS) == NUMERIC
