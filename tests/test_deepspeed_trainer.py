"""DeepSpeed, a program nobody here wrote, on its CPU accelerator over gloo (2 ranks, torchrun):
one campaign of search_spaces/examples/deepspeed/ over ZeRO stages 0 and 3 (dp 2: none
and all of the model states sharded; stages 1 and 2 take the same path through ds_config.json)
and its pipeline engine (pp 2), whose stored metrics must be the numbers DeepSpeed printed and whose
ds_config.json must round-trip through ``parsearch best --format deepspeed``; and a kill -9
that leaves none of its processes.
"""

from __future__ import annotations

import json
import re
import statistics

import pytest
from real_trainers import example_space, failed_trials, kill_9_leaves_nothing, parsearch

from parsearch import results

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.multiprocess]
SPACE = "deepspeed/deepspeed-zero-cpu.yaml"
SEQ = 64


def test_zero_stages_and_pipeline_store_what_deepspeed_printed(tmp_path):
    import deepspeed  # noqa: F401  (the dev extra installs it; a missing one must fail)

    space = example_space(SPACE, tmp_path)
    data = __import__("yaml").safe_load(space.read_text())
    # pp 1 x ZeRO 0 and 3, and pp 2 (dp 1, so ZeRO 0 only): three layouts, once each.
    data["search"].update(zero_stage=[0, 3], mbs=2, gas=2)
    space.write_text(__import__("yaml").safe_dump(data, sort_keys=False))
    store = str(tmp_path / "ds.db")
    parsearch("run", str(space), "--store", store, "--budget", "3", "--quiet",
              "--backend-opt", f"workdir={tmp_path / 'trials'}")  # fmt: skip
    frame = results(store)
    layouts = sorted(zip(frame["pp"], frame["zero_stage"], strict=True))
    assert layouts == [(1, 0), (1, 3), (2, 0)]
    assert list(frame["state"]) == ["ok"] * 3, failed_trials(store)
    for _, trial in frame.iterrows():
        trial_dir = next((tmp_path / "trials").glob(f"*-{trial['number']:05d}-a1"))
        log = (trial_dir / "rank0.log").read_text()
        if trial["pp"] == 1:  # the engine's ThroughputTimer, from global step 3 on
            printed = [float(v) for v in re.findall(r"CurrSamplesPerSec=([0-9.eE+-]+)", log)]
            assert len(printed) == 4
            peak = max(float(v) for v in re.findall(r"MaxMemAllocated=([0-9.]+)GB", log))
            assert trial["reported_peak_mem_bytes"] == int(peak * 2**30)
            # parsearch's own measure (peak RSS of the ranks) agrees with DeepSpeed's, which
            # is the same figure rounded to 10 MB; the larger one is the trial's.
            measured = trial["measured_peak_rss_bytes"]
            assert measured == pytest.approx(int(peak * 2**30), rel=0.1)
            assert trial["peak_mem_bytes"] == max(measured, int(peak * 2**30))
        else:  # the pipeline engine's train_batch line, every global step, no memory
            printed = [float(v) for v in re.findall(r"^steps: \d+ .* samples/sec: (\S+)$", log,
                                                    re.MULTILINE)]  # fmt: skip
            assert len(printed) == 6
            assert "CurrSamplesPerSec" not in log
            # None printed: the peak is parsearch's own measure of the ranks.
            assert trial["reported_peak_mem_bytes"] != trial["reported_peak_mem_bytes"]  # NaN
            assert trial["peak_mem_bytes"] == trial["measured_peak_rss_bytes"] > 2**20
        expected = statistics.median(printed[1:]) * SEQ  # warmup_steps: 1
        assert trial["tokens_per_s"] == pytest.approx(expected, rel=1e-9)
        written = json.loads((trial_dir / "ds_config.json").read_text())
        assert written["zero_optimization"]["stage"] == trial["zero_stage"]
        assert written["train_batch_size"] == 2 * 2 * (2 // trial["pp"])
    best = json.loads(parsearch("best", "--store", store, "--format", "json"))
    exported = json.loads(parsearch("best", "--store", store, "--format", "deepspeed"))
    best_dir = next((tmp_path / "trials").glob(f"*-{best['trial']:05d}-a1"))
    written = json.loads((best_dir / "ds_config.json").read_text())
    assert exported == {key: written[key] for key in exported}


def test_kill_9_of_the_driver_leaves_no_deepspeed_process(tmp_path):
    space = example_space(SPACE, tmp_path, steps=100000, timeout=900)
    kill_9_leaves_nothing(space, tmp_path, processes=4)  # guard, torchrun, two workers
