"""A trainer that prints impossible numbers: every such trial ends ``error`` naming the value,
is never the best and never reaches the optimiser, and the campaign goes on."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from parsearch.cli import main
from parsearch.config import AllocationSpec, ModelSpec, ParallelLayout
from parsearch.plausible import MAX_ADDRESSABLE_BYTES, checked, contradiction, problem
from parsearch.result import TrialResult, TrialState
from parsearch.store import open_store
from parsearch.trainers.command.parsers import make_parser, parse_lines
from parsearch.trainers.command.summary import NoMeasurement, summarize
from parsearch.trial import TrialSpec

# One layout per hostile line (mbs 1..9); mbs 10 reports sane figures.
HOSTILE = {
    1: ('{{"tokens_per_s": Infinity}}', "tokens_per_s = inf"),
    2: ('{{"tokens_per_s": 1e400}}', "tokens_per_s = inf"),
    3: ('{{"tokens_per_s": NaN}}', "tokens_per_s = nan"),
    4: ('{{"tokens_per_s": 100, "peak_mem_bytes": NaN}}', "peak_mem_bytes = nan"),
    5: ('{{"tokens_per_s": 100, "peak_mem_bytes": Infinity}}', "peak_mem_bytes = inf"),
    6: ('{{"tokens_per_s": 2e6}}', "MFU 135475%"),
    7: ('{{"tokens_per_s": 100, "step_time_s": -1}}', "step_time_s = -1"),
    8: ('{{"tokens_per_s": 100, "peak_mem_bytes": -1}}', "peak_mem_bytes = -1"),
    # Issue 29: a rate that contradicts its own step time (MFU, from the step time, was 0.0%).
    9: (
        '{{"tokens_per_s": 1e9, "step_time_s": 100}}',
        "tokens_per_s = 1e+09 and step_time_s = 100",
    ),
}


def _space(tmp_path: Path) -> Path:
    cases = "\n".join(f"        {mbs}: ['{line}']" for mbs, (line, _) in HOSTILE.items())
    path = tmp_path / "hostile.yaml"
    path.write_text(
        f"""name: hostile
model: {{num_layers: 2, hidden_size: 64, num_heads: 4, vocab_size: 100, seq_length: 32}}
allocation: {{nodes: 1, devices_per_node: 1, device_memory: 1GiB, peak_tflops: 0.001,
              device: cpu}}
search: {{tp: 1, pp: 1, mbs: {{range: [1, 10]}}, gas: 1}}
trainer:
  kind: command
  parser: json
  timeout: 200
  vars: {{python: {sys.executable}}}
  command:
    - "{{python}}"
    - -c
    - "import sys; print(sys.argv[1])"
    - switch: mbs
      cases:
{cases}
      default: ['{{{{"tokens_per_s": 100, "peak_mem_bytes": 1000}}}}']
"""
    )
    return path


@pytest.mark.e2e
@pytest.mark.slow
def test_impossible_numbers_become_errors_and_the_campaign_finishes(tmp_path, capsys):
    db = tmp_path / "s.db"
    assert (
        main(["run", str(_space(tmp_path)), "--store", str(db), "--budget", "10", "--quiet"]) == 0
    )
    assert "10/10 trials finished (ok 1, error 9)" in capsys.readouterr().out
    with open_store(db, readonly=True) as store:
        campaign = store.get_campaign()
        trials = {t.layout.mbs: t for t in store.trials(campaign.id)}
        for mbs, (_, named) in HOSTILE.items():
            assert trials[mbs].state is TrialState.ERROR, mbs
            assert named in trials[mbs].error, (mbs, trials[mbs].error)
            assert trials[mbs].objective is None
        assert store.best(campaign.id).layout.mbs == 10
    # resume has nothing left to crash on
    assert main(["resume", "--store", str(db), "--quiet"]) == 0


PEAK = 1e12


@pytest.mark.parametrize(
    ("metrics", "named"),
    [
        ({"tokens_per_s": math.nan}, "tokens_per_s = nan"),
        ({"tokens_per_s": 1e308, "mfu": math.inf}, "mfu = inf"),
        ({"tokens_per_s": 10.0, "mfu": 13.76}, "MFU 1376%"),
        ({"tokens_per_s": 10.0, "tflops_per_device": 2.0}, "MFU 200%"),
        ({"tokens_per_s": 10.0, "peak_mem_bytes": 2.0 * MAX_ADDRESSABLE_BYTES}, "can address"),
        ({"tokens_per_s": 10.0, "step_time_s": 0}, "step_time_s = 0 is zero"),
        ({"tokens_per_s": 10.0, "peak_mem_bytes": "lots"}, "is not a number"),
        ({"step_time_s": 1.0}, "objective tokens_per_s = None"),
        # Figures that contradict each other (issue 29): each names both.
        (
            {"tokens_per_s": 1e9, "step_time_s": 100, "tokens_per_step": 131072},
            "tokens_per_s = 1e+09 and step_time_s = 100 contradict each other",
        ),
        (
            {"tokens_per_s": 1000, "step_time_s": 1.0, "tokens_per_step": 2000},
            "step_time_s = 1 and tokens_per_s = 1000 contradict",
        ),
        (
            {"tokens_per_s": 1e3, "steps_per_s": 10.0, "tokens_per_step": 1000},
            "steps_per_s = 10 and tokens_per_s = 1000",
        ),
        (
            {
                "tokens_per_s": 1e3,
                "step_time_s": 1.0,
                "tokens_per_step": 1e3,
                "model_flops_per_step": 1e12,
                "world_size": 2,
                "tflops_per_device": 0.05,
            },
            "tflops_per_device = 0.05 and step_time_s = 1 contradict",
        ),
        ({"tokens_per_s": 1e3, "tflops_per_device": 0.5, "mfu": 0.05}, "mfu = 0.05 and tflops"),
    ],
)
def test_impossible_figures_are_named(metrics, named):
    assert named in problem(metrics, objective="tokens_per_s", peak_flops_per_device=PEAK)
    result = checked(
        TrialResult(TrialState.OK, metrics), objective="tokens_per_s", peak_flops_per_device=PEAK
    )
    assert result.status is TrialState.ERROR and named in result.error
    assert result.objective("tokens_per_s") == "F_error"  # what the optimiser hears


def test_the_tokens_per_step_given_checks_figures_that_lack_their_own():
    metrics = {"tokens_per_s": 1e9, "step_time_s": 100}
    assert problem(metrics, objective="tokens_per_s", peak_flops_per_device=PEAK) is None
    why = problem(
        metrics, objective="tokens_per_s", peak_flops_per_device=PEAK, tokens_per_step=131072
    )
    assert "tokens_per_s = 1e+09 and step_time_s = 100" in why


def test_figures_that_agree_within_the_tolerance_pass():
    # Printed figures are rounded: 4096 tokens in 0.5 s is 8192 tokens/s; 8000 is 2.4% off.
    metrics = {"tokens_per_s": 8000, "step_time_s": 0.5, "tokens_per_step": 4096,
               "model_flops_per_step": 1e11, "world_size": 2, "tflops_per_device": 0.1,
               "mfu": 0.1}  # fmt: skip
    assert problem(metrics, objective="tokens_per_s", peak_flops_per_device=PEAK) is None
    assert contradiction({"samples_per_s": 2.0, "step_time_s": 0.5}, tokens_per_step=2048,
                         global_batch=1) is None  # fmt: skip
    assert "samples_per_s = 2" in contradiction(
        {"samples_per_s": 2.0, "step_time_s": 5}, tokens_per_step=2048, global_batch=1
    )


def test_plausible_figures_and_failures_pass_unchanged():
    sane = TrialResult(
        TrialState.OK, {"tokens_per_s": 1e4, "mfu": 0.4, "peak_mem_bytes": 8 * 2**30}
    )
    assert checked(sane, objective="tokens_per_s", peak_flops_per_device=PEAK) is sane
    oom = TrialResult(TrialState.OOM, {"tokens_per_s": math.nan})
    assert checked(oom, objective="tokens_per_s", peak_flops_per_device=PEAK) is oom


def _trial(seq: int = 1024, mbs: int = 2, gas: int = 2, dp: int = 2) -> TrialSpec:
    model = ModelSpec(num_layers=4, hidden_size=256, num_heads=4, vocab_size=1000, seq_length=seq)
    layout = ParallelLayout(tp=1, pp=1, dp=dp, mbs=mbs, gas=gas)
    allocation = AllocationSpec(1, layout.world_size, 80 * 2**30, 100e12)
    return TrialSpec("t", model, layout, allocation)


@pytest.mark.parametrize(
    ("parser", "options", "lines", "named"),
    [
        ("json", {}, ['{"tokens_per_s": 1e9, "step_time_s": 100}'],
         "tokens_per_s = 1e+09 and step_time_s = 100"),
        ("json", {}, ['{"tokens_per_s": 8192, "step_time_s": 0.25}'],
         "step_time_s = 0.25 and tokens_per_s = 8192"),
        ("regex", {"patterns": {"step_time_s": r"time ([\d.]+)", "samples_per_s": r"sps ([\d.]+)"}},
         ["time 1.0 sps 8.0", "time 1.0 sps 80.0"], "samples_per_s = 80 and step_time_s = 1"),
        ("regex", {"patterns": {"tokens_per_s": r"tps ([\d.]+)",
                                "tokens_per_s_per_device": r"tpd ([\d.]+)"}},
         ["tps 8192 tpd 100"], "tokens_per_s = 8192 and tokens_per_s_per_device = 100"),
        ("megatron", {}, [" iteration        1/ 10 | elapsed time per iteration (ms): 1000.0 | "
                          "global batch size: 8 | actual seqlen: 2048 |"],
         "sequence length 2048 (step 1) but the model's seq_length is 1024"),
    ],
)  # fmt: skip
def test_a_log_whose_figures_disagree_is_no_measurement_naming_both(parser, options, lines, named):
    """Global batch 8 x 1024 tokens = 8192 tokens per step (8 samples) on 2 devices."""
    scan = parse_lines(lines, make_parser(parser, **options))
    with pytest.raises(NoMeasurement) as caught:
        summarize(scan, _trial(), warmup_steps=0)
    assert named in str(caught.value)


def test_a_log_whose_figures_agree_is_measured():
    options = {"patterns": {"step_time_s": r"time ([\d.]+)", "samples_per_s": r"sps ([\d.]+)"}}
    scan = parse_lines(["time 1.0 sps 8.1", "time 1.0 sps 7.9"], make_parser("regex", **options))
    metrics = summarize(scan, _trial(), warmup_steps=0)
    assert metrics["step_time_s"] == pytest.approx(1.0)


@pytest.mark.e2e
def test_trial_judges_a_contradiction_as_the_campaign_does(tmp_path, capsys):
    """``parsearch trial`` applies the same checks: a rate that contradicts its step time
    is an error naming both, exit 1."""
    import yaml

    line = '{{"tokens_per_s": 1e9, "step_time_s": 100}}'  # braces doubled for the template
    space = {
        "name": "liar",
        "model": {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "vocab_size": 100,
                  "seq_length": 32},
        "allocation": {"nodes": 1, "devices_per_node": 1, "device_memory": "1GiB",
                       "peak_tflops": 1000, "device": "cpu"},
        "search": {"tp": 1, "pp": 1, "mbs": 1, "gas": 1},
        "trainer": {"kind": "command", "parser": "json", "timeout": 60,
                    "command": [sys.executable, "-c", f"print({line!r})"]},
    }  # fmt: skip
    path = tmp_path / "liar.yaml"
    path.write_text(yaml.safe_dump(space))
    code = main(["trial", str(path), "--layout", "tp1 pp1 mbs1 gas1"])
    out = capsys.readouterr().out
    assert code == 1
    assert "state    error" in out
    assert "tokens_per_s = 1e+09 and step_time_s = 100 contradict each other" in out
