"""``python -m parsearch.trainers.builtin --spec trial.json [--out result.json]``: one rank.

Started once per rank by the node agent (or by ``mpiexec``/``srun``/``torchrun``); the rank's
place comes from the environment (see :mod:`parsearch.trainers.builtin.env`). Rank 0 writes the
:class:`~parsearch.result.TrialResult` as JSON to ``--out`` and prints it as the last line of
its output. A rank that fails exits non-zero with its traceback on stderr; the agent turns
that into an ``error`` or ``oom`` result.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from parsearch.trainers.builtin.env import RankEnv
from parsearch.trial import TrialSpec


def write_result(path: Path, data: dict) -> None:
    """Write atomically, so a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def process_age_s() -> float:
    """Seconds since this process was created (interpreter start-up included; Linux)."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m parsearch.trainers.builtin", description=__doc__
    )
    parser.add_argument("--spec", required=True, type=Path, help="TrialSpec JSON file")
    parser.add_argument("--out", type=Path, help="where rank 0 writes the result JSON")
    args = parser.parse_args(argv)
    faulthandler.enable()  # a crash in native code (a gloo thread, a kernel) leaves a stack
    spec = TrialSpec.from_json(args.spec.read_text())
    env = RankEnv.from_environ()
    phases = {"start_s": process_age_s()}
    began = time.perf_counter()

    from parsearch.trainers.builtin.trainer import (
        TrainerSettings,
        process_group,
        resolve_device,
        train,
    )

    phases["import_s"] = time.perf_counter() - began
    device = resolve_device(TrainerSettings.from_spec(spec), spec, env)
    with process_group(env, device, spec.timeout_s):
        phases["init_s"] = time.perf_counter() - began - phases["import_s"]
        result = train(spec, env, phases)
    if result is not None:
        data = result.to_dict()
        if args.out is not None:
            write_result(args.out, data)
        print(json.dumps(data), flush=True)
    return 0


def run_and_exit(argv: list[str] | None = None) -> None:
    """Run :func:`main` as :func:`exit_after` does."""
    exit_after(lambda: main(argv))


def exit_after(main: Callable[[], int]) -> NoReturn:
    """Run ``main`` and leave at once with its status, skipping the interpreter's teardown
    of torch (0.5-1 s a rank on a small CPU; after a failure, communicator destructors that
    could wait for peers stuck in a collective). Every rank program parsearch ships ends so."""
    code = 1
    try:
        code = main()
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
        if exit_.code is not None and not isinstance(exit_.code, int):
            print(exit_.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    run_and_exit()
