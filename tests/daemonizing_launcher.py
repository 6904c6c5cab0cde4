"""A launcher that hides its workers the ways real ones do, for the clean-up tests.

It starts ``--workers`` processes that each leave its process group and session
(``setsid``, as torchrun's workers do) and, with ``--double-fork``, also daemonise (fork,
``setsid``, fork again, parent exits: the worker is re-parented away from the launcher).
Every worker writes its pid into ``--pid-dir`` (as ``worker<i>.<launcher pid>``) and then
sleeps. The launcher then either sleeps too (``--hang``) or prints one JSON metric line and
exits with ``--exit-code``, leaving its workers behind.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def worker(pid_dir: Path, name: str) -> None:
    (pid_dir / f".{name}").write_text(str(os.getpid()))
    (pid_dir / f".{name}").rename(pid_dir / name)
    while True:
        time.sleep(60)


def start_worker(pid_dir: Path, name: str, double_fork: bool) -> None:
    if os.fork() != 0:
        return
    os.setsid()
    if double_fork and os.fork() != 0:
        os._exit(0)
    try:
        worker(pid_dir, name)
    finally:
        os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pid-dir", type=Path, required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--double-fork", action="store_true")
    parser.add_argument("--hang", action="store_true")
    parser.add_argument("--exit-code", type=int, default=0)
    args = parser.parse_args()
    args.pid_dir.mkdir(parents=True, exist_ok=True)
    for i in range(args.workers):
        start_worker(args.pid_dir, f"worker{i}.{os.getpid()}", args.double_fork)
    while len(list(args.pid_dir.glob(f"worker*.{os.getpid()}"))) < args.workers:
        time.sleep(0.01)
    print("workers started", flush=True)
    if args.hang:
        while True:
            time.sleep(60)
    print(json.dumps({"tokens_per_s": 1000.0, "step_time_s": 0.5}), flush=True)
    sys.exit(args.exit_code)


if __name__ == "__main__":
    main()
