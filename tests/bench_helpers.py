"""Helpers for the built-in trainer's tests: tiny specs, several trials per launch, and rank
programs with an injected fault.

Run as a program it is one rank of a test launch (started by the node agent):

* ``many SPECS OUT``: train every spec of the JSON list ``SPECS`` in turn inside one process
  group (one launch instead of one per spec: process start-up dominates on a small CPU);
  rank 0 writes the results as a JSON list to ``OUT``;
* ``fault MODE RANK SPEC OUT``: the real ``python -m parsearch.trainers.builtin`` rank program,
  except that rank ``RANK``'s model raises (``MODE=raise``) or sleeps forever (``MODE=hang``) in
  its first forward.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from parsearch.config import AllocationSpec, ModelSpec, ParallelLayout
from parsearch.launch.placement import NodePlacement
from parsearch.launch.plan import NodePlan
from parsearch.launch.process import run_local
from parsearch.rank_program import rank_program_plan
from parsearch.result import TrialResult
from parsearch.trial import TrialSpec

HELPER = Path(__file__).resolve()
TINY_MODEL = {
    "num_layers": 4,
    "hidden_size": 64,
    "num_heads": 4,
    "vocab_size": 128,
    "seq_length": 32,
}
GLOBAL_BATCH = 8


def tiny_spec(
    tp: int = 1,
    pp: int = 1,
    dp: int = 1,
    *,
    gas: int | None = None,
    model: dict[str, Any] | None = None,
    trainer: dict[str, Any] | None = None,
    timeout_s: float = 240.0,
    **layout: Any,
) -> TrialSpec:
    """A trial of the tiny test model; the global batch is always :data:`GLOBAL_BATCH`
    sequences (micro-batches of ``GLOBAL_BATCH / (dp * gas)``), so losses are comparable."""
    gas = gas or max(1, GLOBAL_BATCH // dp // 2)
    mbs = GLOBAL_BATCH // (dp * gas)
    assert mbs * dp * gas == GLOBAL_BATCH, (dp, gas)
    world = tp * pp * dp
    return TrialSpec(
        trial_id=f"tp{tp}pp{pp}dp{dp}",
        model=ModelSpec(**(TINY_MODEL | (model or {}))),
        layout=ParallelLayout(tp=tp, pp=pp, dp=dp, mbs=mbs, gas=gas, **layout),
        allocation=AllocationSpec(
            nodes=1,
            devices_per_node=world,
            device_memory_bytes=2**30,
            peak_flops_per_device=1e11,
            device="cpu",
        ),
        trainer={"kind": "builtin", "steps": 3, "warmup_steps": 2} | (trainer or {}),
        timeout_s=timeout_s,
        seed=7,
    )


def run_many(specs: list[TrialSpec], trial_dir: Path) -> list[TrialResult]:
    """Run ``specs`` (same world size) one after another in a single launch."""
    trial_dir.mkdir(parents=True, exist_ok=True)
    specs_path, out = trial_dir / "specs.json", trial_dir / "results.json"
    specs_path.write_text(json.dumps([s.to_dict() for s in specs]))
    command = [sys.executable, str(HELPER), "many", str(specs_path), str(out)]
    launch = max(specs, key=lambda s: s.timeout_s)
    result = run_local(launch, lambda placement: command_plan(placement, command), trial_dir)
    assert result.ok, f"{result.status}: {result.error}\n{result.log_tail}"
    return [TrialResult.from_dict(item) for item in json.loads(out.read_text())]


def command_plan(placement: NodePlacement, command: list[str]) -> NodePlan:
    """``command`` for every rank, planned as the built-in trainer's ranks are (spec.json
    written, one device a rank on GPUs, never forked), with rank 0's result.json read when
    it wrote one."""
    planned = rank_program_plan(placement, "parsearch.trainers.builtin", required=False)
    return replace(planned, argv=list(command))


def fault_command(mode: str, rank: int, trial_dir: Path) -> list[str]:
    return [
        sys.executable,
        str(HELPER),
        "fault",
        mode,
        str(rank),
        str(trial_dir / "spec.json"),
        str(trial_dir / "result.json"),
    ]


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Train in-process with one thread, as every rank does (OMP_NUM_THREADS=1)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _many(specs_path: str, out: str) -> None:
    from parsearch.trainers.builtin.env import RankEnv
    from parsearch.trainers.builtin.trainer import (
        TrainerSettings,
        process_group,
        resolve_device,
        train,
    )

    faulthandler.enable()
    specs = [TrialSpec.from_dict(item) for item in json.loads(Path(specs_path).read_text())]
    env = RankEnv.from_environ()
    device = resolve_device(TrainerSettings.from_spec(specs[0]), specs[0], env)
    results = []
    with process_group(env, device, specs[0].timeout_s):
        for spec in specs:
            results.append(train(spec, env))
    if env.rank == 0:
        Path(out).write_text(json.dumps([r.to_dict() for r in results]))


def _fault(mode: str, rank: str, spec: str, out: str) -> int:
    from parsearch.trainers.builtin.__main__ import main
    from parsearch.trainers.builtin.model import Transformer

    if os.environ.get("RANK") == rank:

        def faulty(self: Transformer, x: Any) -> Any:
            while mode == "hang":
                time.sleep(1)
            raise RuntimeError("injected failure in rank " + rank)

        Transformer.forward = faulty
    return main(["--spec", spec, "--out", out])


if __name__ == "__main__":
    if sys.argv[1] == "many":
        _many(*sys.argv[2:])
    elif sys.argv[1] == "fault":
        raise SystemExit(_fault(*sys.argv[2:]))
    else:
        raise SystemExit(f"unknown mode {sys.argv[1]!r}")
