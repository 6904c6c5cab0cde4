"""PyTorch Lightning's Trainer, a program nobody here wrote, under torchrun with DDP over gloo
(dp 2): a campaign of search_spaces/examples/lightning/ whose stored metrics are the numbers
the program printed (memory: parsearch's own measure within 10% of the program's), a crash
whose reason is the failed rank's own exception, and a kill -9 that leaves none of its
processes."""

from __future__ import annotations

import re
import statistics

import pytest
import yaml
from real_trainers import EXAMPLES, example_space, failed_trials, kill_9_leaves_nothing, parsearch
from trials_seen import trials_seen

from parsearch import results
from parsearch.store import open_store

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.multiprocess]
SPACE = "lightning/lightning-cpu.yaml"
SEQ = 64


def test_a_campaign_stores_what_lightning_printed_and_measures_its_memory(tmp_path):
    space = example_space(SPACE, tmp_path)
    store = str(tmp_path / "pl.db")
    parsearch("run", str(space), "--store", store, "--budget", "2", "--quiet",
              "--backend-opt", f"workdir={tmp_path / 'trials'}")  # fmt: skip
    frame = results(store)
    assert list(frame["state"]) == ["ok"] * 2, failed_trials(store)
    assert set(frame["dp"]) == {2}
    for _, trial in frame.iterrows():
        log = next((tmp_path / "trials").glob(f"*-{trial['number']:05d}-a1/rank0.log"))
        text = log.read_text()
        times = [float(v) for v in re.findall(r"step_time=([0-9.eE+-]+)", text)]
        assert len(times) == 6
        assert trial["step_time_s"] == pytest.approx(statistics.median(times[1:]))
        global_batch = trial["mbs"] * trial["gas"] * 2
        assert trial["tokens_per_s"] == pytest.approx(
            statistics.median(global_batch * SEQ / t for t in times[1:])
        )
        (printed,) = [int(v) for v in re.findall(r"peak_rss_bytes=(\d+)", text)]
        assert trial["reported_peak_mem_bytes"] == printed
        assert trial["measured_peak_rss_bytes"] == pytest.approx(printed, rel=0.1)
        assert trial["peak_mem_bytes"] == max(printed, trial["measured_peak_rss_bytes"])


def test_a_crash_on_one_rank_is_stored_with_that_ranks_own_error(tmp_path):
    data = yaml.safe_load((EXAMPLES / SPACE).read_text())
    command = [*data["trainer"]["command"], "--fail-on-rank=1"]
    space = example_space(SPACE, tmp_path, command=command, timeout=120)
    store = str(tmp_path / "crash.db")
    parsearch("run", str(space), "--store", store, "--budget", "1", "--quiet",
              "--backend-opt", f"workdir={tmp_path / 'trials'}")  # fmt: skip
    with open_store(store, readonly=True) as opened:
        (trial,) = opened.trials(opened.get_campaign().id)
    assert trial.state.value == "error", trials_seen([trial])
    assert "rank 1: RuntimeError: rank 1: loss is NaN at step 0" in trial.error, trial.error
    assert "ChildFailedError" not in trial.error
    status = parsearch("status", "--store", store)
    assert "RuntimeError: rank 1: loss is NaN" in status


def test_kill_9_of_the_driver_leaves_no_lightning_process(tmp_path):
    space = example_space(SPACE, tmp_path, steps=100000, timeout=900)
    kill_9_leaves_nothing(space, tmp_path, processes=4)  # guard, torchrun, two workers
