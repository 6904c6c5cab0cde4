"""Dispatch overhead of the local, mpi and ray backends on this machine; prints the figures.

* **Dispatch latency**: from ``submit()`` to the last rank of the trial running its first
  line (so it includes starting ``python -S``, ~10-20 ms here); **teardown**: from the last
  rank's exit to the trial's result coming back from ``poll()``. Trials of one and two
  nodes, one at a time, of a rank program that sleeps 0.3 s (timestamps written by the ranks
  themselves, wall clock).
* **Idle mpi worker CPU**: CPU time of the 4 workers of an ``mpiexec -n 5`` job over 3 s
  without a trial, next to a rank blocked in MPICH's ``recv`` (the ~65% of a core to avoid);
  also the driver's own CPU while it waits in ``poll()`` for a running trial.
* **Idle time of a 4-node mpi allocation** over a 40-trial campaign run as a job script
  would (``mpiexec -n 5 parsearch run ... --backend mpi``, DeepHyper's CBO proposing): short
  real trials (rank processes sleeping 1.5-2.1 s, then 6-8.4 s; not the torch trainer, so
  overheads weigh as much as they can); idle = 1 - (sum of rank lifetimes) / (4 x span from the
  first rank start to the last rank exit), and the part of it between trials on a node (the
  dispatch gap, without the start-up stagger and the tail when the budget runs out).

Usage: ``.venv/bin/python benchmarks/dispatch.py [--trials 8] [--budget 40] [--trial-s 1.5 6]``
(~3 minutes).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from parsearch.backends import create_backend
from parsearch.config import ParallelLayout
from parsearch.space import space_from_dict
from parsearch.store import open_store
from parsearch.trial import TrialSpec

BIN = Path(sys.executable).parent
RANK = """
import json, os, sys, time
start = time.time()
mbs, gas, base = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
seconds = base * (1 + 0.1 * ((mbs * gas) % 5))
time.sleep(seconds)
print(json.dumps({"tokens_per_s": mbs * gas / seconds}), flush=True)
with open(f"t-{os.environ['RANK']}.json", "w") as out:
    json.dump({"start": start, "exit": time.time()}, out)
"""


def space_data(script: Path, nodes: int, base_s: float) -> dict:
    return {
        "name": f"dispatch-{nodes}",
        "model": {"num_layers": 2, "hidden_size": 8, "num_heads": 2, "vocab_size": 16,
                  "seq_length": 4},
        "allocation": {"nodes": nodes, "devices_per_node": 1, "device": "cpu",
                       "device_memory": "1GiB", "peak_tflops": 1},
        "search": {"tp": [1], "pp": [1], "mbs": {"range": [1, 8]}, "gas": {"range": [1, 8]}},
        "trainer": {
            "kind": "command",
            "command": ["{python}", "-S", "{script}", "{mbs}", "{gas}", "{base}"],
            "vars": {"python": sys.executable, "script": str(script), "base": base_s},
            "steps": 2,
            "warmup_steps": 1,
            "timeout": 60,
        },
    }  # fmt: skip


def rank_times(trial_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in trial_dir.glob("t-*.json")]


def measure(backend, space, workdir: Path, trials: int) -> dict[str, list[float]]:
    """Latency and teardown (s) of ``trials`` trials run one after another."""
    latency, teardown = [], []
    nodes = space.allocation.nodes
    for i in range(trials):
        layout = ParallelLayout(tp=1, pp=1, dp=nodes, mbs=1 + i % 8, gas=1)
        spec = TrialSpec(
            f"{backend.name}-{nodes}n-{i}", space.model, layout, space.allocation,
            space.trainer, timeout_s=60,
        )  # fmt: skip
        submitted = time.time()
        backend.submit(spec)
        done = []
        while not done:
            done = backend.poll(1.0)
        returned = time.time()
        assert done[0].result.ok, done[0].result
        times = rank_times(workdir / spec.trial_id)
        assert len(times) == nodes
        latency.append(max(t["start"] for t in times) - submitted)
        teardown.append(returned - max(t["exit"] for t in times))
    return {"latency": latency, "teardown": teardown}


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_share(pids: list[int], seconds: float) -> list[float]:
    before, began = [cpu_seconds(p) for p in pids], time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - began
    return [(cpu_seconds(p) - b) / elapsed for p, b in zip(pids, before, strict=True)]


# -- parts run under mpiexec ---------------------------------------------------------------


def mpi_part(out: Path, script: Path, trials: int) -> None:
    """Rank 0 of ``mpiexec -n 5``: idle CPU, then latency and teardown (one backend: the
    workers serve one per job)."""
    from parsearch.backends import mpi

    if mpi.serve_if_worker():
        return
    workdir = out.parent / "mpi-work"
    space = space_from_dict(space_data(script, 1, 0.3))
    backend = mpi.create(space, slots=None, options={"workdir": str(workdir)})
    try:
        pids = [w["pid"] for w in backend.describe()["workers"]]
        figures = {
            "idle_worker_cpu": cpu_share(pids, 3.0),
            "driver_poll_cpu": driver_poll_share(backend, space),
            "1": measure(backend, space, workdir, trials),
            "2": measure(backend, space_from_dict(space_data(script, 2, 0.3)), workdir, trials),
        }
    finally:
        backend.close()
    out.write_text(json.dumps(figures))


def driver_poll_share(backend, space) -> float:
    """The driver's CPU share while it waits in poll() for a 3 s trial."""
    layout = ParallelLayout(tp=1, pp=1, dp=1, mbs=8, gas=8)
    data = dict(space.trainer, vars=dict(space.trainer["vars"], base=3.0))
    spec = TrialSpec("poll-cpu", space.model, layout, space.allocation, data, timeout_s=60)
    backend.submit(spec)
    before, began = time.process_time(), time.monotonic()
    done = []
    while not done:
        done = backend.poll(1.0)
    return (time.process_time() - before) / (time.monotonic() - began)


def blocking_recv_part(out: Path) -> None:
    """``mpiexec -n 2``: rank 1 blocks in recv; rank 0 reads its CPU use, then frees it."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if comm.Get_rank() == 1:
        comm.send(os.getpid(), dest=0)
        comm.recv(source=0)
        return
    pid = comm.recv(source=1)
    out.write_text(json.dumps(cpu_share([pid], 3.0)))
    comm.send("done", dest=1)


# -- the benchmark -------------------------------------------------------------------------


def mpiexec(n: int, args: list[str], cwd: Path, timeout: float) -> None:
    subprocess.run(
        [str(BIN / "mpiexec"), "-n", str(n), *args], cwd=cwd, check=True, timeout=timeout,
        stdout=subprocess.DEVNULL,
    )  # fmt: skip


def campaign_idle(tmp: Path, script: Path, budget: int, base_s: float) -> dict:
    """Run a campaign as a job script would; how idle were its 4 nodes, and why."""
    tag = f"c{base_s:g}"
    space = tmp / f"{tag}.yaml"
    space.write_text(yaml.safe_dump(space_data(script, 1, base_s)))
    workdir, store_path = tmp / f"{tag}-work", tmp / f"{tag}.db"
    began = time.time()
    mpiexec(
        5,
        [str(BIN / "parsearch"), "run", str(space), "--store", str(store_path), "--backend",
         "mpi", "--backend-opt", f"workdir={workdir}", "--budget", str(budget), "--quiet"],
        tmp, timeout=1200,
    )  # fmt: skip
    wall = time.time() - began
    with open_store(store_path, readonly=True) as store:
        records = {r.number: r for r in store.trials(store.get_campaign().id)}
    by_node: dict[int, list[tuple[float, float, int]]] = {}
    for trial_dir in workdir.iterdir():
        (times,) = rank_times(trial_dir)
        worker = json.loads((trial_dir / "node0.json").read_text())["pid"]
        number = int(re.search(r"-(\d+)-a\d+$", trial_dir.name).group(1))  # the driver's ids
        by_node.setdefault(worker, []).append((times["start"], times["exit"], number))
    lives = [item for items in by_node.values() for item in items]
    first, last = min(s for s, _, _ in lives), max(e for _, e, _ in lives)
    gaps = []  # per node, between a rank's exit and the next trial's rank start
    for items in by_node.values():
        items.sort()
        for (_, end, before), (begin, _, after) in itertools.pairwise(items):
            recorded, running = records[before].finished_at, records[after].started_at
            gaps.append((begin - end, recorded - end, running - recorded, begin - running))
    active = sum(
        max(e for _, e, _ in items) - min(s for s, _, _ in items) for items in by_node.values()
    )
    return {
        "trials": len(lives),
        "wall_s": wall,
        "span_s": last - first,
        "idle": 1 - sum(e - s for s, e, _ in lives) / (len(by_node) * (last - first)),
        "between": sum(g[0] for g in gaps) / active,
        "startup_s": first - began,
        "gap": [statistics.mean(column) for column in zip(*gaps, strict=True)],
    }


def summary(name: str, values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    return f"{name} median {statistics.median(ms):6.1f} ms, max {ms[-1]:6.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8, help="trials per latency figure")
    parser.add_argument("--budget", type=int, default=40, help="trials of the mpi campaign")
    parser.add_argument(
        "--trial-s", type=float, nargs="+", default=[1.5, 6.0],
        help="shortest trial of each mpi campaign (the longest is 1.4x)",
    )  # fmt: skip
    parser.add_argument("--mpi-part", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--blocking-recv-part", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.blocking_recv_part:
        blocking_recv_part(args.blocking_recv_part)
    elif args.mpi_part:
        mpi_part(args.mpi_part, args.mpi_part.parent / "rank.py", args.trials)
    else:
        with tempfile.TemporaryDirectory(prefix="parsearch-dispatch-") as name:
            script = Path(name) / "rank.py"
            script.write_text(RANK)
            run(Path(name), script, args)


def run(tmp: Path, script: Path, args: argparse.Namespace) -> None:
    print(f"dispatch benchmark on {os.uname().nodename}, {os.cpu_count()} CPUs")
    print(
        f"\nlatency (submit -> last rank running) and teardown (last rank exit -> result), "
        f"{args.trials} trials each, one at a time:"
    )
    for name, options in (("local", {}), ("ray", {"num_cpus": "4"})):
        for nodes in (1, 2):
            space = space_from_dict(space_data(script, nodes, 0.3))
            workdir = tmp / f"{name}-work"
            backend = create_backend(
                name, space, slots=1, options={**options, "workdir": str(workdir)}
            )
            try:
                figures = measure(backend, space, workdir, args.trials)
            finally:
                backend.close()
            print(
                f"  {name:5} {nodes} node(s): {summary('latency', figures['latency'])}; "
                f"{summary('teardown', figures['teardown'])}"
            )
    part = tmp / "mpi.json"
    mpiexec(5, [sys.executable, __file__, "--mpi-part", str(part), "--trials",
                str(args.trials)], tmp, timeout=600)  # fmt: skip
    mpi = json.loads(part.read_text())
    for nodes in ("1", "2"):
        print(
            f"  mpi   {nodes} node(s): {summary('latency', mpi[nodes]['latency'])}; "
            f"{summary('teardown', mpi[nodes]['teardown'])}"
        )
    recv = tmp / "recv.json"
    mpiexec(2, [sys.executable, __file__, "--blocking-recv-part", str(recv)], tmp, timeout=120)
    print("\nCPU use (share of one core, over 3 s):")
    shares = ", ".join(f"{s:.1%}" for s in mpi["idle_worker_cpu"])
    print(f"  idle mpi workers (improbe + 10 ms sleeps): {shares}")
    print(f"  a rank blocked in MPICH's recv:            {json.loads(recv.read_text())[0]:.1%}")
    print(f"  the mpi driver waiting in poll():          {mpi['driver_poll_cpu']:.1%}")
    for base_s in args.trial_s:
        idle = campaign_idle(tmp, script, args.budget, base_s)
        gap, parts = idle["gap"][0], idle["gap"][1:]
        print(
            f"\n{idle['trials']}-trial mpi campaign on 4 nodes, trials of {base_s:g}-"
            f"{1.4 * base_s:g} s: idle {idle['idle']:.1%} of 4 x {idle['span_s']:.1f} s "
            f"(first rank start to last rank exit; target <= 5%); {idle['between']:.1%} "
            f"between trials (without the ramp-up and the last trials' tail)"
        )
        print(
            f"  a node waits {gap * 1000:.0f} ms between trials: {parts[0] * 1000:.0f} ms "
            f"rank exit -> result stored, {parts[1] * 1000:.0f} ms driver (tell, ask, submit, "
            f"store) -> next trial marked running, {parts[2] * 1000:.0f} ms -> its rank runs"
        )
        print(
            f"  whole run {idle['wall_s']:.1f} s, {idle['startup_s']:.1f} s of it before "
            f"the first rank (MPI, imports, store, DeepHyper)"
        )


if __name__ == "__main__":
    main()
