"""What the guard (parsearch/launch/guard.py) adds to a spawned rank's start and end.

Every command-trainer rank (and every spawned rank on the mpi and ray backends) starts
through the guard, which now stays resident as the command's supervisor (child subreaper)
and, when the command ends, looks through /proc for anything it left behind. This measures
the wall time of a trivial command (``/bin/true``) and a Python command started directly and
through the guard, and the guard's clean-up of a launcher that leaves two daemonised
workers behind, against killing them by hand. Prints medians over ``--runs`` runs.

    .venv/bin/python benchmarks/guard_overhead.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GUARD = ROOT / "parsearch" / "backends" / "guard.py"
LAUNCHER = ROOT / "tests" / "daemonizing_launcher.py"


def wall(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=False, stdout=subprocess.DEVNULL, start_new_session=True)
    return time.perf_counter() - start


def guarded(command: list[str]) -> list[str]:
    return [sys.executable, "-S", str(GUARD), str(os.getpid()), *command]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    cases = {
        "/bin/true": ["/bin/true"],
        "python -c pass": [sys.executable, "-c", "pass"],
    }
    for name, command in cases.items():
        direct = statistics.median(wall(command) for _ in range(args.runs))
        through = statistics.median(wall(guarded(command)) for _ in range(args.runs))
        print(
            f"{name:<16} direct {direct * 1e3:7.1f} ms  guarded {through * 1e3:7.1f} ms  "
            f"added {(through - direct) * 1e3:6.1f} ms  ratio {through / direct:5.2f}"
        )
    with tempfile.TemporaryDirectory() as tmp:
        times = []
        for run in range(max(3, args.runs // 4)):
            pid_dir = Path(tmp) / str(run)
            command = [sys.executable, str(LAUNCHER), "--pid-dir", str(pid_dir), "--double-fork"]
            times.append(wall(guarded(command)))
            left = [int(p.read_text()) for p in pid_dir.glob("worker*")]
            assert not any(Path(f"/proc/{pid}").exists() for pid in left), "a worker survived"
        plain = statistics.median(
            wall([sys.executable, str(LAUNCHER), "--pid-dir", str(Path(tmp) / f"p{i}"),
                  "--double-fork"])
            for i in range(max(3, args.runs // 4))
        )  # fmt: skip
        for pid_file in Path(tmp).glob("p*/worker*"):  # what nothing cleans up unguarded
            os.kill(int(pid_file.read_text()), 9)
        print(
            f"launcher leaving 2 daemons: unguarded {plain * 1e3:.0f} ms (daemons left running), "
            f"guarded {statistics.median(times) * 1e3:.0f} ms (daemons ended)"
        )


if __name__ == "__main__":
    main()
