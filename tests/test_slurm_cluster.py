"""The shipped job scripts, unmodified, on a real Slurm cluster of three namespaced nodes
(``scripts/slurm-cluster.sh``; tests/slurm_cluster.py): submitted with ``sbatch``, watched
with ``squeue``/``scontrol``/``sacct``, stopped with ``scancel``, requeued with ``scontrol``.
The site file ``jobs/sites/namespaced-cluster.sh`` stands in for the modules and the venv; the
``mpi`` backend's workers start under ``srun`` (PMI-2) and every trial of the space spans two
nodes: data parallel across them over TCP between namespaces, tensor parallel within one.
One chain keeps its store on a real PostgreSQL server (the ``postgres`` tier's, reached
over its Unix socket from the node that drives), set by a site file as a centre sets it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sqlite3
import time
from pathlib import Path

import pytest
from slurm_cluster import (
    ACTIVE,
    SITE,
    SlurmCluster,
    skip_or_fail,
    start_cluster,
    stop_cluster,
    why_not_here,
)

from parsearch.errors import StoreError
from parsearch.store import open_store

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.e2e]

SPACE = "tests/fixtures/spaces/two-node-cpu.yaml"
NAME = "two-node-cpu"  # what NAME follows from SPACE


@pytest.fixture(scope="module")
def slurm(tmp_path_factory) -> SlurmCluster:
    reason = why_not_here()
    if reason:
        skip_or_fail(reason)
    directory = tmp_path_factory.mktemp("slurm")
    try:
        yield start_cluster(directory)
    finally:
        stop_cluster(directory)


def trials(store: Path) -> list[dict]:
    """Every trial row of the store (read with sqlite3 itself, not through parsearch)."""
    if not store.exists():
        return []
    with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as connection:
        connection.row_factory = sqlite3.Row
        try:
            return [dict(row) for row in connection.execute("SELECT * FROM trials ORDER BY number")]
        except sqlite3.OperationalError:  # the driver is making the schema, or writing
            return []


def campaign_status(store: Path) -> str:
    with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as connection:
        return connection.execute("SELECT status FROM campaigns").fetchone()[0]


def running_trial(store: Path) -> dict | None:
    if not store.exists():
        return None
    try:
        return next((t for t in trials(store) if t["state"] == "running"), None)
    except sqlite3.Error:
        return None


def chain_env(tmp_path: Path, **settings: str) -> dict[str, str]:
    """What a user exports before `sbatch`: the space, the store, the budget, the drain."""
    return {
        "SPACE": SPACE,
        "STORE": str(tmp_path / "campaign.db"),
        "SBATCH_OUTPUT": str(tmp_path / "%x-%j.out"),  # carried: successors inherit it
        "LEASE_TIMEOUT": "10",
        **settings,
    }


def logs(tmp_path: Path) -> str:
    return "\n".join(f"== {p.name}\n{p.read_text()}" for p in sorted(tmp_path.glob("*.out")))


def test_a_time_limited_chain_reaches_its_budget_exactly_with_real_trials(slurm, tmp_path):
    """Jobs of one minute each: every job is warned before its limit (by Slurm's own
    --signal, or, once it has finished a trial, by the same signal sent with `scancel
    --batch --signal=USR1`, so that the chain hops at least three times whatever the
    machine's speed); the running trials finish within GRACE (the warning reaches every
    process of the step, and none of the trial's dies of it); the successor resumes; the
    budget is reached exactly: no trial lost, none repeated. Options given on the command
    line (-t, -N, -A, -p) reach every successor; a store path with spaces, a comma and a
    quote is carried."""
    store_dir = tmp_path / "a store, it's here"
    store = store_dir / "campaign.db"
    env = chain_env(tmp_path, STORE=str(store), BUDGET="6", GRACE="30", WARNING_S="40",
                    MAX_JOBS="10")  # fmt: skip
    first = slurm.submit("frontier.sbatch", "-t", "1", "-N", "3", "-A", "acct1", "-p", "debug",
                         "--signal=B:USR1@40", **env)  # fmt: skip
    warned: dict[int, int] = {}  # job -> trials done when it started
    deadline = time.monotonic() + 420
    done = 0
    while (jobs := slurm.jobs("parsearch-175b", first)) and any(j.state in ACTIVE for j in jobs):
        assert time.monotonic() < deadline, logs(tmp_path)
        # A finished trial never goes away: a read that failed (trials() reads [] while a
        # driver writes or closes the store) is no drop to 0, which made a job that had just
        # started look as if it had finished a trial, and it was signalled 150 ms in.
        done = max(done, sum(row["state"] == "ok" for row in trials(store)))
        for job in jobs:
            if job.state == "RUNNING" and store.exists() and job.id not in warned:
                warned[job.id] = done
            elif warned.get(job.id, -1) >= 0 and done > warned[job.id]:
                slurm.run("scancel", "--batch", "--signal=USR1", str(job.id), check=False)
                warned[job.id] = -1  # warned
        time.sleep(0.5)
    output = logs(tmp_path)
    rows = trials(store)
    states = [(job.id, job.state, job.reason) for job in jobs]
    assert campaign_status(store) == "finished", (states, output)
    assert len(rows) == 6 and all(row["state"] == "ok" for row in rows), (rows, output)
    # Nothing ran twice but what a drain interrupted (GRACE too short for it): every
    # layout is its own, and every attempt beyond the first follows an interruption.
    interrupted = sum(int(n) for n in re.findall(r"(\d+) trial\(s\) interrupted", output))
    assert sum(row["attempt"] - 1 for row in rows) == interrupted, output
    assert len({row["key"] for row in rows}) == 6
    hosts = [json.loads(row["hosts"]) for row in rows]
    assert all(len(set(h)) == 2 for h in hosts), hosts  # each trial spanned two nodes
    assert output.count("time limit near, draining") >= 3, output
    ran = [job for job in jobs if job.state != "CANCELLED"]
    assert jobs[0].id == first and len(ran) >= 3, states
    for job in jobs:
        assert job.fields["TimeLimit"] == "00:01:00"
        assert job.fields["Account"] == "acct1" and job.fields["Partition"] == "debug"
        assert job.fields["NumNodes"].split("-")[0] == "3"
    assert "killed by SIGUSR1" not in output
    # The last job found the campaign finished and cancelled its successor.
    assert "cancelling successor" in output and "the campaign is finished" in output
    assert [slurm.completed(job.id) for job in jobs[:-1]] == ["COMPLETED"] * (len(jobs) - 1)


def test_requeue_keeps_one_successor_and_scancel_stops_the_chain(slurm, tmp_path):
    """`scontrol requeue` (what Slurm does when a node fails) runs the job again under its own
    id: it finds the successor it queued and submits no second one, although Slurm sets no
    USER. The user's `scancel` of the running job stops the chain: the queued successor is
    cancelled, the running trial is interrupted, nothing finished is lost, and submitting the
    script again finishes the campaign with the same budget."""
    env = chain_env(tmp_path, BUDGET="6", GRACE="20", WARNING_S="60")
    store = Path(env["STORE"])
    first = slurm.submit("frontier.sbatch", "-t", "10", "-N", "3", **env)
    slurm.wait("a first trial", lambda: store.exists() and any(
        row["state"] == "ok" for row in trials(store)), timeout_s=180)  # fmt: skip
    slurm.run("scontrol", "requeue", str(first))
    slurm.wait("the requeued job to run again",
               lambda: slurm.job(first).restarts == 1 and slurm.job(first).state == "RUNNING",
               timeout_s=120)  # fmt: skip
    done_before = sum(row["state"] == "ok" for row in trials(store))
    slurm.wait("a trial after the requeue", lambda: sum(
        row["state"] == "ok" for row in trials(store)) > done_before and running_trial(store),
        timeout_s=240)  # fmt: skip
    jobs = slurm.jobs("parsearch-175b", first)
    assert len(jobs) == 2, [(job.id, job.state, job.dependency) for job in jobs]
    successor = jobs[1]
    assert f"afterany:{first}" in successor.dependency and successor.state == "PENDING"

    slurm.run("scancel", str(first))
    jobs = slurm.wait_for_chain("parsearch-175b", first, timeout_s=120)
    output = logs(tmp_path)
    assert [job.state for job in jobs] == ["CANCELLED", "CANCELLED"], output
    assert "the job was cancelled; the chain stops here" in output
    assert f"cancelling successor {successor.id}: this job was cancelled" in output
    rows = trials(store)
    assert campaign_status(store) == "stopped"
    assert {row["state"] for row in rows} <= {"ok", "interrupted"}, rows
    kept = {row["number"]: row for row in rows if row["state"] == "ok"}

    # Submitting the script again resumes the campaign: the interrupted trial first.
    again = slurm.submit("frontier.sbatch", "-t", "10", "-N", "3", **env)
    jobs = slurm.wait_for_chain("parsearch-175b", again, timeout_s=300)
    output = logs(tmp_path)
    rows = trials(store)
    assert campaign_status(store) == "finished", output
    assert len(rows) == 6 and all(row["state"] == "ok" for row in rows), rows
    for number, row in kept.items():
        assert trials(store)[number] == row, "a finished trial never changes"
    assert slurm.job(again).state == "COMPLETED"
    assert slurm.completed(first) == "CANCELLED" and slurm.completed(again) == "COMPLETED"


def test_a_lost_node_ends_its_trial_and_the_campaign_goes_on_with_the_nodes_left(slurm, tmp_path):
    """Every parsearch process of one node is killed mid-trial (its worker, its fork server,
    its ranks; Slurm's daemons live on): the trial it was part of ends as lost, naming the
    node, and its peers on the other node are released; the campaign goes on over the two
    nodes left (the step lives on: --kill-on-bad-exit=0) and reaches its budget; nothing
    recorded is lost."""
    env = chain_env(tmp_path, BUDGET="3", GRACE="20", WARNING_S="60",
                    PARSEARCH_ARGS="--backend-opt lost_after=8")  # fmt: skip
    store = Path(env["STORE"])
    job = slurm.submit("frontier.sbatch", "-t", "10", "-N", "3", **env)
    slurm.wait("a running trial", lambda: running_trial(store) is not None, timeout_s=180)
    time.sleep(3)  # its ranks have started on both of its nodes
    victim = busiest_worker_node(slurm)
    killed = kill_parsearch_processes(slurm, victim)
    assert killed
    jobs = slurm.wait_for_chain("parsearch-175b", job, timeout_s=300)
    output = logs(tmp_path)
    rows = trials(store)
    assert slurm.job(job).state == "COMPLETED", output
    assert campaign_status(store) == "finished", output
    lost = [row for row in rows if victim in (row["error"] or "")]
    assert len(lost) == 1 and "node lost" in lost[0]["error"], (rows, output)
    later = [row for row in rows if row["number"] > lost[0]["number"]]
    assert later and all(row["state"] == "ok" for row in later), rows
    assert all(victim not in json.loads(row["hosts"]) for row in later), rows
    assert len(rows) == 3 and len(jobs) == 2 and jobs[1].state == "CANCELLED"


@pytest.mark.postgres
def test_a_chain_on_a_postgresql_store_hops_and_finishes_with_its_report(
    slurm, tmp_path, postgres_server
):
    """STORE is a postgresql:// URL, set by a site file over the test cluster's own: the job
    makes no file checks, drives its trials into the server, drains when warned (after its
    first trial, by `scancel --batch --signal=USR1`), and its successor resumes the same
    campaign from the server and finishes it at its budget; the report lands in
    CAMPAIGN_DIR, named after the campaign, and no store file is made."""
    url = postgres_server.url()
    campaigns = tmp_path / "campaigns"
    site = tmp_path / "centre-site.sh"
    site.write_text(
        f"source {shlex.quote(str(SITE))} || return 1\n"
        f"STORE=${{STORE:-{shlex.quote(url)}}}\n"
        f"CAMPAIGN_DIR=${{CAMPAIGN_DIR:-{shlex.quote(str(campaigns))}}}\n"
    )
    env = chain_env(tmp_path, BUDGET="3", GRACE="30", WARNING_S="40", PARSEARCH_SITE=str(site))
    del env["STORE"]

    def finished() -> list:
        try:
            with open_store(url, readonly=True) as store:
                return [t for t in store.trials(store.get_campaign().id) if t.state.value == "ok"]
        except StoreError:  # no campaign (or no tables) yet
            return []

    first = slurm.submit("frontier.sbatch", "-t", "10", "-N", "3", **env)
    slurm.wait("a first trial", lambda: bool(finished()), timeout_s=240)
    slurm.run("scancel", "--batch", "--signal=USR1", str(first))
    jobs = slurm.wait_for_chain("parsearch-175b", first, timeout_s=360)
    output = logs(tmp_path)
    states = [(job.id, job.state, job.reason) for job in jobs]
    with open_store(url, readonly=True) as store:
        campaign = store.get_campaign()
        rows = store.trials(campaign.id)
    assert campaign.status.value == "finished", (states, output)
    assert len(rows) == 3 and all(row.state.value == "ok" for row in rows), (rows, output)
    assert all(len(set(row.hosts)) == 2 for row in rows), [row.hosts for row in rows]
    assert "time limit near, draining" in output and "resumes the campaign" in output, output
    ran = [job for job in jobs if job.state != "CANCELLED"]
    assert len(ran) >= 2 and jobs[-1].state == "CANCELLED", states
    assert (campaigns / f"{NAME}-report" / "index.html").is_file(), sorted(tmp_path.rglob("*"))
    assert not list(tmp_path.rglob("*.db")), sorted(tmp_path.rglob("*.db"))


def busiest_worker_node(slurm: SlurmCluster) -> str:
    """The worker node (not n1, where the driver runs) with the most processes: the one a
    running two-node trial has ranks on."""
    counts = {}
    for node in ("n2", "n3"):
        pids = slurm.run("ip", "netns", "pids", f"pst-{node}").stdout.split()
        counts[node] = len(pids)
    return max(counts, key=counts.get)


def kill_parsearch_processes(slurm: SlurmCluster, node: str) -> list[int]:
    """SIGKILL every process of ``node`` but Slurm's own (slurmd, slurmstepd)."""
    killed = []
    for pid in map(int, slurm.run("ip", "netns", "pids", f"pst-{node}").stdout.split()):
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            if not name.startswith("slurm"):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        except (OSError, ProcessLookupError):
            continue
    return killed


def test_ray_cluster_script_runs_a_campaign_over_the_namespaced_nodes(slurm, tmp_path):
    """jobs/ray-cluster.sh starts a Ray head and a worker on the job's two nodes and the
    campaign runs to its budget, each trial over two nodes, with a Ray token file in the
    user's home (Ray then turns token authentication on for `ray start`)."""
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("0" * 64 + "\n")
    env = chain_env(tmp_path, BUDGET="2", GRACE="20", WARNING_S="60", HOME=str(home),
                    CPUS_PER_NODE="8", GPUS_PER_NODE="2")  # fmt: skip
    store = Path(env["STORE"])
    job = slurm.submit("ray-cluster.sh", "-t", "10", "-N", "2", **env)
    jobs = slurm.wait_for_chain("parsearch-ray", job, timeout_s=420)
    output = logs(tmp_path)
    assert slurm.job(job).state == "COMPLETED", output
    rows = trials(store)
    assert campaign_status(store) == "finished", output
    assert len(rows) == 2 and all(row["state"] == "ok" for row in rows), (rows, output)
    assert all(len(set(json.loads(row["hosts"]))) == 2 for row in rows), rows
    assert len(jobs) == 2 and jobs[1].state == "CANCELLED"
