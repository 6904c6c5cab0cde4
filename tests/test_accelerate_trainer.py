"""Hugging Face Accelerate, a program nobody here wrote, under torchrun (dp 2 over gloo): a
campaign of search_spaces/examples/accelerate/ whose stored metrics are what it printed
(memory: parsearch's measure within 10% of the program's), and the launch a user tried
first, ``accelerate launch --cpu --num_processes 2``, which runs one process on a CPU: the
trial is an error naming both world sizes, not a dp 2 measurement."""

from __future__ import annotations

import re
import statistics
import sys

import pytest
import yaml
from real_trainers import example_space, failed_trials, parsearch

from parsearch import results
from parsearch.store import open_store

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.multiprocess]
SPACE = "accelerate/accelerate-cpu.yaml"


def one_layout(space) -> None:
    data = yaml.safe_load(space.read_text())
    data["search"].update(mbs=2, gas=2)
    space.write_text(yaml.safe_dump(data, sort_keys=False))


def test_a_campaign_stores_what_accelerate_printed_and_measures_its_memory(tmp_path):
    import accelerate  # noqa: F401  (the trainers extra installs it; a missing one must fail)

    space = example_space(SPACE, tmp_path)
    one_layout(space)
    store = str(tmp_path / "acc.db")
    parsearch("run", str(space), "--store", store, "--budget", "1", "--quiet",
              "--backend-opt", f"workdir={tmp_path / 'trials'}")  # fmt: skip
    frame = results(store)
    assert list(frame["state"]) == ["ok"], failed_trials(store)
    (trial,) = [row for _, row in frame.iterrows()]
    text = next((tmp_path / "trials").glob("*-00000-a1/rank0.log")).read_text()
    times = [float(v) for v in re.findall(r"step_time=([0-9.eE+-]+)", text)]
    assert len(times) == 6 and trial["dp"] == 2
    assert trial["step_time_s"] == pytest.approx(statistics.median(times[1:]))
    (printed,) = [int(v) for v in re.findall(r"peak_rss_bytes=(\d+)", text)]
    assert trial["measured_peak_rss_bytes"] == pytest.approx(printed, rel=0.1)
    assert trial["peak_mem_bytes"] == max(printed, trial["measured_peak_rss_bytes"])


def test_accelerate_launch_cpu_runs_one_process_and_the_trial_says_so(tmp_path):
    accelerate_cli = [sys.executable, "-m", "accelerate.commands.launch"]
    command = [
        *accelerate_cli, "--cpu", "--num_processes", "{nproc_per_node}", "--num_machines",
        "{nnodes}", "--mixed_precision", "no", "--dynamo_backend", "no",
        "{launch_dir}/{script}", "--mbs={mbs}", "--gas={gas}", "--steps={steps}",
        "--seq-length={seq_length}",
    ]  # fmt: skip
    space = example_space(SPACE, tmp_path, command=command)
    one_layout(space)
    store = str(tmp_path / "one.db")
    parsearch("run", str(space), "--store", store, "--budget", "1", "--quiet",
              "--backend-opt", f"workdir={tmp_path / 'trials'}")  # fmt: skip
    with open_store(store, readonly=True) as opened:
        (trial,) = opened.trials(opened.get_campaign().id)
    assert trial.state.value == "error", trial.error
    assert "the program reports world size 1 but the layout" in trial.error
    assert "has world size 2" in trial.error
