"""Log parsers against real lines (tests/fixtures/logs/, sources in its README) and the
summary rules every format shares: warm-up excluded, median of the measured steps."""

from __future__ import annotations

from pathlib import Path

import pytest

from parsearch.config import AllocationSpec, ModelSpec, ParallelLayout
from parsearch.launch.oom import first_oom_line, is_oom_line
from parsearch.trainers.command.parsers import make_parser, parse_lines
from parsearch.trainers.command.summary import NoMeasurement, summarize
from parsearch.trial import TrialSpec

LOGS = Path(__file__).parent / "fixtures" / "logs"
MIB, GIB = 1024**2, 1024**3


def scan(name: str, parser: str, **options):
    with (LOGS / name).open() as lines:
        return parse_lines(lines, make_parser(parser, **options))


def spec(tp=1, pp=1, dp=1, mbs=1, gas=1, seq=2048, peak_tflops=100.0) -> TrialSpec:
    model = ModelSpec(num_layers=4, hidden_size=256, num_heads=4, vocab_size=1000, seq_length=seq)
    layout = ParallelLayout(tp=tp, pp=pp, dp=dp, mbs=mbs, gas=gas)
    allocation = AllocationSpec(
        nodes=1,
        devices_per_node=layout.world_size,
        device_memory_bytes=80 * GIB,
        peak_flops_per_device=peak_tflops * 1e12,
    )
    return TrialSpec("t", model, layout, allocation)


def test_megatron_lm_iteration_lines():
    result = scan("megatron-lm-h100.log", "megatron")
    assert [s.index for s in result.steps] == [10, 11, 12]
    first = result.steps[0]
    assert first.step_time_s == pytest.approx(9.4964)
    assert first.global_batch == 128
    assert first.reported_tflops_per_device == pytest.approx(137.5)
    assert first.loss == pytest.approx(0.2092005)
    assert result.peak_mem_bytes is None


def test_megatron_lm_memory_report_is_mebibytes():
    result = scan("megatron-lm-h100-memory.log", "megatron")
    assert result.peak_mem_bytes == pytest.approx(54250.98583984375 * MIB)
    assert result.peak_reserved_bytes == pytest.approx(61480.0 * MIB)
    assert [s.index for s in result.steps] == [2, 3]


def test_megatron_records_joined_on_one_line_are_read_apart():
    """Ranks sharing one log, unbuffered: another rank's memory report can land between an
    iteration line's text and its newline, or before it (see ``parsers.base.records``)."""
    lines = (LOGS / "megatron-lm-h100-memory.log").read_text().splitlines()
    memory, iteration_2, iteration_3 = lines[0], lines[1], lines[2]
    joined = [iteration_2 + memory, memory.rstrip() + iteration_3]
    result = parse_lines(joined, make_parser("megatron"))
    assert [s.index for s in result.steps] == [2, 3]
    assert [s.step_time_s for s in result.steps] == pytest.approx([5.6301, 5.4106])
    assert [s.loss for s in result.steps] == pytest.approx([2.021530, 2.003316])
    assert result.peak_mem_bytes == pytest.approx(54250.98583984375 * MIB)


def test_megatron_lm_current_format_without_throughput():
    result = scan("megatron-lm-2026.log", "megatron")
    (step,) = result.steps
    assert (step.index, step.step_time_s, step.global_batch) == (20, 0.744, 16)
    assert step.reported_tflops_per_device is None
    assert result.peak_mem_bytes == pytest.approx(5670.39 * MIB)


def test_megatron_warmup_excluded_and_median():
    """Iterations 10-12 with warm-up 10: the median of 11 and 12 (10036.9, 10198.4 ms)."""
    result = scan("megatron-lm-h100.log", "megatron")
    trial = spec(dp=8, mbs=4, gas=4, seq=4096)  # global batch 128, as the run
    metrics = summarize(result, trial, warmup_steps=10)
    assert metrics["measured_steps"] == 2
    assert metrics["step_time_s"] == pytest.approx((10.0369 + 10.1984) / 2)
    expected_rates = [128 * 4096 / 10.0369, 128 * 4096 / 10.1984]
    assert metrics["tokens_per_s"] == pytest.approx(sum(expected_rates) / 2)
    assert metrics["reported_tflops_per_device"] == pytest.approx((130.1 + 128.1) / 2)
    assert metrics["loss"] == pytest.approx(0.7243721)
    assert metrics["mfu"] == pytest.approx(metrics["tflops_per_device"] / 100.0)


def test_global_batch_that_differs_from_the_layout_is_refused():
    result = scan("megatron-lm-h100.log", "megatron")
    with pytest.raises(NoMeasurement, match="global batch size 128 but the layout"):
        summarize(result, spec(dp=1, mbs=1, gas=64), warmup_steps=0)


def test_all_steps_in_warmup_is_no_measurement():
    result = scan("megatron-lm-h100.log", "megatron")
    with pytest.raises(NoMeasurement, match="all within the 12 warm-up steps"):
        summarize(result, spec(dp=8, mbs=4, gas=4), warmup_steps=12)


def test_megatron_deepspeed_lines_and_memory():
    result = scan("megatron-deepspeed-polaris.log", "megatron-deepspeed")
    assert [s.index for s in result.steps] == [1, 2]
    second = result.steps[1]
    assert second.step_time_s == pytest.approx(10.1543)
    assert (second.global_batch, second.seq_length) == (32, 4096)
    assert second.reported_tflops_per_device == pytest.approx(98.29)
    assert result.peak_mem_bytes == pytest.approx(22332.37255859375 * MIB)
    assert result.peak_reserved_bytes == pytest.approx(35824.0 * MIB)  # rank 1's, the larger
    metrics = summarize(result, spec(dp=8, mbs=4, gas=1, seq=4096), warmup_steps=1)
    assert metrics["tokens_per_s"] == pytest.approx(32 * 4096 / 10.1543)


def test_megatron_deepspeed_timer_memory_in_gib():
    result = scan("megatron-deepspeed-polaris-timers.log", "megatron-deepspeed")
    assert [s.index for s in result.steps] == [199, 200]
    assert result.steps[0].reported_tflops_per_device == pytest.approx(69.85)
    assert result.peak_mem_bytes == pytest.approx(19.52 * GIB)
    # The plain megatron parser does not know DeepSpeed's timer line.
    assert scan("megatron-deepspeed-polaris-timers.log", "megatron").peak_mem_bytes is None


def test_megatron_time_in_seconds_variant():
    line = (
        " iteration    13910/  953674 | consumed samples:     14243840 | elapsed time per "
        "iteration (s): 11.18 | learning rate: 1.000E-04 | global batch size:  1024 |"
    )
    (step,) = parse_lines([line], make_parser("megatron-deepspeed")).steps
    assert step.step_time_s == pytest.approx(11.18)


def test_torchtitan_step_lines():
    result = scan("torchtitan-main-2026-05.log", "torchtitan")
    assert [s.index for s in result.steps] == list(range(14, 22))
    first = result.steps[0]
    assert first.tokens_per_s_per_device == 7282
    assert first.reported_tflops_per_device == pytest.approx(0.52)
    assert first.reported_mfu == pytest.approx(0.0017)
    assert result.peak_reserved_bytes == pytest.approx(9.46 * GIB)
    metrics = summarize(result, spec(dp=2, mbs=1, gas=1, seq=2048), warmup_steps=17)
    rates = sorted(2 * tps for tps in (7322, 7309, 7272, 7304))
    assert metrics["tokens_per_s"] == pytest.approx((rates[1] + rates[2]) / 2)
    assert metrics["peak_mem_bytes"] == pytest.approx(9.46 * GIB, rel=1e-9)


def test_torchtitan_colour_codes_and_validation_lines():
    coloured = (
        "[titan] 2026-05-18 16:04:46,338 - root - INFO - \x1b[31mstep:  3  \x1b[32mloss:  4.9925"
        "  \x1b[34mtps: 30,768  \x1b[36mtflops: 3.15  \x1b[35mmfu: N/A\x1b[39m"
    )
    validation = "[titan] - root - INFO - validate step: 10  loss: 4.1  memory: 1.0GiB(1%)  tps: 9"
    result = parse_lines([coloured, validation], make_parser("torchtitan"))
    (step,) = result.steps
    assert (step.index, step.tokens_per_s_per_device, step.reported_mfu) == (3, 30768, None)


def test_torchtitan_records_joined_on_one_line_are_read_apart():
    """The line a CI run once saw: rank 0's step 6 and another rank's step 1, joined."""
    joined = (
        "[rank0]:[titan] - root - INFO - step: 6  loss: 7.1  memory: 1.20GiB(5%)  tps: 1,280  "
        "tflops: 0.1  mfu: 0.01%[rank1]:[titan] - root - INFO - step: 1  loss: 9.9  "
        "memory: 1.10GiB(5%)  tps: 427  tflops: 0.03  mfu: 0.00%"
    )
    validation = "[rank0]:[titan] - root - INFO - step: 7  loss: 7.0  tps: 1,300  " + (
        "[rank0]:[titan] - root - INFO - validate step: 7  loss: 2.5  tps: 9"
    )
    result = parse_lines([joined, validation], make_parser("torchtitan"))
    assert [(s.index, s.tokens_per_s_per_device, s.loss) for s in result.steps] == [
        (6, 1280, 7.1),
        (1, 427, 9.9),
        (7, 1300, 7.0),
    ]
    assert result.peak_reserved_bytes == pytest.approx(1.2 * GIB)


def test_torchtitan_all_ranks_printing():
    result = scan("torchtitan-all-ranks-2026-02.log", "torchtitan")
    assert len(result.steps) == 7
    assert result.peak_reserved_bytes == pytest.approx(66.91 * GIB)


def test_json_summary_last_line_wins():
    lines = [
        '{"tokens_per_s": 1.0}',
        "not json {",
        '[rank3]: {"tokens_per_s": 2000, "mfu": 0.4, "status": "OK", "peak_mem_bytes": 5}',
        '{"loss": 1.0}',
    ]
    result = parse_lines(lines, make_parser("json"))
    assert result.summary == {
        "tokens_per_s": 2000.0,
        "mfu": 0.4,
        "peak_mem_bytes": 5.0,
        "status": "ok",
    }
    metrics = summarize(result, spec(mbs=2, seq=1000), warmup_steps=3)
    assert metrics["step_time_s"] == pytest.approx(2 * 1000 / 2000)
    assert metrics["reported_mfu"] == 0.4
    assert metrics["peak_mem_bytes"] == 5


def test_regex_parser_scales_and_counts_steps():
    options = {
        "patterns": {"step_time_s": r"took (\d+) ms", "peak_mem_bytes": r"peak=(?P<value>\d+)"},
        "scale": {"step_time_s": 0.001},
    }
    lines = ["step took 900 ms", "step took 100 ms peak=7", "step took 120 ms", "peak=3"]
    result = parse_lines(lines, make_parser("regex", **options))
    assert [(s.index, s.step_time_s) for s in result.steps] == [(1, 0.9), (2, 0.1), (3, 0.12)]
    assert result.peak_mem_bytes == 7
    metrics = summarize(result, spec(mbs=4, seq=100), warmup_steps=1)
    assert metrics["step_time_s"] == pytest.approx(0.11)
    assert metrics["tokens_per_s"] == pytest.approx((400 / 0.1 + 400 / 0.12) / 2)


@pytest.mark.parametrize(
    "patterns, message",
    [
        ({"tokens_per_s": "no group"}, "needs a group"),
        ({"tokens_per_s": "(unclosed"}, "not a valid regular expression"),
        ({"speed": "(1)"}, "unknown metric"),
        ({"loss": "loss (.*)"}, "at least one of"),
    ],
)
def test_regex_patterns_are_checked(patterns, message):
    with pytest.raises(ValueError, match=message):
        make_parser("regex", patterns=patterns)


def test_oom_lines_recognised():
    lines = (LOGS / "oom.log").read_text().splitlines()
    assert all(is_oom_line(line) for line in lines)
    for line in (
        "RuntimeError: HIP error: hipErrorOutOfMemory",
        "RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't "
        "allocate memory: you tried to allocate 1073741824 bytes.",
        "slurmstepd: error: Detected 1 oom_kill event in StepId=123.0.",
    ):
        assert is_oom_line(line), line


@pytest.mark.parametrize(
    "name",
    [
        "not-oom.log",
        "megatron-lm-h100-memory.log",
        "megatron-deepspeed-polaris.log",
        "megatron-deepspeed-polaris-timers.log",
        "torchtitan-main-2026-05.log",
    ],
)
def test_memory_reports_are_not_oom(name):
    with (LOGS / name).open() as lines:
        assert first_oom_line(lines) is None


def test_regex_glued_records_of_two_ranks_keep_the_larger_peak_and_both_steps():
    # torchrun's unbuffered workers: rank 1's record lands before rank 0's newline.
    options = {
        "patterns": {
            "step_time_s": r"step_time=([0-9.]+)",
            "peak_mem_bytes": r"peak ([0-9.]+) MiB",
        },
        "scale": {"peak_mem_bytes": MIB},
    }
    lines = ["step_time=0.5 peak 100 MiBstep_time=0.7 peak 900 MiB"]
    result = parse_lines(lines, make_parser("regex", **options))
    assert result.peak_mem_bytes == 900 * MIB
    assert [step.step_time_s for step in result.steps] == [0.5, 0.7]


def test_a_reported_world_size_or_global_batch_unlike_the_layout_is_refused():
    options = {
        "patterns": {
            "step_time_s": r"time ([0-9.]+)",
            "world_size": {"pattern": r"world size (\d+)", "role": "summary"},
            "global_batch": r"global batch (\d+)",
        }
    }
    layout = spec(dp=2, mbs=2, gas=4)  # world size 2, global batch 16
    good = ["world size 2", "global batch 16 time 0.5", "global batch 16 time 0.4"]
    metrics = summarize(parse_lines(good, make_parser("regex", **options)), layout, 0)
    assert metrics["step_time_s"] == pytest.approx(0.45)
    doubled = ["world size 2", "global batch 32 time 0.5"]  # gas where gas*dp was meant
    with pytest.raises(NoMeasurement, match=r"global batch size 32 but the layout .* 16"):
        summarize(parse_lines(doubled, make_parser("regex", **options)), layout, 0)
    one_process = ["world size 1", "global batch 16 time 0.5"]  # accelerate launch --cpu
    with pytest.raises(NoMeasurement, match=r"world size 1 but the layout .* world size 2"):
        summarize(parse_lines(one_process, make_parser("regex", **options)), layout, 0)
    json_lines = ['{"world_size": 1}', '{"tokens_per_s": 100.0}']
    with pytest.raises(NoMeasurement, match="world size 1"):
        summarize(parse_lines(json_lines, make_parser("json")), layout, 0)
