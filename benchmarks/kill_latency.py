"""How long a trial's processes outlive a ``kill -9`` of the driver (the README's bound).

Starts a local campaign of the built-in trainer on ``search_spaces/tiny-cpu.yaml``, waits
until a trial's four ranks run, lets the trial run a random part of a second, then sends the
driver SIGKILL and polls /proc every millisecond until no process the driver had started (the
fork server, its ranks, anything below them) is left alive; a zombie counts as gone. Repeats
``--kills`` times and prints each latency and their distribution.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/kill_latency.py --kills 10
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
from pathlib import Path

from parsearch.launch.guard import descendants

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "search_spaces" / "tiny-cpu.yaml"
RANKS = 4  # tiny-cpu: one node of four CPU ranks


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return state != b"Z"


def one_kill(workdir: Path, rng: random.Random) -> tuple[float, int]:
    """Seconds from SIGKILL of the driver until none of its processes is alive, and how
    many there were."""
    store = workdir / f"s{time.monotonic_ns()}.db"
    command = [sys.executable, "-m", "parsearch", "run", str(TINY), "--store", str(store)]
    driver = subprocess.Popen(
        [*command, "--budget", "2", "--quiet"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    latencies = []
    with tempfile.TemporaryDirectory() as workdir:
        for i in range(args.kills):
            latency, count = one_kill(Path(workdir), rng)
            latencies.append(latency)
            print(f"kill {i + 1}: {count} processes gone {latency * 1000:.0f} ms after SIGKILL")
    latencies.sort()
    print(
        f"{len(latencies)} kills: median {statistics.median(latencies) * 1000:.0f} ms, "
        f"min {latencies[0] * 1000:.0f} ms, max {latencies[-1] * 1000:.0f} ms"
    )


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    main()
