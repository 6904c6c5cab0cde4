"""Hostile space files: every one either loads or is refused with exit 2 naming the file (and
the field or line), quickly, without a traceback — the issue's cases, then Hypothesis."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parsearch.cli import main
from parsearch.errors import SpaceError
from parsearch.space import load_space

ROOT = Path(__file__).resolve().parents[1]
TINY = (ROOT / "search_spaces" / "tiny-cpu.yaml").read_text()
BASE = yaml.safe_load(TINY)


def _with(path: list[str], value: object) -> dict:
    """The tiny space with the field at ``path`` set to ``value``."""
    data = yaml.safe_load(TINY)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return data


def _refused(tmp_path: Path, text: str | bytes, named: str) -> str:
    path = tmp_path / "space.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    began = time.monotonic()
    with pytest.raises(SpaceError) as error:
        load_space(path)
    assert time.monotonic() - began < 5
    message = str(error.value)
    assert str(path) in message and named in message, message
    return message


BOMB = """name: bomb
a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]
model: {name: *f}
"""


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (TINY.replace("nodes: 1", "nodes: " + "9" * 5000), "5000 digits"),
        (yaml.safe_dump(_with(["allocation", "device_memory"], float("inf"))), "device_memory"),
        (yaml.safe_dump(_with(["allocation", "device_memory"], "1e400GiB")), "device_memory"),
        (yaml.safe_dump(_with(["search", "mbs"], {"range": [1, 10**9]})), "search.mbs"),
        ("model: " + "[" * 10000, "deep"),
        (BOMB, "aliases"),
        (BOMB.replace("model: {name: *f}", "description: *f"), "aliases"),
        ("a: &a [*a]\n", "itself"),
        (yaml.safe_dump(_with(["allocation", "peak_tflops"], float("nan"))), "peak_tflops"),
        (yaml.safe_dump(_with(["allocation", "peak_tflops"], float("inf"))), "peak_tflops"),
        (yaml.safe_dump(_with(["estimate"], {"compute_efficiency": float("nan")})), "efficiency"),
        (yaml.safe_dump(_with(["trainer", "timeout"], float("inf"))), "trainer.timeout"),
        (TINY + "\nobjective: mfu\nobjective: tokens_per_s\n", "duplicate key 'objective'"),
        (yaml.safe_dump(_with(["allocation", "device_memory"], "64gib")), "ambiguous"),
        (yaml.safe_dump(_with(["allocation", "device_memory"], "64gb")), "ambiguous"),
        (yaml.safe_dump(_with(["name"], "../escape")), "field 'name'"),
        (yaml.safe_dump(_with(["name"], "evil\u202egnp.exe")), "U+202E"),
        (yaml.safe_dump(_with(["description"], {"nested": 1})), "description"),
        (yaml.safe_dump(_with(["search", "tp"], list(range(1, 5000)))), "search.tp"),
    ],
    ids=lambda v: str(v)[:30],
)
def test_the_issues_hostile_files_are_refused(tmp_path, text, named):
    _refused(tmp_path, text, named)


@pytest.mark.parametrize(
    ("data", "named"),
    [
        (TINY.encode("utf-16"), "UTF-16"),
        (TINY.replace("tiny", "tïny").encode("latin-1"), "not UTF-8"),
        (b"\x7fELF\x02\x01\x01\x00\x00" + bytes(range(256)), "binary"),
        (b"# " + b"x" * (2 << 20) + b"\n" + TINY.encode(), "larger than"),
    ],
    ids=["utf16", "latin1", "binary", "huge"],
)
def test_encodings_and_sizes_are_refused(tmp_path, data, named):
    _refused(tmp_path, data, named)


def test_sizes_with_a_space_and_a_bom_load(tmp_path):
    path = tmp_path / "s.yaml"
    text = yaml.safe_dump(_with(["allocation", "device_memory"], "64 GiB"))
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert load_space(path).allocation.device_memory_bytes == 64 * 2**30


@pytest.mark.parametrize("kind", [[], {"a": 1}, 3])
def test_a_trainer_kind_that_is_no_name_is_refused(tmp_path, kind):
    """Found by the fuzz below: an unhashable kind reached the registry's dict lookup."""
    message = _refused(tmp_path, yaml.safe_dump(_with(["trainer", "kind"], kind)), "trainer.kind")
    assert "must be one of" in message


def test_the_command_line_exits_2_naming_the_file(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("model: " + "[" * 10000)
    assert main(["plan", str(path)]) == 2
    assert str(path) in capsys.readouterr().err


# -- Hypothesis: mutate the tiny space's values, anywhere, with anything YAML can hold. --------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(["64GiB", "64 GB", "64gib", "1e400GiB", "-1", "1e308", ".nan", "pow2"]),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=8,
)


def _paths(node: object, prefix: tuple = ()) -> list[tuple]:
    found = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, child in node.items():
            found += _paths(child, (*prefix, key))
    elif isinstance(node, list):
        for i, child in enumerate(node):
            found += _paths(child, (*prefix, i))
    return found


PATHS = _paths(BASE)
# Bounded: a fixed number of examples, each within a deadline (the budget of this file).
# Derandomized, so CI runs the same examples every time; the slack in the deadline is for a
# loaded 2-core machine (a load is milliseconds when idle).
FUZZ = settings(
    max_examples=80,
    deadline=10_000,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@pytest.mark.slow
@FUZZ
@given(where=st.sampled_from(PATHS), value=values)
def test_any_mutated_space_loads_or_names_file_and_field(tmp_path, where, value):
    data = yaml.safe_load(TINY)
    node = data
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    try:
        space = load_space(path)
    except SpaceError as error:
        assert str(path) in str(error)
        assert "field '" in str(error) or "line" in str(error), str(error)
    else:
        space.plan()  # what loads can be planned


@FUZZ
@given(data=st.binary(max_size=400) | st.text(max_size=400).map(str.encode))
def test_any_bytes_load_or_are_refused_naming_the_file(tmp_path, data):
    path = tmp_path / "junk.yaml"
    path.write_bytes(data)
    try:
        load_space(path)
    except SpaceError as error:
        assert str(path) in str(error)


# -- Issue 29: sizes bounded by the memory their bookkeeping takes, checked before it is made. --


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        (
            "nodes",
            10**9,
            "allocation.nodes': must be a positive integer in [1, 1000000], got 1000000000",
        ),
        ("nodes", 10**6 + 1, "allocation.nodes"),
        (
            "devices_per_node",
            10**9,
            "allocation.devices_per_node': must be a positive integer in [1, 65536]",
        ),
    ],
)
def test_an_allocation_beyond_what_bookkeeping_can_hold_exits_2(
    tmp_path, capsys, field, value, named
):
    path = tmp_path / "huge.yaml"
    path.write_text(yaml.safe_dump(_with(["allocation", field], value)))
    for argv in (
        ["plan", str(path)],
        [
            "run",
            str(path),
            "--store",
            str(tmp_path / "s.db"),
            "--backend",
            "simulate",
            "--budget",
            "1",
            "--quiet",
        ],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert named in err and "Traceback" not in err
    assert not (tmp_path / "s.db").exists()


@pytest.mark.e2e
def test_simulated_slots_times_nodes_are_bounded_before_allocating(tmp_path, capsys):
    """A million nodes is a valid allocation; 100 000 simulated slots of it (10^11 nodes to
    keep track of) is refused naming --slots and its range, not a MemoryError."""
    space = yaml.safe_load((ROOT / "search_spaces" / "gpt-175b-frontier.yaml").read_text())
    space["allocation"]["nodes"] = 10**6
    space["estimate"].pop("machine", None)
    path = tmp_path / "million.yaml"
    path.write_text(yaml.safe_dump(space))
    db = tmp_path / "s.db"
    argv = ["run", str(path), "--store", str(db), "--backend", "simulate", "--quiet"]
    assert main([*argv, "--slots", "100000", "--budget", "1"]) == 2
    err = capsys.readouterr().err
    assert "--slots must lie in [1, 10]" in err and "Traceback" not in err
