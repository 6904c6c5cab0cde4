"""Issue 29's battery, the trainer-output part: whatever a trainer prints, the trial's
conclusion (parse, summarise, plausibility, as the command trainer and the driver apply them)
is either "no measurement" (an ``error`` trial naming why) or figures that are finite,
possible and agree with each other; never a traceback, never an ``ok`` that contradicts itself.

The other parts of the battery: tests/test_shell_quoting.py (templates under dash and bash),
tests/test_sanitize.py (terminal escapes), tests/test_store_hostile.py (store contents) and
tests/test_cli_hostile.py (file kinds); tests/test_hostile_numbers.py runs hostile lines
through a real campaign.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsearch.config import AllocationSpec, ModelSpec, ParallelLayout
from parsearch.plausible import TOLERANCE, checked, contradiction
from parsearch.result import TrialResult, TrialState
from parsearch.trainers.command.parsers import make_parser, parse_lines
from parsearch.trainers.command.summary import NoMeasurement, summarize
from parsearch.trial import TrialSpec

SEQ, BATCH, WORLD = 1024, 8, 2  # global batch 8 (mbs 2 x gas 2 x dp 2) of 1024 tokens
TOKENS = SEQ * BATCH
PEAK = 100e12


def _spec() -> TrialSpec:
    model = ModelSpec(num_layers=4, hidden_size=256, num_heads=4, vocab_size=1000, seq_length=SEQ)
    layout = ParallelLayout(tp=1, pp=1, dp=WORLD, mbs=2, gas=2)
    return TrialSpec("t", model, layout, AllocationSpec(1, WORLD, 80 * 2**30, PEAK))


REGEX = {
    "patterns": {
        "step_time_s": r"time=([^ ]+)",
        "tokens_per_s": r"tps=([^ ]+)",
        "samples_per_s": r"sps=([^ ]+)",
        "steps_per_s": r"its=([^ ]+)",
        "peak_mem_bytes": r"mem=([^ ]+)",
    }
}
MEGATRON_LINE = (
    " iteration {i}/ 10 | elapsed time per iteration (ms): {ms} | global batch size: {gb} | "
    "actual seqlen: {seq} | lm loss: 2.0 |"
)

# (parser, options, lines): what hostile, broken or merely odd trainers print.
OUTPUTS = [
    ("json", {}, ['{"tokens_per_s": 1e9, "step_time_s": 100}']),
    ("json", {}, ['{"tokens_per_s": 8192, "step_time_s": 1.0}']),
    ("json", {}, ['{"tokens_per_s": 8192, "step_time_s": 10.0}']),
    ("json", {}, ['{"tokens_per_s": Infinity}']),
    ("json", {}, ['{"tokens_per_s": -Infinity}']),
    ("json", {}, ['{"tokens_per_s": NaN, "step_time_s": 1}']),
    ("json", {}, ['{"tokens_per_s": 1e400}']),
    ("json", {}, ['{"tokens_per_s": 0}']),
    ("json", {}, ['{"tokens_per_s": -5}']),
    ("json", {}, ['{"tokens_per_s": 1e-300}']),
    ("json", {}, ['{"tokens_per_s": 1e308, "step_time_s": 1e-308}']),
    ("json", {}, ['{"tokens_per_s": true}']),
    ("json", {}, ['{"tokens_per_s": "fast"}']),
    ("json", {}, ['{"tokens_per_s": [1, 2]}']),
    ("json", {}, ['{"tokens_per_s": 100, "peak_mem_bytes": 1e300}']),
    ("json", {}, ['{"tokens_per_s": 100, "peak_mem_bytes": -1}']),
    ("json", {}, ['{"tokens_per_s": 100, "mfu": 50}']),
    ("json", {}, ['{"tokens_per_s": 100, "status": "oom"}']),
    ("json", {}, ['{"tokens_per_s": 100, "status": 7}']),
    ("json", {}, ['{"tokens_per_s": 1' + "0" * 5000 + "}"]),
    ("json", {}, ["[" * 100_000 + "]" * 100_000]),
    ("json", {}, ['{"tokens_per_s": 100}\x00\x1b]52;c;ZXZpbA==\x07']),
    ("json", {}, ['\x1b[31m{"tokens_per_s": 100}\x1b[0m']),
    ("json", {}, ['{"world_size": 1}', '{"tokens_per_s": 8192}']),
    ("json", {}, ['{"global_batch": 64}', '{"tokens_per_s": 8192}']),
    ("json", {}, ["", "\n", "not json {", "{}", "null"]),
    ("regex", REGEX, ["time=1.0 tps=8192", "time=1.0 tps=8192"]),
    ("regex", REGEX, ["time=1.0", "time=3.0"]),  # medians of 2: 1.5 s by rate, 2 s by time
    ("regex", REGEX, ["time=1.0 tps=1e9", "time=1.0 tps=1e9"]),
    ("regex", REGEX, ["time=1.0 sps=8", "time=1.0 sps=800"]),
    ("regex", REGEX, ["time=1.0 its=1", "time=1.0 its=100"]),
    ("regex", REGEX, ["time=nan", "time=inf"]),
    ("regex", REGEX, ["time=0", "time=-1"]),
    ("regex", REGEX, ["time=1e-320 tps=1e320"]),
    ("regex", REGEX, ["time=1,000,000 tps=0.001"]),
    ("regex", REGEX, ["mem=1e400", "time=1.0"]),
    ("regex", REGEX, ["time=1.0time=1.0time=50.0 tps=8192"]),
    ("regex", REGEX, ["time=" + "9" * 5000]),
    ("megatron", {}, [MEGATRON_LINE.format(i=i, ms=1000.0, gb=BATCH, seq=SEQ) for i in (1, 2)]),
    ("megatron", {}, [MEGATRON_LINE.format(i=i, ms=1000.0, gb=BATCH, seq=4096) for i in (1, 2)]),
    ("megatron", {}, [MEGATRON_LINE.format(i=i, ms=1000.0, gb=64, seq=SEQ) for i in (1, 2)]),
    ("megatron", {}, [MEGATRON_LINE.format(i=i, ms=0.0, gb=BATCH, seq=SEQ) for i in (1, 2)]),
    ("megatron", {}, [MEGATRON_LINE.format(i=i, ms="nan", gb=BATCH, seq=SEQ) for i in (1, 2)]),
    ("torchtitan", {}, ["step: 1 loss: 2.0 tps: 4,096", "step: 2 loss: 2.0 tps: 4,096"]),
    ("torchtitan", {}, ["step: 1 loss: 2.0 tps: inf", "step: 2 loss: 2.0 tps: nan"]),
    ("torchtitan", {}, ["step: 1 tps: 1e30 mfu: 9999%", "step: 2 tps: 1e30 mfu: 9999%"]),
]


def conclude(parser: str, options: dict, lines: list[str]) -> TrialResult:
    """What the command trainer and the driver make of a log: no measurement is an error."""
    scan = parse_lines(lines, make_parser(parser, **options))
    try:
        metrics = summarize(scan, _spec(), warmup_steps=0)
    except NoMeasurement as why:
        return TrialResult(TrialState.ERROR, error=str(why))
    status = metrics.pop("status", "ok")
    if status != "ok":
        return TrialResult(TrialState.ERROR, error=f"reported {status!r}")
    return checked(
        TrialResult(TrialState.OK, metrics),
        objective="tokens_per_s",
        peak_flops_per_device=PEAK,
        tokens_per_step=TOKENS,
    )


def _assert_sound(result: TrialResult, *, ok: bool | None = None) -> None:
    if ok is not None:
        assert result.ok is ok, result.error
    if not result.ok:
        assert result.error  # an error always says why
        return
    metrics = result.metrics
    for key in ("tokens_per_s", "step_time_s", "tflops_per_device", "mfu"):
        assert math.isfinite(metrics[key]) and metrics[key] > 0, (key, metrics)
    assert metrics["mfu"] <= 1.0
    if "step_times_s" not in metrics:  # else each step was checked (medians may differ)
        assert contradiction(metrics, tokens_per_step=TOKENS, world_size=WORLD) is None
        implied = TOKENS / metrics["step_time_s"]
        assert implied / TOLERANCE <= metrics["tokens_per_s"] <= implied * TOLERANCE
    else:
        times = metrics["step_times_s"]
        assert TOKENS / max(times) / TOLERANCE <= metrics["tokens_per_s"]
        assert metrics["tokens_per_s"] <= TOKENS / min(times) * TOLERANCE


@pytest.mark.parametrize(("parser", "options", "lines"), OUTPUTS, ids=lambda v: repr(v)[:40])
def test_any_trainer_output_concludes_soundly(parser, options, lines):
    _assert_sound(conclude(parser, options, lines))


def test_the_battery_holds_the_issues_count():
    """At least 80 hostile inputs across the four kinds (issue 29's "what it must show")."""
    import test_cli_hostile
    import test_sanitize
    import test_shell_quoting
    import test_store_hostile

    templates = len(test_shell_quoting.HOSTILE) * len(test_shell_quoting.TEMPLATES)
    counts = {
        "templates x values (each under dash and bash)": templates,
        "trainer output": len(OUTPUTS) + len(test_sanitize.HOSTILE_OUTPUT),
        "store contents": len(test_store_hostile.EDITS),
        "file kinds": len(test_cli_hostile.FILE_KINDS),
    }
    assert all(count >= 5 for count in counts.values()), counts
    assert sum(counts.values()) >= 80, counts


figures = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=1e-6, max_value=1e9),
    st.integers(min_value=-10, max_value=10**12),
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    tokens_per_s=figures,
    step_time_s=figures,
    samples_per_s=figures,
    steps_per_s=figures,
    peak=figures,
)
def test_any_reported_figures_conclude_soundly(
    tokens_per_s, step_time_s, samples_per_s, steps_per_s, peak
):
    """Hypothesis over one regex step line with any mix of figures: sound or an error."""
    given_figures = {
        "tps": tokens_per_s,
        "time": step_time_s,
        "sps": samples_per_s,
        "its": steps_per_s,
        "mem": peak,
    }
    line = " ".join(f"{key}={value!r}" for key, value in given_figures.items() if value is not None)
    _assert_sound(conclude("regex", REGEX, [line, line]))


def test_steps_that_vary_a_lot_are_measured_not_refused():
    """Two measured steps of 1 s and 3 s (a slow step under load): each step's figures agree,
    so the trial is ok, though the median rate and the median time differ by 33%."""
    result = conclude("regex", REGEX, ["time=1.0", "time=3.0"])
    _assert_sound(result, ok=True)
    assert result.metrics["step_time_s"] == 2.0
