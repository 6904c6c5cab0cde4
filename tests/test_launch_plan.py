"""The node agent executes a plan knowing no trainer: a warm start forks the ranks from a
server that preloaded the plan's modules and calls the plan's entry function by name."""

from __future__ import annotations

import sys
import textwrap

from parsearch.config import AllocationSpec, ModelSpec, ParallelLayout
from parsearch.launch.placement import NodePlacement
from parsearch.launch.plan import NodePlan, WarmStart
from parsearch.launch.process import NodeRun
from parsearch.result import TrialResult, TrialState
from parsearch.trial import TrialSpec


def make_spec() -> TrialSpec:
    return TrialSpec(
        trial_id="plan-test",
        model=ModelSpec(num_layers=2, hidden_size=8, num_heads=2, vocab_size=16, seq_length=4),
        layout=ParallelLayout(tp=1, pp=1, dp=2, mbs=1, gas=1),
        allocation=AllocationSpec(
            nodes=1,
            devices_per_node=2,
            device_memory_bytes=2**30,
            peak_flops_per_device=1e12,
            device="cpu",
        ),
        timeout_s=60,
    )


class Metrics:
    """A conclusion that reads what rank 0 printed."""

    def conclude(self, run: NodeRun, verdict: TrialResult) -> TrialResult:
        if not verdict.ok:
            return verdict
        words = (run.trial_dir / "rank0.log").read_text().split()
        return TrialResult(status=TrialState.OK, metrics={"said": words})


def test_a_warm_plan_forks_its_entry_function_and_its_conclusion_decides(tmp_path, monkeypatch):
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "warm_entry_for_test.py").write_text(
        textwrap.dedent(
            """
            import os, sys
            PRELOADED_BY = os.getpid()

            def main(args):
                print(os.environ["RANK"], *args, os.getpid() != PRELOADED_BY, flush=True)
                os._exit(0)
            """
        )
    )
    monkeypatch.setenv("PYTHONPATH", str(modules))
    plan = NodePlan(
        argv=[sys.executable, "-c", "raise SystemExit(3)"],  # what a spawned rank would do
        files={"note.txt": "written before the ranks start"},
        warm=WarmStart(("warm_entry_for_test",), "warm_entry_for_test:main", ("a", "b")),
        conclusion=Metrics(),
    )
    run = NodeRun(NodePlacement(make_spec(), 0, 1, "127.0.0.1", 1, tmp_path / "trial"), plan)
    assert run.forks_warm()
    result = run.start().wait()
    assert result.ok, (result.error, result.log_tail)
    assert result.metrics == {"said": ["0", "a", "b", "True"]}  # forked, not the preloader
    assert (tmp_path / "trial" / "rank1.log").read_text().split() == ["1", "a", "b", "True"]
    assert (tmp_path / "trial" / "note.txt").read_text() == "written before the ranks start"


def test_a_changed_command_is_spawned_not_forked(tmp_path):
    plan = NodePlan(
        argv=[sys.executable, "-c", "print('spawned')"],
        warm=WarmStart(("json",), "json:dumps", ()),
    )
    run = NodeRun(NodePlacement(make_spec(), 0, 1, "127.0.0.1", 1, tmp_path), plan)
    run.command = [sys.executable, "-c", "print('guarded')"]  # as a guard prefix would
    assert not run.forks_warm()
    result = run.start().wait()
    assert result.ok and "guarded" in result.log_tail
