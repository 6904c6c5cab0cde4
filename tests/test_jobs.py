"""The cluster scripts in ``jobs/`` call the real CLI correctly, drain before the limit, and
chain their jobs safely.

Nobody runs Frontier from CI, so what can break silently is checked here: every
``parsearch ...`` invocation of a script is expanded by bash itself (with the batch system's
variables set to plausible values) and parsed by :func:`parsearch.cli.build_parser`; the
space a script names must load; the drain settings must fit the warning the scheduler gives.
Then the scripts run for real under bash, with small stand-ins for the scheduler's commands
(``sbatch``, ``srun``, ``qsub``, ...) and the ``simulate`` backend: PBS's drain keeps the
successor, which gets every setting; a driver that fails at start leaves no successor. The
Slurm chain itself runs on a real Slurm cluster: tests/test_slurm_cluster.py. A chain whose
store is a PostgreSQL server (``STORE=postgresql://...`` from a site file, as a centre sets
it) runs against a real server the ``postgres`` tier starts: no file checks, its report and
PBS's settings for the successor in ``CAMPAIGN_DIR``, and nothing made from the URL.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from parsearch.cli import build_parser
from parsearch.errors import StoreError
from parsearch.search.factory import make_strategy
from parsearch.space import load_space
from parsearch.store import open_store

ROOT = Path(__file__).parent.parent
JOBS = ROOT / "jobs"
# Script -> the backend its campaign uses. Every one is a chain (jobs/chain.sh).
SCRIPTS = {
    "frontier.sbatch": "mpi",
    "perlmutter.sbatch": "mpi",
    "polaris.pbs": "mpi",
    "ray-cluster.sh": "ray",
    "frontier-megatron-deepspeed.sbatch": "mpi",
    "megatron-lm-h100.sbatch": "mpi",
    "torchtitan-h100.sbatch": "mpi",
}
# What the batch system, the user's shell, or the script's own run-time commands provide.
ENVIRONMENT = {
    "SLURM_SUBMIT_DIR": str(ROOT),
    "SLURM_NNODES": "2",
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NAME": "parsearch",
    "SLURM_JOB_NODELIST": "nid[000001-000002]",
    "SLURM_CPUS_ON_NODE": "128",
    "PBS_O_WORKDIR": str(ROOT),
    "PBS_JOBID": "4242.polaris-pbs-01",
    "PBS_NODEFILE": "/dev/null",
    "USER": "someone",
    "HOME": "/home/someone",
    "SCRATCH": "/pscratch/sd/s/someone",
    "timeout": "10500",
    "NNODES": "2",
    "RAY_ADDRESS": "10.0.0.1:6379",
    "STORE": "/lustre/campaigns/campaign.db",
    "NAME": "campaign",
    "REPORT_DIR": "/lustre/campaigns/campaign-report",  # chain_check_store resolves it
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
        if not re.search(r"\bparsearch ", line):
            continue
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)  # drops # comments
        lexer.whitespace_split = True
        words = list(lexer)
        if "parsearch" not in words:
            continue
        command = []
        for word in words[words.index("parsearch") + 1 :]:
            if OPERATOR.match(word):
                if command and command[-1].isdigit():  # the 2 of 2>/dev/null
                    command.pop()
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
    (words,) = _expanded(name)
    args = _parse(words)
    assert args.command == "run" and args.resume, "each job starts or continues the campaign"
    assert args.backend == SCRIPTS[name], words
    assert args.store.endswith(".db")
    assert args.grace is not None  # the drain time is chosen, not left to chance
    assert args.budget is not None  # the chain's budget, never run's default
    load_space(ROOT / args.space)
    text = (JOBS / name).read_text()
    assert "source jobs/chain.sh" in text and re.search(r"^chain_run ", text, re.M)


def test_the_chain_reads_the_campaign_with_the_real_cli():
    commands = {words[0]: _parse(words) for words in _expanded("chain.sh")}
    assert set(commands) == {"status", "report"}
    assert commands["status"].format == "json"


@pytest.mark.parametrize("name", [*SCRIPTS, "chain.sh", "frontier-rccl.sh"])
def test_scripts_are_valid_bash(name):
    result = subprocess.run(["bash", "-n", str(JOBS / name)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    if shutil.which("shellcheck"):
        check = subprocess.run(["shellcheck", "-x", "-s", "bash", f"jobs/{name}"],
                               capture_output=True, text=True, cwd=ROOT)  # fmt: skip
        assert check.returncode == 0, check.stdout


def _default(text: str, variable: str) -> int:
    return int(re.search(rf"^{variable}=\$\{{{variable}:-(\d+)\}}", text, re.M).group(1))


@pytest.mark.parametrize("name", [name for name in SCRIPTS if not name.endswith(".pbs")])
def test_slurm_scripts_drain_within_the_warning(name):
    text = (JOBS / name).read_text()
    warning = re.search(r"^#SBATCH --signal=B:USR1@(\d+)", text, re.M)
    assert warning, "no --signal=B:USR1@N: the driver would be killed mid-trial"
    assert _default(text, "GRACE") < int(warning.group(1))
    # A batch shell runs its trap only while it waits on a background child.
    chain = (JOBS / "chain.sh").read_text()
    assert "trap chain_on_warning USR1" in chain and 'kill -USR1 "${DRIVER}"' in chain
    assert _default(text, "WARNING_S") == int(warning.group(1))  # what successors are given
    assert '"$@" &' in chain and "DRIVER=$!" in chain and 'wait "${DRIVER}"' in chain


def test_polaris_drains_before_the_walltime_by_itself():
    text = (JOBS / "polaris.pbs").read_text()
    assert _default(text, "GRACE") < _default(text, "DRAIN_S")
    (run,) = _expanded("polaris.pbs")
    assert "--timeout" in run


def test_frontier_allocation_matches_its_space():
    text = (JOBS / "frontier.sbatch").read_text()
    nodes = int(re.search(r"^#SBATCH --nodes=(\d+)", text, re.M).group(1))
    (run,) = _expanded("frontier.sbatch")
    space = load_space(ROOT / run[1])
    assert space.allocation.nodes == nodes
    assert space.allocation.devices_per_node == 8  # one MI250X GCD per rank


def test_the_torchtitan_space_never_offers_what_torchtitan_refuses():
    """torchtitan refuses DDP (zero_stage 0) with tp or pp > 1: plan counts those layouts as
    excluded, with the reason, and neither its feasible list nor the search's candidates
    hold one."""
    space = load_space(ROOT / "search_spaces/torchtitan-llama3-8b-h100.yaml")
    plan = space.plan()

    def refused(layout):
        return layout.zero_stage == 0 and (layout.tp > 1 or layout.pp > 1)

    assert plan.feasible and not any(refused(layout) for layout, _ in plan.feasible)
    assert not any(refused(layout) for layout, _ in plan.predicted_oom)
    ((reason, count),) = plan.excluded.items()
    assert "DDP has not supported > 1D parallelism" in reason and count > 0
    kept = plan.feasible + plan.predicted_oom
    assert any(layout.zero_stage == 0 for layout, _ in kept)  # 1-D DDP stays in the space
    strategy = make_strategy("default", space, seed=0, keep_predicted_oom=True)
    try:
        assert not any(refused(candidate.layout) for candidate in strategy.candidates.ranked)
    finally:
        strategy.close()
    assert "huggingface" not in (ROOT / "search_spaces/torchtitan-llama3-8b-h100.yaml").read_text()
    assert "--training.dataset_path={c4}" in space.trainer["command"]


# -- rehearsals: the real scripts under bash, the scheduler replaced by small shims ----------

SHIMS = {
    # srun and mpiexec: drop the launcher's options, run the command once, here (exec: a
    # signal sent to the "srun" reaches the command, as srun forwards it).
    # SHIM_SRUN_EXIT: srun's own status instead (its worst task's, e.g. a lost node's).
    "srun": 'while [[ $# -gt 0 && "$1" == -* ]]; do\n'
    '    case "$1" in -N|-n|-w) shift 2 ;; *) shift ;; esac\ndone\n'
    '[[ -z "${SHIM_SRUN_EXIT:-}" ]] && exec "$@"\n"$@"; exit "${SHIM_SRUN_EXIT}"',
    "mpiexec": 'while [[ $# -gt 0 && "$1" == -* ]]; do\n'
    '    case "$1" in --no-abort-on-failure) shift ;; *) shift 2 ;; esac\ndone\nexec "$@"',
    # sbatch --parsable / qsub: record the submission (its arguments, one per line, in
    # submitted.N) and print the new job's id.
    "sbatch": 'n=$(($(ls "${SHIM_DIR}" | grep -c "^submitted\\.[0-9]*$") + 1))\n'
    'printf "%s\\n" "$@" >"${SHIM_DIR}/submitted.$n"; env -0 >"${SHIM_DIR}/environment.$n"\n'
    'echo "sbatch $*" >>"${SHIM_LOG}"; echo "$((5000 + n))"',
    "qsub": 'n=$(($(ls "${SHIM_DIR}" | grep -c "^submitted\\.[0-9]*$") + 1))\n'
    'printf "%s\\n" "$@" >"${SHIM_DIR}/submitted.$n"\n'
    'echo "qsub $*" >>"${SHIM_LOG}"; echo "$((5000 + n)).polaris-pbs-01"',
    "scancel": 'echo "scancel $*" >>"${SHIM_LOG}"',
    "qdel": 'echo "qdel $*" >>"${SHIM_LOG}"',
    "squeue": "true",
    "scontrol": 'case "$2" in hostnames) echo "${SHIM_HOST}" ;;\n'
    '    *) echo "   Command=${SHIM_SCRIPT}" ;; esac',
    "qstat": 'echo "    Resource_List.walltime = ${SHIM_WALLTIME}"',
    "module": "true",
    "sbcast": "true",
    # ray start --block holds its srun step: a sleep the EXIT trap's `ray stop` ends.
    "ray": 'if [[ "$1" == start ]]; then /bin/sleep 600 & echo $! >>"${SHIM_DIR}/ray.pids"; wait\n'
    'else xargs -r kill <"${SHIM_DIR}/ray.pids" 2>/dev/null; fi',
    "sleep": "true",  # Ray's start-up pauses; the chain's lease wait is LEASE_WAIT
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
    site = tmp_path / "site.sh"  # the environment is ready: PATH below holds parsearch
    site.write_text("export OMP_NUM_THREADS=1\n")
    return {
        "PARSEARCH_SITE": str(site),
        "PATH": f"{bin_dir}:{venv_bin}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "USER": "someone",
        "OMP_NUM_THREADS": "1",
        "SHIM_DIR": str(tmp_path),
        "SHIM_LOG": str(tmp_path / "scheduler.log"),
        "SHIM_HOST": "localhost",
        "STORE": str(tmp_path / "campaign.db"),
        "SLURM_SUBMIT_DIR": str(ROOT),
        "SLURM_NNODES": "1",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NAME": "parsearch",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_CPUS_ON_NODE": "2",
        "PBS_O_WORKDIR": str(ROOT),
        "PBS_JOBID": "4242.polaris-pbs-01",
        "PBS_NODEFILE": os.devnull,
        "SHIM_WALLTIME": "01:00:00",
    }


def _submitted(cluster: dict[str, str]) -> list[list[str]]:
    """Each submission's arguments, in order."""
    found = sorted(Path(cluster["SHIM_DIR"]).glob("submitted.[0-9]*"),
                   key=lambda p: int(p.suffix[1:]))  # fmt: skip
    return [path.read_text().splitlines() for path in found]


def _carried(cluster: dict[str, str], n: int) -> dict[str, str]:
    """The variables submission ``n`` (from 1) hands its job: sbatch --export=ALL carries
    its own environment; qsub -v names the file of settings the successor reads first."""
    arguments = _submitted(cluster)[n - 1]
    if "--export=ALL" in arguments:
        text = (Path(cluster["SHIM_DIR"]) / f"environment.{n}").read_bytes().decode()
        return dict(pair.split("=", 1) for pair in text.split("\0") if "=" in pair)
    (pair,) = [arguments[i + 1] for i, word in enumerate(arguments) if word == "-v"]
    name, settings = pair.split("=", 1)
    assert name == "PARSEARCH_CHAIN_ENV", arguments
    dump = subprocess.run(
        ["bash", "-c", 'source "$1" && env -0', "dump", settings], env={},
        capture_output=True, check=True,
    )  # fmt: skip
    return dict(p.split("=", 1) for p in dump.stdout.decode().split("\0") if "=" in p)


def _finished(store: str) -> int:
    try:
        with open_store(store, readonly=True) as opened:
            counts = opened.counts(opened.get_campaign().id)
    except StoreError:
        return 0
    return sum(n for state, n in counts.items() if state.finished)


def _campaign(store: str):
    with open_store(store, readonly=True) as opened:
        return opened.get_campaign()


@pytest.mark.e2e
def test_polaris_script_drains_before_the_walltime_and_keeps_its_successor(cluster):
    env = {
        **cluster,
        "SHIM_WALLTIME": "00:00:40",
        "SPACE": "search_spaces/gpt-175b-frontier.yaml",
        "DRAIN_S": "32",  # --timeout 8 minus the seconds the script took to start
        "GRACE": "5",
        "BUDGET": "50",
        "PARSEARCH_ARGS": "--backend simulate --backend-opt delay=0.4 --slots 1",
    }
    job = subprocess.run(["bash", str(JOBS / "polaris.pbs")], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=180)  # fmt: skip
    assert job.returncode == 0, job.stdout + job.stderr
    assert _campaign(env["STORE"]).status.value == "stopped"
    assert 1 <= _finished(env["STORE"]) < 50
    (submitted,) = _submitted(cluster)
    assert submitted[:2] == ["-W", "depend=afterany:4242.polaris-pbs-01"]
    carried = _carried(cluster, 1)
    assert carried["BUDGET"] == "50" and carried["JOB_INDEX"] == "2"
    assert carried["PARSEARCH_ARGS"] == env["PARSEARCH_ARGS"]
    assert "qdel" not in Path(cluster["SHIM_LOG"]).read_text()


@pytest.mark.e2e
@pytest.mark.parametrize(
    # ray-cluster.sh starts its Ray cluster first: tests/test_slurm_cluster.py runs it.
    "name",
    ["frontier.sbatch", "perlmutter.sbatch", "polaris.pbs"],
)
def test_a_driver_that_fails_at_start_leaves_no_successor(cluster, name):
    """A bad space (or module, or environment) ends the driver at once: the successor queued
    at start is cancelled, so a chain never burns jobs on a start that cannot work."""
    env = {**cluster, "SHIM_SCRIPT": str(JOBS / name), "SPACE": "search_spaces/missing.yaml"}
    job = subprocess.run(["bash", str(JOBS / name)], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert job.returncode == 2, job.stdout + job.stderr
    assert "missing.yaml: file not found" in job.stderr
    assert "the driver failed (exit 2)" in job.stdout
    assert len(_submitted(cluster)) == 1
    cancel = "qdel 5001.polaris-pbs-01" if name.endswith(".pbs") else "scancel 5001"
    assert Path(cluster["SHIM_LOG"]).read_text().splitlines()[-1] == cancel


@pytest.mark.parametrize("store", ["campaigns/x.db", "{tmp}/x.sqlite"])
def test_a_store_that_is_not_absolute_is_refused_before_anything_is_submitted(cluster, store):
    env = {**cluster, "SHIM_SCRIPT": "jobs/frontier.sbatch"}
    env["STORE"] = store.format(tmp=cluster["SHIM_DIR"])
    job = subprocess.run(["bash", str(JOBS / "frontier.sbatch")], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert job.returncode == 2
    assert f"STORE={env['STORE']}" in job.stderr
    assert not _submitted(cluster)


@pytest.mark.e2e
def test_polaris_carries_settings_with_commas_quotes_and_spaces_to_its_successor(cluster):
    """qsub -v cannot carry such values: they travel in a settings file the successor reads
    before its defaults, so a value set with qsub -v at submission is not lost either."""
    env = {
        **cluster,
        "SHIM_WALLTIME": "00:00:40",
        "SPACE": "search_spaces/gpt-175b-frontier.yaml",
        "DRAIN_S": "36",
        "GRACE": "2",
        "BUDGET": "3",
        "PARSEARCH_ARGS": "--backend simulate --backend-opt delay=0 --slots 1",
        "NAME": 'it\'s a "name", with spaces',
    }
    job = subprocess.run(["bash", str(JOBS / "polaris.pbs")], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=180)  # fmt: skip
    assert job.returncode == 0, job.stdout + job.stderr
    carried = _carried(cluster, 1)
    for name in ("NAME", "PARSEARCH_ARGS", "BUDGET", "STORE", "GRACE", "SPACE"):
        assert carried[name] == env[name], name
    assert carried["JOB_INDEX"] == "2"
    assert not any(name.startswith(("SLURM_", "PBS_JOBID")) for name in carried)


@pytest.mark.e2e
def test_a_step_that_fails_after_the_campaign_made_progress_keeps_its_successor(cluster):
    """srun's status is its worst task's: a worker lost on a dead node fails the step while
    the driver drained cleanly. A job whose campaign made progress resumes in its successor;
    one that made none (a failed start) cancels it (test above)."""
    env = {
        **cluster,
        "SHIM_SCRIPT": str(JOBS / "frontier.sbatch"),
        "SHIM_SRUN_EXIT": "137",
        "SPACE": "search_spaces/gpt-175b-frontier.yaml",
        "BUDGET": "500",
        "PARSEARCH_ARGS": "--backend simulate --backend-opt delay=0.2 --timeout 4",
    }
    job = subprocess.run(["bash", str(JOBS / "frontier.sbatch")], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=180)  # fmt: skip
    assert job.returncode == 137, job.stdout + job.stderr
    assert "after the campaign made progress" in job.stdout, job.stdout
    assert "scancel" not in Path(cluster["SHIM_LOG"]).read_text()
    assert 0 < _finished(env["STORE"]) < 500


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["frontier.sbatch", "polaris.pbs"])
def test_a_warning_before_the_driver_starts_keeps_the_chain(cluster, name):
    """The scheduler's USR1 while the job sets up (its site file here; a job started with
    less than WARNING_S left, or a user's `scancel --signal=USR1` as it starts) no longer
    kills the batch shell: no driver starts, the successor is kept and resumes."""
    site = Path(cluster["PARSEARCH_SITE"])
    site.write_text(site.read_text() + "kill -USR1 $$\n")
    env = {**cluster, "SHIM_SCRIPT": str(JOBS / name),
           "SPACE": "search_spaces/gpt-175b-frontier.yaml"}  # fmt: skip
    job = subprocess.run(["bash", str(JOBS / name)], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert job.returncode == 0, (job.returncode, job.stdout + job.stderr)
    assert "warned before the driver started; starting none" in job.stdout, job.stdout
    assert "resumes the campaign" in job.stdout, job.stdout
    assert len(_submitted(cluster)) == 1
    log = Path(cluster["SHIM_LOG"])
    assert "scancel" not in log.read_text() and "qdel" not in log.read_text()


# -- a centre's PostgreSQL store: one URL in the site file ------------------------------------


def _site_with_server(cluster: dict[str, str], url: str, **settings: str) -> dict[str, str]:
    """The cluster's environment with the store set by its site file, as a centre sets it
    (``STORE=${STORE:-URL}``), and nothing of a file store left in it."""
    site = Path(cluster["PARSEARCH_SITE"])
    lines = [f"STORE=${{STORE:-{shlex.quote(url)}}}"]
    lines += [f"{name}=${{{name}:-{shlex.quote(value)}}}" for name, value in settings.items()]
    site.write_text(site.read_text() + "\n".join(lines) + "\n")
    return {key: value for key, value in cluster.items() if key != "STORE"}


def _made_from_the_url() -> list[Path]:
    """What a chain that took the URL for a path would have made in the submission
    directory (``${STORE%.db}-report``, a settings file ``${STORE%.db}.chain-ID.env``)."""
    return [path for path in ROOT.iterdir() if path.name.startswith("postgres")]


@pytest.mark.e2e
@pytest.mark.postgres
def test_a_pbs_chain_on_a_postgresql_store_drains_resumes_and_writes_its_report(
    cluster, postgres_server, tmp_path
):
    """The first job drains before its walltime and queues its successor with every
    setting in a file of CAMPAIGN_DIR (readable by the user alone: a URL may hold a
    password); the successor, given only that file (as qsub -v gives it), resumes the same
    campaign on the server, finishes it exactly at its budget, writes the report into
    CAMPAIGN_DIR and deletes its own successor. No store file is made anywhere."""
    url = postgres_server.url()
    campaigns = tmp_path / "campaigns"
    env = _site_with_server(cluster, url, CAMPAIGN_DIR=str(campaigns))
    first = {
        **env,
        "SHIM_WALLTIME": "00:00:40",
        "SPACE": "search_spaces/gpt-175b-frontier.yaml",
        "DRAIN_S": "32",  # --timeout 8 minus the seconds the script took to start
        "GRACE": "5",
        "BUDGET": "12",
        "PARSEARCH_ARGS": "--backend simulate --backend-opt delay=1 --slots 1",
    }
    job = subprocess.run(["bash", str(JOBS / "polaris.pbs")], env=first, cwd=ROOT,
                         capture_output=True, text=True, timeout=180)  # fmt: skip
    assert job.returncode == 0, job.stdout + job.stderr
    assert _campaign(url).status.value == "stopped", job.stdout
    assert 1 <= _finished(url) < 12, (_finished(url), job.stdout)
    (submitted,) = _submitted(cluster)
    settings = campaigns / "chain-4242.polaris-pbs-01.env"
    assert f"PARSEARCH_CHAIN_ENV={settings}" in submitted, submitted
    assert settings.stat().st_mode & 0o777 == 0o600, oct(settings.stat().st_mode)
    carried = _carried(cluster, 1)
    assert carried["STORE"] == url and carried["CAMPAIGN_DIR"] == str(campaigns), carried
    report = campaigns / "gpt-175b-frontier-report"
    assert carried["REPORT_DIR"] == str(report), carried

    successor = {
        **env,
        "PBS_JOBID": "5001.polaris-pbs-01",
        "PARSEARCH_CHAIN_ENV": str(settings),
        "SHIM_WALLTIME": "00:10:00",
    }
    job = subprocess.run(["bash", str(JOBS / "polaris.pbs")], env=successor, cwd=ROOT,
                         capture_output=True, text=True, timeout=180)  # fmt: skip
    assert job.returncode == 0, job.stdout + job.stderr
    assert "campaign finished" in job.stdout, job.stdout
    assert _campaign(url).status.value == "finished", job.stdout
    assert _finished(url) == 12, job.stdout
    assert (report / "index.html").is_file(), sorted(campaigns.rglob("*"))
    log = Path(cluster["SHIM_LOG"]).read_text().splitlines()
    assert log[-1] == "qdel 5002.polaris-pbs-01", log
    assert not list(tmp_path.rglob("*.db")), sorted(tmp_path.rglob("*.db"))
    assert not _made_from_the_url(), _made_from_the_url()


@pytest.mark.e2e
@pytest.mark.postgres
def test_a_slurm_job_on_a_postgresql_store_writes_its_report_where_report_dir_says(
    cluster, postgres_server, tmp_path
):
    """REPORT_DIR, given at submission, is where the finished campaign's report goes; the
    successor, cancelled, would have been handed the URL and REPORT_DIR as they were."""
    url = postgres_server.url()
    report = tmp_path / "reports" / "this one"
    env = {
        **_site_with_server(cluster, url, CAMPAIGN_DIR=str(tmp_path / "campaigns")),
        "SHIM_SCRIPT": str(JOBS / "frontier.sbatch"),
        "SPACE": "search_spaces/gpt-175b-frontier.yaml",
        "BUDGET": "3",
        "REPORT_DIR": str(report),
        "PARSEARCH_ARGS": "--backend simulate --backend-opt delay=0",
    }
    job = subprocess.run(["bash", str(JOBS / "frontier.sbatch")], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=180)  # fmt: skip
    assert job.returncode == 0, job.stdout + job.stderr
    assert _campaign(url).status.value == "finished" and _finished(url) == 3, job.stdout
    assert (report / "index.html").is_file(), sorted(tmp_path.rglob("*"))
    carried = _carried(cluster, 1)
    assert carried["STORE"] == url and carried["REPORT_DIR"] == str(report), carried
    assert Path(cluster["SHIM_LOG"]).read_text().splitlines()[-1] == "scancel 5001"
    assert not list(tmp_path.rglob("*.db")) and not _made_from_the_url()


@pytest.mark.parametrize("script", ["frontier.sbatch", "polaris.pbs"])
def test_a_postgresql_store_that_cannot_be_reached_is_refused_before_anything_is_submitted(
    cluster, script
):
    """A wrong host (or password, or a missing psycopg) ends the first job with exit 2 and
    the reason, before a successor is queued; the URL's password is never printed."""
    env = {
        **cluster,
        "SHIM_SCRIPT": str(JOBS / script),
        "SPACE": "search_spaces/gpt-175b-frontier.yaml",
        "STORE": "postgresql://someone:hunter2@/centre?host=/nonexistent/socket/dir",
    }
    job = subprocess.run(["bash", str(JOBS / script)], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert job.returncode == 2, job.stdout + job.stderr
    assert "cannot connect to postgresql://someone:***@/centre" in job.stderr, job.stderr
    assert "the store's server cannot be used" in job.stderr, job.stderr
    assert "hunter2" not in job.stdout + job.stderr, job.stdout + job.stderr
    assert not _submitted(cluster)
