"""Hugging Face transformers' Trainer, a program nobody here wrote, under torchrun with DDP
over gloo (dp 2): a campaign of search_spaces/examples/hf-trainer/ whose stored metrics
must be the numbers the Trainer printed, and a kill -9 that leaves none of its processes.
"""

from __future__ import annotations

import json
import re
import statistics

import pytest
from real_trainers import example_space, failed_trials, kill_9_leaves_nothing, parsearch

from parsearch import results

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.multiprocess]
SPACE = "hf-trainer/hf-trainer-gpt2-cpu.yaml"
SEQ = 64


def printed(log: str, key: str) -> list[float]:
    return [float(v) for v in re.findall(rf"'{key}': '?([0-9.eE+-]+)", log)]


def test_a_campaign_stores_what_the_trainer_printed(tmp_path):
    import transformers  # noqa: F401  (the dev extra installs it; a missing one must fail)

    space = example_space(SPACE, tmp_path)
    # Two layouts: each trial starts torchrun and two workers that import transformers.
    parsearch("run", str(space), "--store", str(tmp_path / "hf.db"), "--budget", "2",
              "--quiet", "--backend-opt", f"workdir={tmp_path / 'trials'}")  # fmt: skip
    frame = results(tmp_path / "hf.db")
    assert list(frame["state"]) == ["ok"] * 2, failed_trials(str(tmp_path / "hf.db"))
    assert len(set(zip(frame["mbs"], frame["gas"], strict=True))) == 2
    assert set(frame["dp"]) == {2}
    for _, trial in frame.iterrows():
        log = (tmp_path / "trials").glob(f"*-{trial['number']:05d}-a1/rank0.log")
        text = next(log).read_text()
        # Each optimizer step's time (the script's TrainerCallback), the first left out:
        # the Trainer's own train_samples_per_second includes its start-up.
        times = [float(v) for v in re.findall(r"step_time=([0-9.eE+-]+)", text)]
        assert len(times) == 6
        assert trial["step_time_s"] == pytest.approx(statistics.median(times[1:]))
        global_batch = trial["mbs"] * trial["gas"] * 2
        assert f"launch world_size=2 global_batch={global_batch}" in text
        assert trial["tokens_per_s"] == pytest.approx(
            statistics.median(global_batch * SEQ / t for t in times[1:])
        )
        losses = printed(text, "loss")
        assert len(losses) == 6  # one line per optimizer step
        assert trial["loss"] == pytest.approx(losses[-1])
    best = json.loads(parsearch("best", "--store", str(tmp_path / "hf.db"), "--format", "json"))
    assert best["metrics"]["tokens_per_s"] == pytest.approx(frame["tokens_per_s"].max())


def test_kill_9_of_the_driver_leaves_no_trainer_process(tmp_path):
    space = example_space(SPACE, tmp_path, steps=100000, timeout=900)
    kill_9_leaves_nothing(space, tmp_path, processes=4)  # guard, torchrun, two workers
