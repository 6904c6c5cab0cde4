"""How long a trial's processes outlive a ``kill -9`` of the driver (docs/guide/store.md's bound).

Starts a local campaign of the built-in trainer on ``search_spaces/tiny-cpu.yaml`` and sends
the driver SIGKILL, then polls /proc every millisecond until no process the driver had
started (the fork server, its ranks, anything below them) is left alive; a zombie counts as
gone. Two moments of the kill:

* in a trial (default): once a trial's four ranks run, a random 0.1-1 s into it;
* ``--start-up S``: a random moment 0-S s after the driver started, whatever runs then (the
  driver's own imports, the fork server importing torch, the first trial's ranks). Every
  process is found by a marker in its environment, which the driver hands down to all it
  starts, so one forked an instant before the kill counts too. The driver's stderr is also
  searched for tracebacks (a fork server that outlived the driver printed one there).

Repeats ``--kills`` times and prints each latency and their distribution.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/kill_latency.py --kills 10
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/kill_latency.py --kills 20 --start-up 4
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from parsearch.launch.guard import descendants

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "search_spaces" / "tiny-cpu.yaml"
RANKS = 4  # tiny-cpu: one node of four CPU ranks
MARKER_VAR = "PARSEARCH_KILL_LATENCY_MARK"


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return state != b"Z"


def marked(marker: str, exclude: int) -> list[int]:
    """Live processes but ``exclude`` whose environment holds ``MARKER_VAR=marker``: what a
    driver started with it started, forks included (they share the environment block)."""
    needle = f"{MARKER_VAR}={marker}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == exclude:
            continue
        try:
            environ = Path(f"/proc/{name}/environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0") and alive(int(name)):
            found.append(int(name))
    return found


def start_driver(workdir: Path, marker: str) -> tuple[subprocess.Popen, Path]:
    store = workdir / f"s{time.monotonic_ns()}.db"
    log = workdir / f"{store.stem}.log"
    command = [sys.executable, "-m", "parsearch", "run", str(TINY), "--store", str(store)]
    with log.open("wb") as stderr:
        driver = subprocess.Popen(
            [*command, "--budget", "2", "--quiet"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env={**os.environ, "OMP_NUM_THREADS": "1", MARKER_VAR: marker},
        )
    return driver, log


def one_kill(workdir: Path, rng: random.Random) -> tuple[float, int]:
    """Seconds from SIGKILL of the driver until none of its processes is alive, and how
    many there were."""
    driver, _ = start_driver(workdir, uuid.uuid4().hex)
    try:
        deadline = time.monotonic() + 120
        # The fork server plus a trial's ranks: a trial is running.
        while len(descendants(driver.pid)) < RANKS + 1:
            if driver.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the driver ended or started no trial within 120 s")
            time.sleep(0.01)
        time.sleep(rng.uniform(0.1, 1.0))  # somewhere in the trial
        victims = set(descendants(driver.pid))
        killed = time.monotonic()
        driver.kill()
        while any(alive(pid) for pid in victims):
            time.sleep(0.001)
        return time.monotonic() - killed, len(victims)
    finally:
        driver.kill()
        driver.wait()


def one_start_up_kill(workdir: Path, at_s: float) -> tuple[float, int, bool]:
    """Kill the driver ``at_s`` after starting it: seconds until none of its processes is
    alive, how many there were just before, and whether its stderr shows a traceback (a process that
    outlived the driver printed it there before it ended)."""
    marker = uuid.uuid4().hex
    driver, log = start_driver(workdir, marker)
    try:
        time.sleep(at_s)
        count = len(marked(marker, driver.pid))
        killed = time.monotonic()
        driver.kill()
        while marked(marker, driver.pid):
            time.sleep(0.001)
        latency = time.monotonic() - killed
    finally:
        driver.kill()
        driver.wait()
    return latency, count, b"Traceback" in log.read_bytes()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--start-up",
        type=float,
        metavar="S",
        help="kill at a random moment 0-S s after the driver starts, not in a trial",
    )
    args = parser.parse_args()
    rng = random.Random(args.seed)
    latencies = []
    tracebacks = 0
    with tempfile.TemporaryDirectory() as workdir:
        for i in range(args.kills):
            if args.start_up is None:
                latency, count = one_kill(Path(workdir), rng)
                moment = ""
            else:
                at_s = rng.uniform(0.0, args.start_up)
                latency, count, traceback = one_start_up_kill(Path(workdir), at_s)
                tracebacks += traceback
                moment = f" at {at_s:.2f} s" + (", traceback in its log" if traceback else "")
            latencies.append(latency)
            print(
                f"kill {i + 1}{moment}: {count} processes gone "
                f"{latency * 1000:.0f} ms after SIGKILL",
                flush=True,
            )
    latencies.sort()
    print(
        f"{len(latencies)} kills: median {statistics.median(latencies) * 1000:.0f} ms, "
        f"min {latencies[0] * 1000:.0f} ms, max {latencies[-1] * 1000:.0f} ms, "
        f"over 1 s: {sum(latency > 1.0 for latency in latencies)}"
        + (f", tracebacks: {tracebacks}" if args.start_up is not None else "")
    )


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    main()
