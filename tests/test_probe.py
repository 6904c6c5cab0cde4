"""``parsearch probe`` on the local backend: two gloo ranks, through the node agent, write a
profile that loads, matches the space and changes the estimate."""

import dataclasses
import os
import sys
from pathlib import Path

import pytest
import yaml
from trials_seen import trials_seen

from parsearch.cli import main
from parsearch.launch.process import run_local
from parsearch.probe.kind import ProbeKind
from parsearch.probe.plan import plan_for, probe_spec
from parsearch.profiles import load_profile
from parsearch.result import TrialState
from parsearch.space import apply_profile, load_space

SPACE = {
    "name": "probe-tiny",
    "model": {
        "arch": "gpt",
        "num_layers": 2,
        "hidden_size": 64,
        "num_heads": 2,
        "vocab_size": 128,
        "seq_length": 32,
    },
    "allocation": {
        "nodes": 1,
        "devices_per_node": 2,
        "device": "cpu",
        "device_memory": "1GiB",
        "peak_tflops": 0.05,
    },
    "search": {"tp": [1, 2], "pp": [1, 2], "mbs": [1, 2]},
    "global_batch": 4,
    "trainer": {"kind": "builtin", "steps": 2, "warmup_steps": 1},
    "estimate": {"precision": "fp32"},
}


@pytest.fixture()
def space_file(tmp_path: Path) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(SPACE))
    return path


def test_plan_covers_the_shapes_and_groups_of_the_layouts(space_file):
    plan = plan_for(load_space(space_file))
    assert set(plan.gemm_shapes) == {(1, 1), (1, 2), (2, 1), (2, 2)}
    # TP all-reduces are timed in situ with the layer; DP 2 gets its own all-reduces.
    (pattern,) = plan.patterns
    assert (pattern.kind, pattern.size, pattern.groups(2)) == ("dp-intra-node", 2, [[0, 1]])
    assert pattern.ops == ("all-reduce",)
    assert plan.p2p_sizes and min(plan.p2p_sizes) == 4096


@pytest.mark.multiprocess
def test_probe_writes_a_profile_the_estimate_uses(space_file, tmp_path, capsys):
    out = tmp_path / "machine.yaml"
    args = ["probe", str(space_file), "--out", str(out), "--timeout", "120", "--rounds", "1"]
    assert main(args) == 0
    progress = capsys.readouterr().err
    assert "layer tp=2 mbs=2" in progress and "all-reduce" in progress
    profile = load_profile(out)
    assert {(p.tp, p.mbs) for p in profile.gemm} == {(1, 1), (1, 2), (2, 1), (2, 2)}
    assert all(0 < p.efficiency <= 1 for p in profile.gemm)
    kinds = {(fit.kind, fit.op) for fit in profile.collectives}
    assert {("tp-intra-node", "all-reduce"), ("dp-intra-node", "all-reduce")} <= kinds
    assert ("pp-p2p", "send-recv") in kinds
    for fit in profile.collectives:
        assert fit.alpha_s >= 0 and fit.beta_s_per_byte > 0
    # CPU ranks with one thread each (OMP_NUM_THREADS=1): one compute slot per core.
    assert profile.compute_slots_per_node == len(os.sched_getaffinity(0))
    raw = yaml.safe_load(out.read_text())
    assert raw["measured"]["communication"] == "gloo" and raw["measured"]["backend"] == "local"
    assert len(raw["collectives"][0]["times"]) == len(raw["collectives"][0]["sizes"])
    space = load_space(space_file)
    probed = apply_profile(space, out)
    assert probed.estimate.machine is not None
    assert probed.plan().feasible  # the probed estimate ranks the same layouts


def test_a_probe_whose_rank_0_writes_no_result_is_an_error_naming_the_file(space_file, tmp_path):
    """The probe's own plan and conclusion, its ranks exiting 0 without writing result.json
    (as a probe program that crashed quietly would): an error naming the file, not an ok
    probe without figures."""
    space = load_space(space_file)
    spec = probe_spec(space, plan_for(space), trial_id="probe", timeout_s=60)

    def quiet_ranks(placement):
        return dataclasses.replace(ProbeKind().plan(placement), argv=[sys.executable, "-c", ""])

    result = run_local(spec, quiet_ranks, tmp_path / "probe")
    assert result.status is TrialState.ERROR, trials_seen([result])
    assert result.error is not None and "result.json" in result.error
