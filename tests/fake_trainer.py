"""A stand-in for Megatron-LM, Megatron-DeepSpeed, torchtitan or a JSON-reporting trainer.

Plain Python (no torch), so command-trainer tests run in well under a second per trial. It
checks the layout it is given as a real trainer would (world size, global batch), prints
the real log format of the chosen trainer (the lines of tests/fixtures/logs/), and fails on
request the ways real trainers fail:

* ``--oom-above X``: when mbs/tp > X, rank ``--oom-rank`` prints PyTorch's allocator message
  and exits 1 while its peers wait forever in a "collective" (``--hang-after-oom``: the OOM
  rank hangs too, as one stuck in NCCL teardown does);
* ``--hang``: never prints a metric line; ``--hang-after-steps``: hangs after the last step;
* ``--exit-code N``: a traceback and exit N.

Step times are synthetic but deterministic: ``--step-ms`` × mbs·gas / (tp·pp), the first
iteration 3× slower (warm-up) and odd iterations 1% slower, so tests can compute the median.
``--spawn`` makes it its own launcher (like torchrun): it starts ``--nproc-per-node`` copies
with RANK/LOCAL_RANK/WORLD_SIZE set and fails as soon as one of them fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

FORMATS = ("megatron", "megatron-deepspeed", "torchtitan", "json")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--format", choices=FORMATS, required=True)
    for name in ("tp", "pp", "dp", "mbs", "gas", "global-batch", "seq-length", "steps"):
        parser.add_argument(f"--{name}", type=int, required=True)
    parser.add_argument("--step-ms", type=float, default=100.0)
    parser.add_argument("--print-rank", choices=("all", "last"), default="all")
    parser.add_argument("--oom-above", type=float)
    parser.add_argument("--oom-rank", type=int, default=0, help="-1: the last rank")
    parser.add_argument("--hang-after-oom", action="store_true")
    parser.add_argument("--hang", action="store_true")
    parser.add_argument("--hang-after-steps", action="store_true")
    parser.add_argument("--exit-code", type=int, default=0)
    parser.add_argument("--record-argv", action="store_true")
    parser.add_argument("--data-path", help="accepted and ignored, as a data set path")
    parser.add_argument("--spawn", action="store_true")
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--nproc-per-node", type=int, default=1)
    return parser.parse_args(argv)


def hang() -> None:
    while True:
        time.sleep(60)


def spawn(argv: list[str], args: argparse.Namespace) -> int:
    """Be a launcher: start this node's ranks, fail fast as torchrun does."""
    rest = [arg for arg in argv if arg != "--spawn"]
    world = args.nnodes * args.nproc_per_node
    children = []
    for local in range(args.nproc_per_node):
        env = dict(os.environ)
        env.update(
            RANK=str(args.node_rank * args.nproc_per_node + local),
            LOCAL_RANK=str(local),
            WORLD_SIZE=str(world),
        )
        children.append(subprocess.Popen([sys.executable, __file__, *rest], env=env))
    while True:
        codes = [child.poll() for child in children]
        failed = [code for code in codes if code not in (None, 0)]
        if failed:
            for child in children:
                if child.poll() is None:
                    child.kill()
            print(f"launcher: a worker exited with code {failed[0]}", file=sys.stderr)
            return failed[0]
        if all(code == 0 for code in codes):
            return 0
        time.sleep(0.02)


def step_seconds(args: argparse.Namespace, iteration: int) -> float:
    base = args.step_ms / 1000.0 * args.mbs * args.gas / (args.tp * args.pp)
    if iteration == 1:
        return 3 * base
    return base * (1.01 if iteration % 2 else 1.0)


def lines(args: argparse.Namespace, rank: int, world: int) -> list[str]:
    """The metric lines ``rank`` prints, in ``args.format``."""
    out = []
    tokens = args.global_batch * args.seq_length
    peak_mib = 1000.0 * args.mbs / args.tp + rank
    for it in range(1, args.steps + 1):
        seconds = step_seconds(args, it)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        if args.format == "megatron":
            out.append(
                f" [{stamp}] iteration {it:8d}/{args.steps:8d} | consumed samples: "
                f"{it * args.global_batch:12d} | elapsed time per iteration (ms): "
                f"{seconds * 1000:.1f} | throughput per GPU (TFLOP/s/GPU): {42.0:.1f} | "
                f"learning rate: {1e-4:.6E} | global batch size: {args.global_batch:5d} | "
                f"lm loss: {10.0 / it:.6E} | loss scale: 1.0 | grad norm: 1.000 | "
                f"number of skipped iterations: {0:3d} | number of nan iterations: {0:3d} |"
            )
        elif args.format == "megatron-deepspeed":
            out.append(
                f" iteration {it:8d}/{args.steps:8d} | consumed samples: "
                f"{it * args.global_batch:12d} | consumed tokens: {it * tokens:12d} | "
                f"elapsed time per iteration (ms): {seconds * 1000:.1f} | learning rate: "
                f"{1e-4:.3E} | global batch size: {args.global_batch:5d} | lm loss: "
                f"{10.0 / it:.6E} | loss scale: 1.0 | actual seqlen: {args.seq_length:5d} | "
                f"number of skipped iterations: {0:3d} | number of nan iterations: {0:3d} | "
                f"samples per second: {args.global_batch / seconds:.3f} | tokens per gpu per "
                f"second (tgs): {tokens / seconds / world:.3f} | TFLOPs: {42.0:.2f} |"
            )
        elif args.format == "torchtitan":
            tps = tokens / seconds / world
            out.append(
                f"[rank{rank}]:[titan] {stamp},000 - root - INFO - \x1b[31mstep: {it:2}  "
                f"\x1b[32mloss: {10.0 / it:8.5f}  grad_norm: {1.0:7.4f}  memory: "
                f"{peak_mib / 1024:5.2f}GiB(1.00%)  tps: {round(tps):,}  tflops: {42.0:,.2f}  "
                f"mfu: {4.2:.2f}%\x1b[39m"
            )
        if it == 1 and args.format.startswith("megatron"):
            out.append(
                f"[Rank {rank}] (after 1 iterations) memory (MB) | allocated: {peak_mib / 2:.2f}"
                f" | max allocated: {peak_mib:.2f} | reserved: {peak_mib:.2f} | max reserved: "
                f"{peak_mib:.2f}"
            )
    if args.format == "json":
        measured = [step_seconds(args, it) for it in range(2, args.steps + 1)]
        median = sorted(measured)[len(measured) // 2]
        summary = {"tokens_per_s": tokens / median, "peak_mem_bytes": int(peak_mib * 2**20)}
        out.append(json.dumps(summary))
    return out


def emit(line: str) -> None:
    """Print a whole line in one write, as Python's logging does: the ranks of a node share
    one log file and are unbuffered (``PYTHONUNBUFFERED``), and ``print`` writes the text and
    its newline apart, so another rank's line could land between them and join two lines."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.spawn:
        return spawn(argv, args)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.record_argv:
        with open(f"argv_rank{rank}.json", "w") as handle:
            json.dump(argv, handle)
    if args.tp * args.pp * args.dp != world:
        print(f"AssertionError: tp*pp*dp != world size {world}", file=sys.stderr)
        return 2
    if args.mbs * args.gas * args.dp != args.global_batch:
        print("AssertionError: mbs*gas*dp != global batch size", file=sys.stderr)
        return 2
    emit(f"> rank {rank} of {world} initialised")
    if args.oom_above is not None and args.mbs / args.tp > args.oom_above:
        if rank != (args.oom_rank % world):
            hang()  # a peer waiting for the failed rank in a collective
        print(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
            "has a total capacity of 79.10 GiB of which 1.20 GiB is free.",
            file=sys.stderr,
            flush=True,
        )
        if args.hang_after_oom:
            hang()
        return 1
    if args.hang:
        hang()
    if args.exit_code:
        print("Traceback (most recent call last):\nRuntimeError: boom", file=sys.stderr)
        return args.exit_code
    if args.print_rank == "all" or rank == world - 1:
        for line in lines(args, rank, world):
            emit(line)
    elif args.format.startswith("megatron"):
        emit(lines(args, rank, world)[1])  # report_memory from every stage
    if args.hang_after_steps:
        hang()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
