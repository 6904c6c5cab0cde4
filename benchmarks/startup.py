"""Start-up cost of the command line: ``parsearch --help`` and an MPI worker's import path.

Every rank of an MPI job runs ``parsearch run ... --backend mpi``; ranks other than 0 divert to
the worker loop, and what they import before that (the command line, the ``run`` command, the
mpi backend; mpi4py itself excluded) is paid on every rank of every job. Each figure is the
best of ``--repeat`` runs of a fresh interpreter, beside ``python -c pass`` measured in the
same run. The heavy packages each path loaded are listed (there should be none).

Usage: ``.venv/bin/python benchmarks/startup.py [--repeat 5] [--source DIR]``; ``--source``
times another checkout's ``parsearch`` package (say the commit before a change) instead.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HEAVY = ("numpy", "pandas", "torch", "mpi4py", "ray", "deephyper", "yaml")

PATHS = {
    "python -c pass": "pass",
    "parsearch --help": (
        "import sys; sys.argv = ['parsearch', '--help']\n"
        "from parsearch.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass"
    ),
    "mpi worker import path": (
        "from parsearch.cli import build_parser\n"
        "parser = build_parser(*['run'][: build_parser.__code__.co_argcount])  # older: no arg\n"
        "parser.parse_args(['run', 's.yaml', '--store', 's.db', '--backend', 'mpi'])\n"
        "import parsearch.backends.mpi"
    ),
    "import parsearch": "import parsearch",
}


def best_of(code: str, repeat: int, source: str) -> float:
    """Seconds of the fastest of ``repeat`` fresh interpreters running ``code`` in ``source``
    (``python -c`` puts the working directory first on the path)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], cwd=source, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return min(times)


def heavy_loaded(code: str, source: str) -> list[str]:
    """Which of :data:`HEAVY` running ``code`` imported."""
    probe = (
        f"import contextlib, io, json, sys\nwith contextlib.redirect_stdout(io.StringIO()):\n"
        f"    exec({code!r})\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=source, check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--source", help="a checkout whose parsearch package to time instead")
    args = parser.parse_args()
    source = os.path.abspath(args.source or Path(__file__).resolve().parent.parent)
    baseline = best_of(PATHS["python -c pass"], args.repeat, source)
    print(f"{'path':<26} {'best s':>7} {'x pass':>7} {'minus pass s':>13}  heavy modules loaded")
    for name, code in PATHS.items():
        seconds = best_of(code, args.repeat, source) if name != "python -c pass" else baseline
        heavy = ", ".join(heavy_loaded(code, source)) or "-"
        print(
            f"{name:<26} {seconds:7.3f} {seconds / baseline:7.2f} {seconds - baseline:13.3f}  "
            f"{heavy}"
        )


if __name__ == "__main__":
    main()
