"""Many drivers writing one store at once, as on a centre's shared store (issue 37, item 2).

``--drivers`` campaigns (GPT-22B on Frontier, the simulate backend, the random strategy:
what is measured is the store, not the search) are driven at once by as many ``parsearch
run`` processes into one store, while ``--readers`` processes read it without pause (the
campaign list, each campaign's counts and best, the best known layout across campaigns) and
``parsearch serve`` over the same store is polled. With ``--kill K``, K drivers chosen at
random are killed with SIGKILL, each at a random moment, and resumed once
the others have finished. Then every campaign must hold exactly its budget of trials,
numbered without a gap, one per layout, every one finished, and every trial a killed
driver had recorded before its kill must be there unchanged. Prints trials recorded per
second (all drivers together, the kills' resumes included) and the readers' reads.

    .venv/bin/python benchmarks/many_drivers.py [--drivers 8] [--trials 200] [--kill 3]
        [--readers 2] [--store PATH|URL] [--trial-delay 0.1] [--seed 0]

``tests/test_many_drivers.py`` runs it at 8 x 200 with 3 kills and asserts what it checks.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
SPACE = ROOT / "search_spaces" / "gpt-22b-frontier.yaml"
# Each simulated trial "runs" this long on each of a driver's 2 slots, so a driver of 200
# trials runs at least 10 s and a kill timed within KILL_WINDOW_S of its start lands before
# it finishes however loaded the machine is (kills timed by counting its trials in the store
# were missed under load: a driver finished before the counting read saw its threshold).
TRIAL_DELAY_S = 0.1
KILL_WINDOW_S = (2.0, 7.0)
READER = """
import sys, time
from pathlib import Path
from parsearch.best_known import Comparable, best_known
from parsearch.errors import ParsearchError
from parsearch.space import load_space
from parsearch.store import open_store
store, stop, space = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
wanted = Comparable.of(load_space(space))
reads = errors = 0
while not stop.exists():
    try:
        with open_store(store, readonly=True) as opened:
            for campaign in opened.list_campaigns():
                opened.counts(campaign.id)
                opened.best(campaign.id)
            best_known(opened, wanted)
        reads += 1
    except ParsearchError as error:
        errors += 1
        print(f"read failed: {error}", file=sys.stderr)
    time.sleep(0.01)
print(f"{reads} {errors}")
"""


@dataclass
class Outcome:
    """What the run saw: problems (empty when nothing was lost or duplicated) and figures."""

    problems: list[str] = field(default_factory=list)
    trials: int = 0
    seconds: float = 0.0
    reads: int = 0
    read_errors: int = 0
    http_polls: int = 0
    http_errors: list[str] = field(default_factory=list)
    killed: list[str] = field(default_factory=list)

    @property
    def trials_per_s(self) -> float:
        return self.trials / self.seconds if self.seconds else 0.0


def spaces(folder: Path, drivers: int) -> list[Path]:
    """One space file per driver: GPT-22B on Frontier, its campaign named ``d<i>``."""
    data = yaml.safe_load(SPACE.read_text())
    paths = []
    for index in range(drivers):
        data["name"] = f"d{index}"
        path = folder / f"d{index}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        paths.append(path)
    return paths


def _parsearch(*args: str) -> list[str]:
    return [sys.executable, "-m", "parsearch", *args]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def drive(store: str, space: Path, trials: int, seed: int, delay_s: float) -> subprocess.Popen:
    return subprocess.Popen(
        _parsearch("run", str(space), "--store", store, "--backend", "simulate",
                   "--strategy", "random", "--budget", str(trials), "--seed", str(seed),
                   "--slots", "2", "--quiet", "--no-auto-warm-start",
                   "--backend-opt", f"delay={delay_s}"),
        cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def finished_trials(store: str, name: str) -> dict[int, tuple]:
    """``name``'s finished trials: number -> (key, state, objective, finished_at); a read
    the writers keep busy is tried again, for up to a minute."""
    from parsearch.errors import ParsearchError
    from parsearch.store import open_store

    deadline = time.monotonic() + 60
    while True:
        try:
            with open_store(store, readonly=True) as opened:
                campaign = next((c for c in opened.list_campaigns() if c.name == name), None)
                if campaign is None:
                    return {}
                return {
                    t.number: (t.key, t.state.value, t.objective, t.finished_at)
                    for t in opened.trials(campaign.id)
                    if t.finished_at is not None
                }
        except ParsearchError as error:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{store}: no read of campaign {name} in 60 s") from error
            time.sleep(0.2)


def check(store: str, names: list[str], trials: int, before_kill: dict[str, dict]) -> list[str]:
    """What was lost, duplicated or left unfinished, campaign by campaign."""
    from parsearch.store import CampaignStatus, open_store

    problems = []
    with open_store(store, readonly=True) as opened:
        campaigns = {c.name: c for c in opened.list_campaigns()}
        for name in names:
            if name not in campaigns:
                problems.append(f"{name}: no campaign")
                continue
            records = opened.trials(campaigns[name].id)
            numbers = [t.number for t in records]
            keys = [t.key for t in records]
            unfinished = [f"#{t.number} {t.state.value}" for t in records if t.finished_at is None]
            if numbers != list(range(trials)):
                problems.append(f"{name}: {len(numbers)} trials, numbers {_span(numbers)}")
            if len(set(keys)) != len(keys):
                problems.append(f"{name}: {len(keys) - len(set(keys))} layouts recorded twice")
            if unfinished:
                problems.append(f"{name}: unfinished {unfinished[:5]}")
            if campaigns[name].status is not CampaignStatus.FINISHED:
                problems.append(f"{name}: campaign {campaigns[name].status.value}")
            now = {t.number: (t.key, t.state.value, t.objective, t.finished_at) for t in records}
            for number, recorded in before_kill.get(name, {}).items():
                if now.get(number) != recorded:
                    problems.append(f"{name}: #{number} was {recorded}, now {now.get(number)}")
    return problems


def _span(numbers: list[int]) -> str:
    return f"{min(numbers)}..{max(numbers)}" if numbers else "none"


def _poll_serve(store: str, stop: threading.Event, outcome: Outcome) -> None:
    import httpx
    import serve_load

    with serve_load.serving(store, serve_load.free_port()) as (base, _):
        while not stop.is_set():
            for path in ("/api/campaigns", "/api/campaigns/d0/status"):
                response = httpx.get(f"{base}{path}", timeout=60)
                outcome.http_polls += 1
                if response.status_code not in (200, 404):  # 404: d0 not created yet
                    outcome.http_errors.append(f"{path}: {response.status_code} {response.text}")
            time.sleep(0.05)


def run(
    store: str,
    folder: Path,
    *,
    drivers: int = 8,
    trials: int = 200,
    kills: int = 3,
    readers: int = 2,
    seed: int = 0,
    serve: bool = True,
    trial_delay_s: float = TRIAL_DELAY_S,
) -> Outcome:
    """The whole scenario; ``store`` is a path (or a URL a store backend opens)."""
    from parsearch.store import open_store

    chooser = random.Random(seed)
    outcome = Outcome()
    paths = spaces(folder, drivers)
    names = [path.stem for path in paths]
    open_store(store).close()  # created before the readers and the server open it
    stop_file = folder / "stop-readers"
    command = [sys.executable, "-c", READER, store, str(stop_file), str(paths[0])]
    reader_procs = [
        subprocess.Popen(
            command, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(readers)
    ]
    stop_polling = threading.Event()
    poller = threading.Thread(target=_poll_serve, args=(store, stop_polling, outcome))
    if serve:
        poller.start()
    began = time.monotonic()
    procs = {
        name: drive(store, path, trials, i, trial_delay_s)
        for i, (name, path) in enumerate(zip(names, paths, strict=True))
    }
    victims = {
        name: began + chooser.uniform(*KILL_WINDOW_S) for name in chooser.sample(names, kills)
    }
    before_kill: dict[str, dict] = {}
    failures = []
    try:
        while victims:
            for name, when in list(victims.items()):
                if procs[name].poll() is not None:
                    failures.append(f"{name}: finished before its kill at {when - began:.1f} s")
                    del victims[name]
                elif time.monotonic() >= when:
                    procs[name].send_signal(signal.SIGKILL)
                    procs[name].wait(60)
                    before_kill[name] = finished_trials(store, name)
                    outcome.killed.append(f"{name} after {len(before_kill[name])} trials")
                    del victims[name]
            time.sleep(0.02)
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=900)
            if name not in before_kill and proc.returncode != 0:
                failures.append(f"{name}: exit {proc.returncode}: {err[-1000:]}")
        for name in before_kill:  # the killed drivers' campaigns, continued to their budget
            done = subprocess.run(
                # run --resume: it also starts a campaign the kill came before
                _parsearch("run", str(folder / f"{name}.yaml"), "--store", store, "--resume",
                           "--backend", "simulate", "--quiet", "--no-auto-warm-start",
                           "--strategy", "random", "--budget", str(trials)),
                cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900,
            )  # fmt: skip
            if done.returncode != 0:
                failures.append(f"{name}: resume exit {done.returncode}: {done.stderr[-1000:]}")
        outcome.seconds = time.monotonic() - began
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        stop_file.touch()
        for reader in reader_procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                out, err = reader.communicate(timeout=120)
                reads, errors = (int(v) for v in out.split() or (0, 0))
                outcome.reads += reads
                outcome.read_errors += errors
                if errors:
                    failures.append(f"reader: {err[-500:]}")
        stop_polling.set()
        if serve:
            poller.join(120)
    outcome.trials = drivers * trials
    outcome.problems = failures + check(store, names, trials, before_kill)
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drivers", type=int, default=8)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--kill", type=int, default=3)
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--store", help="a store path or URL (default: a new SQLite file)")
    parser.add_argument(
        "--trial-delay", type=float, default=TRIAL_DELAY_S, metavar="S",
        help=f"seconds each simulated trial takes (default {TRIAL_DELAY_S}); 0 measures the "
        "store's own rate, where a driver may finish before its kill under load",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="which drivers are killed, when")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        store = args.store or str(Path(tmp) / "shared.db")
        outcome = run(
            store, Path(tmp), drivers=args.drivers, trials=args.trials, kills=args.kill,
            readers=args.readers, seed=args.seed, trial_delay_s=args.trial_delay,
        )  # fmt: skip
    print(
        f"{args.drivers} drivers x {args.trials} trials of {args.trial_delay} s into "
        f"{args.store or 'one SQLite file'}"
        f" ({args.kill} killed: {', '.join(outcome.killed) or 'none'}): "
        f"{outcome.trials_per_s:.1f} trials recorded/s ({outcome.seconds:.1f} s); "
        f"{outcome.reads} reads by {args.readers} readers, {outcome.read_errors} failed; "
        f"{outcome.http_polls} polls of serve, {len(outcome.http_errors)} failed"
    )
    for problem in outcome.problems + outcome.http_errors:
        print(f"  PROBLEM {problem}")
    return 1 if outcome.problems or outcome.http_errors else 0


if __name__ == "__main__":
    sys.exit(main())
