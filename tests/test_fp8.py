"""Precision as a searched layout dimension (issue 50): the space's rule against the device
profile, the estimate's FP8 GEMM rate and weight copies, and the built-in trainer's answer on
a device without FP8 (infeasible, with the reason)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from parsearch.config import ParallelLayout
from parsearch.errors import SpaceError
from parsearch.space import load_space, space_from_dict

ROOT = Path(__file__).parent.parent
FP8_SPACE = ROOT / "search_spaces/llama3-70b-h100-fp8.yaml"
LAYOUT = ParallelLayout(
    tp=8, pp=4, dp=4, mbs=1, gas=128, recompute="selective", sequence_parallel=True
)


def _raw(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_space_maps_its_own_precision_to_auto_and_keeps_old_keys():
    space = load_space(FP8_SPACE)
    assert space.dimensions["precision"] == ("auto", "fp8"), space.dimensions
    old = ParallelLayout(tp=8, pp=4, dp=4, mbs=1, gas=128)
    assert "precision" not in json.dumps(old.short()), old.short()
    assert old.key() != dataclasses.replace(old, precision="fp8").key()
    assert dataclasses.replace(old, precision="fp8").short().endswith("p=fp8")


def test_fp8_on_an_a100_profile_is_refused_naming_field_and_profile():
    raw = _raw(FP8_SPACE)
    raw["estimate"]["machine"] = "a100-80gb-dgx"
    raw["allocation"]["peak_tflops"] = 312
    with pytest.raises(SpaceError) as caught:
        space_from_dict(raw, source=str(FP8_SPACE))
    text = str(caught.value)
    assert "search.precision" in text and "a100-80gb-dgx" in text, text
    assert "FP8" in text, text


def test_fp8_without_a_profile_is_refused_and_a_wrong_name_lists_the_valid_ones():
    raw = _raw(FP8_SPACE)
    del raw["estimate"]["machine"]
    with pytest.raises(SpaceError, match=r"estimate\.machine"):
        space_from_dict(raw, source=str(FP8_SPACE))
    raw = _raw(FP8_SPACE)
    raw["search"]["precision"] = ["fp16", "fp8"]
    with pytest.raises(SpaceError, match=r"\['bf16', 'fp8'\]"):
        space_from_dict(raw, source=str(FP8_SPACE))


def test_fp8_speeds_gemms_only_and_adds_weight_copies():
    space = load_space(FP8_SPACE)
    bf16 = space.predict(LAYOUT)
    fp8 = space.predict(dataclasses.replace(LAYOUT, precision="fp8"))
    ratio = bf16.step_time_s / fp8.step_time_s
    # GEMMs at most 2x faster (1979 / 989), attention, communication and the rest unchanged.
    assert 1.1 < ratio < 2.0, ratio
    assert fp8.tp_comm_s == bf16.tp_comm_s and fp8.optimizer_s == bf16.optimizer_s
    # 2 bytes a linear parameter on the rank: 80/4 layers of 8192x(8192+2x1024+8192) attention
    # and 3x8192x28672 MLP weights each, split over tp 8: 4.28 GB.
    extra = fp8.memory.weights - bf16.memory.weights
    per_layer = 8192 * (2 * 8192 + 2 * 1024) + 3 * 8192 * 28672
    assert extra == pytest.approx(2 * 20 * per_layer / 8), extra


def test_builtin_trainer_on_cpu_ends_fp8_infeasible_with_the_reason(tmp_path):
    space = load_space(ROOT / "search_spaces/tiny-cpu.yaml")
    from parsearch.trial import TrialSpec

    layout = ParallelLayout(tp=1, pp=1, dp=1, mbs=1, gas=1, precision="fp8")
    spec = TrialSpec(
        trial_id="fp8-cpu",
        model=space.model,
        layout=layout,
        allocation=dataclasses.replace(space.allocation, nodes=1, devices_per_node=1),
        trainer=space.trainer,
    )
    path = tmp_path / "spec.json"
    path.write_text(spec.to_json())
    out = tmp_path / "result.json"
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29571", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "parsearch.trainers.builtin",
            "--spec",
            str(path),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["status"] == "infeasible", result
    assert "compute capability" in result["error"] and "cpu" in result["error"], result


def test_the_published_fp8_speed_ups_load_and_each_gets_the_estimates_ratio(capsys):
    from estimate_fidelity import fp8_published, report_fp8

    runs = fp8_published()
    assert len(runs) >= 4 and all(run.source and run.speedup > 1 for run in runs), runs
    summary = report_fp8(runs)
    assert summary["rows"] == len(runs)
    assert 0.5 < summary["ratio_min"] <= summary["ratio_max"] < 1.5, summary
    assert "within ±10%" in capsys.readouterr().out
