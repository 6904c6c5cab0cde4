"""``parsearch probe SPACE.yaml --out machine.yaml``: measure the allocation for the estimate.

The probe runs as one trial through the same backend and node agent as the campaign's
trials, its ranks running :mod:`parsearch.probe.rank` instead of a trainer; the timings
come back in the trial's result and are fitted here into a machine profile.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import yaml

from parsearch.backends import BACKENDS, create_backend, parse_options, serve_if_worker
from parsearch.commands import COMMANDS
from parsearch.commands._arguments import positive_int
from parsearch.errors import BackendError, ParsearchError
from parsearch.estimate.profile import profile_to_dict
from parsearch.probe.fit import fit_profile, tp_in_situ
from parsearch.probe.plan import ProbePlan, plan_for, probe_spec
from parsearch.space import load_space
from parsearch.tempdirs import owned_tempdir

DEFAULT_TIMEOUT_S = 600.0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "probe",
        help=COMMANDS["probe"],
        description="Run a short microbenchmark on the allocation, through the same backend "
        "and node agent as trials: a transformer layer's work at the shapes the space's "
        "layouts use, collectives over their TP/DP groups at several message sizes (an "
        "alpha-beta fit each), pipeline transfers and the memory baseline. Writes a machine "
        "profile for `estimate: {machine: FILE}`, `run --machine` or `plan --machine`.",
    )
    parser.add_argument("space", help="search-space YAML file")
    parser.add_argument("--out", required=True, metavar="MACHINE.yaml", help="profile to write")
    parser.add_argument(
        "--backend", choices=[b for b in BACKENDS if b != "simulate"], default="local"
    )
    parser.add_argument(
        "--backend-opt", action="append", default=[], metavar="KEY=VALUE", help="as for `run`"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"give up on the probe after SECONDS (default {DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--rounds",
        type=positive_int,
        default=ProbePlan.rounds,
        help=f"times each layer shape is measured, the median kept (default {ProbePlan.rounds}; "
        "more on a noisy shared machine)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if serve_if_worker(args.backend):
        return 0
    space = load_space(args.space)
    try:
        plan = dataclasses.replace(plan_for(space), rounds=args.rounds)
    except ValueError as error:
        raise ParsearchError(f"{args.space}: {error}") from None
    options = parse_options(args.backend_opt)
    # Owned: a probe killed with kill -9 leaves it to the next parsearch to remove.
    with _owned_scratch("probe") as scratch:
        if args.backend == "local":
            options.setdefault("workdir", scratch)  # to follow rank 0's progress lines
        backend = create_backend(args.backend, space, slots=1, options=options)
        trial_id = f"probe-{os.getpid()}"
        spec = probe_spec(space, plan, trial_id=trial_id, timeout_s=args.timeout)
        say = (
            (lambda text: None)
            if args.quiet
            else (lambda text: print(text, file=sys.stderr, flush=True))
        )
        say(
            f"probing {space.allocation.world_size} ranks on {args.backend}: a layer at "
            f"{len(plan.gemm_shapes)} shapes, {len(plan.patterns)} group patterns, "
            f"{'send/recv, ' if plan.p2p_sizes else ''}memory baseline"
        )
        began = time.monotonic()
        try:
            backend.submit(spec)
            log = Path(options.get("workdir", scratch)) / trial_id / "rank0.log"
            seen = 0
            while True:
                finished = backend.poll(1.0)
                seen = _show_progress(log, seen, began, say) if args.backend == "local" else seen
                if finished:
                    result = finished[0].result
                    break
        finally:
            backend.close()
    if not result.ok:
        raise BackendError(
            f"the probe failed ({result.status.value}): {result.error}\n{result.log_tail}"
        )
    measured = result.metrics["probe"]
    name = f"machine-{measured['host']}"
    profile = fit_profile(space, measured, name)
    data = profile_to_dict(profile, measured=_how(args, space, measured))
    for entry, raw in zip(data["gemm"], measured["gemm"], strict=True):
        entry.update(
            {k: float(f"{raw[k]:.4g}") for k in ("seconds", "with_tp_seconds") if k in raw}
        )
    raw_entries = tp_in_situ(space, measured["gemm"]) + measured["collectives"]
    for entry in data["collectives"]:
        key = (entry["kind"], entry["op"], entry["group_size"])
        raw = next(r for r in raw_entries if (r["kind"], r["op"], r["group_size"]) == key)
        entry["sizes"] = raw["sizes"]
        entry["times"] = [float(f"{t:.4g}") for t in raw["times"]]
        if raw.get("in_situ"):
            entry["measured"] = "in situ: the trainer's TP layer minus a shard without comms, /4"
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    took = time.monotonic() - began
    header = f"# Machine profile written by `parsearch probe {args.space}` in {took:.0f} s.\n"
    out.write_text(header + yaml.safe_dump(data, sort_keys=False))
    say(f"wrote {out} ({measured['seconds']:.1f} s of measurement)")
    _summary(profile, say)
    return 0


def _how(args: argparse.Namespace, space, measured: dict) -> dict:
    return {
        "by": "parsearch probe",
        "space": str(args.space),
        "backend": args.backend,
        "host": measured["host"],
        "at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": measured["device"],
        "communication": measured["communication"],
        "torch": measured["torch"],
        "threads_per_rank": measured["threads"],
        "seconds": round(measured["seconds"], 2),
        "gemm": "one TP rank's shard of a layer, forward + backward, all ranks at once; "
        "efficiency = the estimate's FLOPs / time / allocation peak",
        "collectives": "every group of the pattern at once; slowest rank's mean; alpha-beta "
        "fit on relative error over the sizes (bytes of the full buffer)",
        "memory": "besides the trainer's measured tensors: "
        + (
            "none on CPU (tensor peaks); rss_bytes is the process's"
            if "rss_bytes" in measured["memory"]
            else "device memory in use outside torch's allocator"
        ),
        "rss_bytes": measured["memory"].get("rss_bytes"),
    }


def _show_progress(log: Path, seen: int, began: float, say) -> int:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return seen
    for line in lines[seen:]:
        if line.startswith("probe: "):
            say(f"  [{time.monotonic() - began:5.1f} s] {line[7:]}")
    return len(lines)


def _summary(profile, say) -> None:
    for point in profile.gemm:
        say(f"  layer tp={point.tp} mbs={point.mbs}: {point.efficiency:.1%} of peak")
    for fit in profile.collectives:
        say(
            f"  {fit.op:<14} x{fit.group_size} {fit.kind:<16} latency {fit.alpha_s * 1e6:8.1f} us, "
            f"{1 / fit.beta_s_per_byte / 1e9:7.3f} GB/s"
        )


@contextlib.contextmanager
def _owned_scratch(kind: str) -> Iterator[str]:
    """A temporary directory with an owner marker (:mod:`parsearch.tempdirs`), removed at
    the end; one left by a killed probe goes when the next parsearch makes one."""
    path = owned_tempdir(kind)
    try:
        yield str(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)
