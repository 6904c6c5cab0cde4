"""A nanoGPT-style script (search_spaces/examples/nanogpt/train.py: module-level code, DDP
when torchrun sets RANK, gradient accumulation meaning the total over the ranks), as one
plain process and under torchrun: campaigns store what it printed; it prints no memory, so
the peak is parsearch's own measure and the memory cap applies to it; a template passing
{gas} where the script wants gas*dp is an error naming both global batch sizes."""

from __future__ import annotations

import re
import statistics

import pytest
import yaml
from real_trainers import EXAMPLES, example_space, failed_trials, parsearch
from trials_seen import trials_seen

from parsearch import results
from parsearch.store import open_store

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.multiprocess]
SINGLE, DDP = "nanogpt/nanogpt-cpu.yaml", "nanogpt/nanogpt-ddp-cpu.yaml"
MIB = 2**20


def one_layout(space, mbs: int, gas: int, **top) -> None:
    data = yaml.safe_load(space.read_text())
    data["search"].update(mbs=mbs, gas=gas)
    data.update(top)
    space.write_text(yaml.safe_dump(data, sort_keys=False))


def campaign(space, tmp_path, name: str):
    store = str(tmp_path / f"{name}.db")
    parsearch("run", str(space), "--store", store, "--budget", "1", "--quiet",
              "--backend-opt", f"workdir={tmp_path / name}")  # fmt: skip
    return store


@pytest.mark.parametrize("relative, dp", [(SINGLE, 1), (DDP, 2)], ids=["single", "ddp"])
def test_a_campaign_stores_what_it_printed_and_measures_its_memory(tmp_path, relative, dp):
    space = example_space(relative, tmp_path)
    one_layout(space, mbs=2, gas=2)
    store = campaign(space, tmp_path, "ng")
    frame = results(store)
    assert list(frame["state"]) == ["ok"], failed_trials(store)
    (trial,) = [row for _, row in frame.iterrows()]
    assert trial["dp"] == dp
    text = next((tmp_path / "ng").glob("*-00000-a1/rank0.log")).read_text()
    times = [float(v) / 1000 for v in re.findall(r"time ([0-9.]+)ms", text)]
    assert len(times) == 6
    assert trial["step_time_s"] == pytest.approx(statistics.median(times[1:]))
    assert f"tokens per iteration will be: {2 * 2 * dp * 64:,}" in text
    measured = trial["measured_peak_rss_bytes"]
    assert 100 * MIB < measured < 2048 * MIB  # torch imported: hundreds of MiB a process
    assert trial["peak_mem_bytes"] == measured  # the script prints none


def test_the_memory_cap_applies_to_what_parsearch_measured(tmp_path):
    space = example_space(SINGLE, tmp_path)
    one_layout(space, mbs=1, gas=1, memory_cap="64MiB")
    store = campaign(space, tmp_path, "capped")
    with open_store(store, readonly=True) as opened:
        (trial,) = opened.trials(opened.get_campaign().id)
    assert trial.state.value == "oom", trial.error
    assert "exceeds memory_cap 64 MiB" in trial.error


def test_passing_gas_where_the_script_wants_gas_times_dp_is_an_error_naming_both(tmp_path):
    data = yaml.safe_load((EXAMPLES / DDP).read_text())
    command = [
        "--gradient_accumulation_steps={gas}" if "gradient_accumulation" in arg else arg
        for arg in data["trainer"]["command"]
    ]
    space = example_space(DDP, tmp_path, command=command)
    one_layout(space, mbs=1, gas=2)
    store = campaign(space, tmp_path, "wrong")
    with open_store(store, readonly=True) as opened:
        (trial,) = opened.trials(opened.get_campaign().id)
    assert trial.state.value == "error", trials_seen([trial])
    assert "the program reports global batch size 2 but the layout" in trial.error
    assert "has global batch size 4" in trial.error
