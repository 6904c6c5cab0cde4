"""What the built-in trainer costs on this CPU, against plain PyTorch.

1. Step time of a one-rank trial against a plain single-process loop of the same model,
   batch and optimizer (measured in this run, one thread each). Target: ratio near 1.
2. Fixed cost of a trial (spawn, imports, process group, build, report, teardown: the
   trial's wall time minus its measured steps) at 1, 2 and 4 ranks, with rank 0's phases to
   show what dominates, for ranks forked from the agent's warm fork server (the default)
   and started as new programs. Target: <= 3 s at 4 ranks.
3. Tokens/s of a dp=2 trial against two independent one-rank trials running at the same
   time, each on half the global batch (``--dp-batch``). Target: >= 0.9x.

    .venv/bin/python benchmarks/bench_trainer.py [--steps 10] [--hidden 128]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from parsearch.config import AllocationSpec, ModelSpec, ParallelLayout
from parsearch.result import TrialResult
from parsearch.trainers.builtin import run_trial
from parsearch.trainers.builtin.plain import plain_training
from parsearch.trial import TrialSpec

WARMUP = 2


def make_spec(args: argparse.Namespace, dp: int, batch: int, name: str) -> TrialSpec:
    model = ModelSpec(
        num_layers=4,
        hidden_size=args.hidden,
        num_heads=4,
        vocab_size=2048,
        seq_length=128,
        name="bench",
    )
    return TrialSpec(
        trial_id=name,
        model=model,
        layout=ParallelLayout(tp=1, pp=1, dp=dp, mbs=batch // dp, gas=1),
        allocation=AllocationSpec(
            nodes=1,
            devices_per_node=dp,
            device_memory_bytes=2**34,
            peak_flops_per_device=1e11,
            device="cpu",
        ),
        trainer={"kind": "builtin", "steps": args.steps, "warmup_steps": WARMUP},
        timeout_s=600,
    )


def trial(spec: TrialSpec, prefork: bool = True) -> tuple[TrialResult, float]:
    with tempfile.TemporaryDirectory() as directory:
        began = time.perf_counter()
        result = run_trial(spec, Path(directory), prefork=prefork)
        wall = time.perf_counter() - began
    if not result.ok:
        raise SystemExit(
            f"{spec.trial_id}: {result.status.value}: {result.error}\n{result.log_tail}"
        )
    return result, wall


def step_time_against_plain(args: argparse.Namespace) -> None:
    spec = make_spec(args, 1, args.batch, "one-rank")
    began = time.perf_counter()
    trial(spec)
    print(f"first trial (starts the fork server): {time.perf_counter() - began:.2f} s")
    torch.set_num_threads(1)
    ratios = []
    for _ in range(args.repeat):
        ours = trial(spec)[0].metrics["step_time_s"]
        plain = statistics.median(plain_training(spec, WARMUP + args.steps)[1][WARMUP:])
        ratios.append(ours / plain)
        print(
            f"step time, {spec.layout.global_batch}x{spec.model.seq_length} tokens: "
            f"trainer {ours * 1e3:.1f} ms, plain loop {plain * 1e3:.1f} ms, "
            f"ratio {ratios[-1]:.2f}"
        )
    print(f"trainer/plain step time: median {statistics.median(ratios):.2f}")


def fixed_costs(args: argparse.Namespace) -> None:
    """Wall time minus measured steps; rank 0's phases say where it went (warm-up = the
    steps phase minus the measured steps; "rest" = reporting, teardown and the agent)."""
    for prefork in (True, False):
        label = "forked from a warm server" if prefork else "started as new programs"
        for ranks in (1, 2, 4):
            costs, phases = [], []
            for repeat in range(args.repeat):
                spec = make_spec(args, ranks, args.batch, f"fixed-{ranks}-{repeat}")
                result, wall = trial(spec, prefork)
                measured = sum(result.metrics["step_times_s"][WARMUP:])
                costs.append(wall - measured)
                parts = dict(result.metrics["phases_s"])
                parts["warmup_s"] = parts.pop("steps_s") - measured
                parts["rest_s"] = wall - measured - sum(parts.values())
                phases.append(parts)
            best = min(range(len(costs)), key=costs.__getitem__)
            detail = ", ".join(f"{k[:-2]} {v:.2f}" for k, v in phases[best].items())
            print(
                f"fixed cost, {ranks} rank(s) {label}: {costs[best]:.2f} s (best of "
                f"{args.repeat}; median {statistics.median(costs):.2f} s) = {detail}"
            )


def data_parallel_efficiency(args: argparse.Namespace) -> None:
    """Alternate the two measurements ``repeat`` times: other load on the machine hits
    synchronous data parallelism harder than independent runs, so one pair proves little."""
    half = make_spec(args, 1, args.dp_batch // 2, "half")
    ratios = []
    for _ in range(args.repeat):
        together, _ = trial(make_spec(args, 2, args.dp_batch, "dp2"))
        with ThreadPoolExecutor(2) as pool:
            alone = list(pool.map(trial, [half, half]))
        independent = sum(result.metrics["tokens_per_s"] for result, _ in alone)
        ratios.append(together.metrics["tokens_per_s"] / independent)
        print(
            f"dp=2: {together.metrics['tokens_per_s']:.0f} tokens/s; two independent "
            f"one-rank runs: {independent:.0f} tokens/s; ratio {ratios[-1]:.2f}"
        )
    print(f"dp=2 efficiency: median {statistics.median(ratios):.2f}, best {max(ratios):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="measured steps per trial")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8, help="global batch (sequences)")
    parser.add_argument("--repeat", type=int, default=3, help="trials per figure")
    parser.add_argument(
        "--dp-batch",
        type=int,
        default=32,
        help="global batch of the dp=2 comparison: the gradient all-reduce (4 MB at "
        "--hidden 128) is a fixed cost per step, so too small a batch per rank measures it",
    )
    args = parser.parse_args()
    load = os.getloadavg()[0]
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, load average {load:.1f} "
        "(other work on the machine makes every figure worse, data parallelism most)"
    )
    step_time_against_plain(args)
    fixed_costs(args)
    data_parallel_efficiency(args)


if __name__ == "__main__":
    main()
