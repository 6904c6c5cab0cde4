"""A trainer that prints impossible numbers: every such trial ends ``error`` naming the value,
is never the best and never reaches the optimiser, and the campaign goes on."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from parsearch.cli import main
from parsearch.plausible import MAX_ADDRESSABLE_BYTES, checked, problem
from parsearch.result import TrialResult, TrialState
from parsearch.store import open_store

# One layout per hostile line (mbs 1..8); mbs 9 reports sane figures.
HOSTILE = {
    1: ('{{"tokens_per_s": Infinity}}', "tokens_per_s = inf"),
    2: ('{{"tokens_per_s": 1e400}}', "tokens_per_s = inf"),
    3: ('{{"tokens_per_s": NaN}}', "tokens_per_s = nan"),
    4: ('{{"tokens_per_s": 100, "peak_mem_bytes": NaN}}', "peak_mem_bytes = nan"),
    5: ('{{"tokens_per_s": 100, "peak_mem_bytes": Infinity}}', "peak_mem_bytes = inf"),
    6: ('{{"tokens_per_s": 2e6}}', "MFU 135475%"),
    7: ('{{"tokens_per_s": 100, "step_time_s": -1}}', "step_time_s = -1"),
    8: ('{{"tokens_per_s": 100, "peak_mem_bytes": -1}}', "peak_mem_bytes = -1"),
}


def _space(tmp_path: Path) -> Path:
    cases = "\n".join(f"        {mbs}: ['{line}']" for mbs, (line, _) in HOSTILE.items())
    path = tmp_path / "hostile.yaml"
    path.write_text(
        f"""name: hostile
model: {{num_layers: 2, hidden_size: 64, num_heads: 4, vocab_size: 100, seq_length: 32}}
allocation: {{nodes: 1, devices_per_node: 1, device_memory: 1GiB, peak_tflops: 0.001,
              device: cpu}}
search: {{tp: 1, pp: 1, mbs: {{range: [1, 9]}}, gas: 1}}
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
    assert main(["run", str(_space(tmp_path)), "--store", str(db), "--budget", "9", "--quiet"]) == 0
    assert "9/9 trials finished (ok 1, error 8)" in capsys.readouterr().out
    with open_store(db, readonly=True) as store:
        campaign = store.get_campaign()
        trials = {t.layout.mbs: t for t in store.trials(campaign.id)}
        for mbs, (_, named) in HOSTILE.items():
            assert trials[mbs].state is TrialState.ERROR, mbs
            assert named in trials[mbs].error, (mbs, trials[mbs].error)
            assert trials[mbs].objective is None
        assert store.best(campaign.id).layout.mbs == 9
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
    ],
)
def test_impossible_figures_are_named(metrics, named):
    assert named in problem(metrics, objective="tokens_per_s", peak_flops_per_device=PEAK)
    result = checked(
        TrialResult(TrialState.OK, metrics), objective="tokens_per_s", peak_flops_per_device=PEAK
    )
    assert result.status is TrialState.ERROR and named in result.error
    assert result.objective("tokens_per_s") == "F_error"  # what the optimiser hears


def test_plausible_figures_and_failures_pass_unchanged():
    sane = TrialResult(
        TrialState.OK, {"tokens_per_s": 1e4, "mfu": 0.4, "peak_mem_bytes": 8 * 2**30}
    )
    assert checked(sane, objective="tokens_per_s", peak_flops_per_device=PEAK) is sane
    oom = TrialResult(TrialState.OOM, {"tokens_per_s": math.nan})
    assert checked(oom, objective="tokens_per_s", peak_flops_per_device=PEAK) is oom
