"""The cluster scripts in ``jobs/`` call the real CLI correctly, and drain before the limit.

Nobody runs Frontier from CI, so what can break silently is checked here: every
``parsearch ...`` invocation of a script is expanded by bash itself (with the batch system's
variables set to plausible values) and parsed by :func:`parsearch.cli.build_parser`; the
space a script names must load; the drain settings must fit the warning the scheduler gives.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from parsearch.cli import build_parser
from parsearch.errors import StoreError
from parsearch.space import load_space
from parsearch.store import open_store

ROOT = Path(__file__).parent.parent
JOBS = ROOT / "jobs"
# Script -> the backend its campaign uses.
SCRIPTS = {
    "frontier.sbatch": "mpi",
    "perlmutter.sbatch": "mpi",
    "polaris.pbs": "mpi",
    "ray-cluster.sh": "ray",
}
# What the batch system, the user's shell, or the script's own run-time commands provide.
ENVIRONMENT = {
    "SLURM_SUBMIT_DIR": str(ROOT),
    "SLURM_NNODES": "2",
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NODELIST": "nid[000001-000002]",
    "PBS_O_WORKDIR": str(ROOT),
    "PBS_JOBID": "4242.polaris-pbs-01",
    "PBS_NODEFILE": "/dev/null",
    "USER": "someone",
    "HOME": "/home/someone",
    "SCRATCH": "/pscratch/sd/s/someone",
    "TIMEOUT": "10500",
    "NNODES": "2",
    "HEAD_IP": "10.0.0.1",
    "RAY_ADDRESS": "10.0.0.1:6379",
}
# For scripts that require SPACE (no default): a shipped space stands in for the user's.
USER_SPACE = "search_spaces/llama3-8b-h200.yaml"
OPERATOR = re.compile(r"^[;&|<>()]+$")


def _logical_lines(text: str) -> list[str]:
    """Lines with backslash continuations joined and comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line for line in joined.splitlines() if not line.lstrip().startswith("#")]


def _invocations(text: str) -> list[list[str]]:
    """Each ``parsearch ...`` command's words, unexpanded, up to the first shell operator."""
    found = []
    for line in _logical_lines(text):
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)  # drops # comments
        lexer.whitespace_split = True
        words = list(lexer)
        if "parsearch" not in words:
            continue
        command = []
        for word in words[words.index("parsearch") + 1 :]:
            if OPERATOR.match(word):
                break
            command.append(word)
        found.append(command)
    return found


def _settings(text: str) -> list[str]:
    """The script's settings: ``NAME=${NAME:-default}`` lines (what a user may override from
    the environment) and the ``read -r -a EXTRA`` of extra options, in order."""
    pattern = re.compile(r"^(?:([A-Z_][A-Z0-9_]*)=\$\{\1[:}]|read -r -a [A-Z_]+ <<<)")
    return [line for line in _logical_lines(text) if pattern.match(line)]


def _expanded(name: str) -> list[list[str]]:
    """The script's parsearch invocations as bash would pass them (one list of words each)."""
    text = (JOBS / name).read_text()
    environment = dict(ENVIRONMENT)
    if "${SPACE:?" in text:
        environment["SPACE"] = USER_SPACE
    program = ["set -eu"]
    program += [f"export {key}={shlex.quote(value)}" for key, value in environment.items()]
    program += _settings(text)
    for words in _invocations(text):
        quoted = " ".join(f'"{word}"' for word in words)
        program.append(f"args=({quoted}); printf '%s\\0' \"${{args[@]}}\"; printf '\\1'")
    result = subprocess.run(
        ["bash", "-c", "\n".join(program)], capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    return [chunk.split("\0")[:-1] for chunk in result.stdout.split("\1")[:-1]]


def _parse(words: list[str]):
    parser = build_parser()
    available = parser._subparsers._group_actions[0].choices
    if words[0] not in available:
        pytest.skip(f"`parsearch {words[0]}` is not in this version's CLI yet")
    try:
        return parser.parse_args(words)
    except SystemExit:
        pytest.fail(f"the CLI rejects: parsearch {shlex.join(words)}")


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_parsearch_invocation_parses_with_the_real_cli(name):
    invocations = _expanded(name)
    commands = {words[0] for words in invocations}
    assert {"run", "status", "report"} <= commands, commands
    for words in invocations:
        args = _parse(words)
        if args.command == "run":
            assert args.resume, "every job of a chain starts or continues the campaign"
            assert args.backend == SCRIPTS[name], words
            assert args.store.endswith(".db")
            assert args.grace is not None  # the drain time is chosen, not left to chance
            load_space(ROOT / args.space)


TRAINER_SCRIPTS = sorted(p.name for p in JOBS.glob("*.sbatch") if p.name not in SCRIPTS)


@pytest.mark.parametrize("name", TRAINER_SCRIPTS)
def test_trainer_scripts_start_or_continue_their_campaign_over_mpi(name):
    (words,) = _expanded(name)
    args = _parse(words)
    assert args.command == "run" and args.resume and args.backend == "mpi", words
    assert load_space(ROOT / args.space).trainer["kind"] == "command"


@pytest.mark.parametrize("name", SCRIPTS)
def test_scripts_are_valid_bash(name):
    result = subprocess.run(["bash", "-n", str(JOBS / name)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    if shutil.which("shellcheck"):
        check = subprocess.run(
            ["shellcheck", "-s", "bash", str(JOBS / name)], capture_output=True, text=True
        )
        assert check.returncode == 0, check.stdout


def _default(text: str, variable: str) -> int:
    return int(re.search(rf"^{variable}=\$\{{{variable}:-(\d+)\}}", text, re.M).group(1))


@pytest.mark.parametrize("name", [name for name in SCRIPTS if "PBS" not in name.upper()])
def test_slurm_scripts_drain_within_the_warning(name):
    text = (JOBS / name).read_text()
    warning = re.search(r"^#SBATCH --signal=B:USR1@(\d+)", text, re.M)
    assert warning, "no --signal=B:USR1@N: the driver would be killed mid-trial"
    assert _default(text, "GRACE") < int(warning.group(1))
    # A batch shell runs its trap only while it waits on a background child.
    assert re.search(r"trap '[^']*kill -USR1 \"\$\{DRIVER\}\"' USR1", text)
    assert "DRIVER=$!" in text and 'wait "${DRIVER}"' in text


def test_polaris_drains_before_the_walltime_by_itself():
    text = (JOBS / "polaris.pbs").read_text()
    assert _default(text, "GRACE") < _default(text, "DRAIN_S")
    assert all("--timeout" in words for words in _expanded("polaris.pbs") if words[0] == "run")


def test_frontier_allocation_matches_its_space():
    text = (JOBS / "frontier.sbatch").read_text()
    nodes = int(re.search(r"^#SBATCH --nodes=(\d+)", text, re.M).group(1))
    run = next(words for words in _expanded("frontier.sbatch") if words[0] == "run")
    space = load_space(ROOT / run[1])
    assert space.allocation.nodes == nodes
    assert space.allocation.devices_per_node == 8  # one MI250X GCD per rank


# -- rehearsals: the real scripts under bash, the scheduler replaced by small shims ----------

SHIMS = {
    # srun and mpiexec: drop the launcher's options, run the command once, here (exec: a
    # signal sent to the "srun" reaches the command, as srun forwards it).
    "srun": 'while [[ $# -gt 0 && "$1" == -* ]]; do\n'
    '    case "$1" in -N|-n|-w) shift 2 ;; *) shift ;; esac\ndone\nexec "$@"',
    "mpiexec": 'while [[ $# -gt 0 && "$1" == -* ]]; do shift 2; done\nexec "$@"',
    "sbatch": 'echo "sbatch $*" >>"${SHIM_LOG}"',
    "qsub": 'echo "qsub $*" >>"${SHIM_LOG}"',
    "scontrol": 'echo "   Command=${SHIM_SCRIPT}"',
    "qstat": 'echo "    Resource_List.walltime = ${SHIM_WALLTIME}"',
    "module": "true",
}


@pytest.fixture
def cluster(tmp_path):
    """An environment in which a job script runs here: shims first on PATH, parsearch next."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in SHIMS.items():
        shim = bin_dir / name
        shim.write_text(f"#!/bin/bash\n{body}\n")
        shim.chmod(0o755)
    venv_bin = Path(sys.executable).parent
    return {
        "PATH": f"{bin_dir}:{venv_bin}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "USER": "someone",
        "OMP_NUM_THREADS": "1",
        "SHIM_LOG": str(tmp_path / "submitted.log"),
        "STORE": str(tmp_path / "campaign.db"),
    }


def _finished(store: str) -> int:
    try:
        with open_store(store, readonly=True) as opened:
            counts = opened.counts(opened.get_campaign().id)
    except StoreError:
        return 0
    return sum(n for state, n in counts.items() if state.finished)


def _status(store: str) -> str:
    with open_store(store, readonly=True) as opened:
        return opened.get_campaign().status.value


@pytest.mark.e2e
def test_frontier_script_drains_on_the_warning_resubmits_and_resumes(cluster):
    script = JOBS / "frontier.sbatch"
    env = {
        **cluster,
        "SLURM_SUBMIT_DIR": str(ROOT),
        "SLURM_NNODES": "1",
        "SLURM_JOB_ID": "4242",
        "SHIM_SCRIPT": str(script),
        "BUDGET": "10",
        "GRACE": "20",
        "PARSEARCH_ARGS": "--backend simulate --backend-opt delay=0.4 --slots 1",
    }
    job = subprocess.Popen(["bash", str(script)], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while _finished(env["STORE"]) < 2 and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    job.send_signal(signal.SIGUSR1)  # Slurm's --signal=B:USR1: to the batch shell only
    output, _ = job.communicate(timeout=120)
    assert job.returncode == 0, output
    assert "time limit near, draining" in output
    assert _status(env["STORE"]) == "stopped"
    done = _finished(env["STORE"])
    assert 2 <= done < 10
    submitted = Path(env["SHIM_LOG"]).read_text()
    assert "--dependency=afterany:4242" in submitted and "JOB_INDEX=2" in submitted
    assert submitted.rstrip().endswith(str(script))

    # The successor: finds the campaign in the store, resumes it and finishes it.
    env.update(JOB_INDEX="2", SLURM_JOB_ID="4243", PARSEARCH_ARGS="--backend simulate")
    rerun = subprocess.run(["bash", str(script)], env=env, cwd=ROOT, capture_output=True,
                           text=True, timeout=180)  # fmt: skip
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "campaign finished" in rerun.stdout
    assert _status(env["STORE"]) == "finished" and _finished(env["STORE"]) == 10
    assert (Path(env["STORE"]).with_suffix("").parent / "campaign-report" / "index.html").exists()
    assert Path(env["SHIM_LOG"]).read_text() == submitted  # nothing more to submit


@pytest.mark.e2e
def test_polaris_script_drains_before_the_walltime_and_resubmits(cluster):
    env = {
        **cluster,
        "PBS_O_WORKDIR": str(ROOT),
        "PBS_JOBID": "4242.polaris-pbs-01",
        "PBS_NODEFILE": os.devnull,
        "SHIM_WALLTIME": "00:00:36",
        "SPACE": "search_spaces/gpt-175b-frontier.yaml",
        "DRAIN_S": "32",  # --timeout 4: the driver stops itself after 4 s
        "GRACE": "5",
        "PARSEARCH_ARGS": "--backend simulate --backend-opt delay=0.4 --slots 1",
    }
    job = subprocess.run(["bash", str(JOBS / "polaris.pbs")], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=180)  # fmt: skip
    assert job.returncode == 0, job.stdout + job.stderr
    assert _status(env["STORE"]) == "stopped"
    assert 1 <= _finished(env["STORE"]) < 100
    submitted = Path(env["SHIM_LOG"]).read_text()
    assert "depend=afterany:4242.polaris-pbs-01" in submitted and "JOB_INDEX=2" in submitted
