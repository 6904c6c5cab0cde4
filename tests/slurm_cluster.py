"""A real Slurm cluster for the tests: ``scripts/slurm-cluster.sh`` started in a temporary
directory (munged, slurmctld and three slurmd, each node in network, UTS and mount
namespaces of its own), and small helpers that talk to it through Slurm's own commands.

The cluster needs root, network namespaces and Debian's ``slurm-wlm`` and ``munge``
(``scripts/test.sh`` installs them). Where they are missing the tier skips and says why; on CI
(``CI`` set) it fails instead, so a machine that should run it never passes by skipping.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "slurm-cluster.sh"
SITE = ROOT / "jobs" / "sites" / "namespaced-cluster.sh"
PREFIX = "pst"  # the cluster's bridge and namespaces: pstbr, pst-n1...
SUBNET = "10.77.0"
NODES = 3
ACTIVE = {"PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "REQUEUED"}
TOOLS = ("ip", "nsenter", "unshare", "munged", "slurmctld", "slurmd", "sbatch", "sacct")


def why_not_here() -> str | None:
    """Why this machine cannot run the cluster, or ``None`` when it can."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux's"
    if os.geteuid() != 0:
        return "starting slurmd in network namespaces needs root"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"not installed: {', '.join(missing)} (apt-get install slurm-wlm munge iproute2)"
    probe = f"{PREFIX}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    return None


def skip_or_fail(reason: str) -> None:
    """Skip with ``reason``; on CI, where the tier must run, fail with it."""
    if os.environ.get("CI"):
        pytest.fail(f"the Slurm tier must run on CI: {reason}")
    pytest.skip(reason)


@dataclass
class Job:
    """One job as ``scontrol show job`` describes it."""

    id: int
    name: str
    state: str
    reason: str
    restarts: int
    dependency: str
    fields: dict[str, str]


class SlurmCluster:
    """The running cluster, and what a user does with it from the login node."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        venv_bin = Path(sys.executable).parent
        # No USER: Slurm does not set it in a job either, and the scripts must not need it.
        self.env = {
            "PATH": f"{venv_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": os.environ.get("HOME", "/root"),
            "SLURM_CONF": str(directory / "slurm.conf"),
            "OMP_NUM_THREADS": "1",
            "PARSEARCH_SITE": str(SITE),
            "LANG": "C.UTF-8",
        }

    def run(self, *args: str, check: bool = True, **env: str) -> subprocess.CompletedProcess:
        done = subprocess.run(
            list(args), env={**self.env, **env}, cwd=ROOT, capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(args)}: exit {done.returncode}\n{done.stderr}")
        return done

    def submit(self, script: str, *options: str, **env: str) -> int:
        """``sbatch [options] jobs/SCRIPT`` from the repository root, as a user would."""
        done = self.run("sbatch", "--parsable", *options, f"jobs/{script}", **env)
        return int(done.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> Job:
        text = self.run("scontrol", "show", "job", str(job_id)).stdout
        fields = dict(re.findall(r"(\w[\w/:]*)=(\S*)", text))
        return Job(
            id=job_id,
            name=fields["JobName"],
            state=fields["JobState"],
            reason=fields.get("Reason", ""),
            restarts=int(fields.get("Restarts", "0")),
            dependency=fields.get("Dependency", ""),
            fields=fields,
        )

    def jobs(self, name: str, since: int = 0) -> list[Job]:
        """Every job of that name from job ``since`` on that Slurm still remembers (MinJobAge:
        10 minutes; earlier tests' chains share the name), in order."""
        text = self.run("scontrol", "show", "job", "--oneliner").stdout
        ids = [
            int(m.group(1))
            for line in text.splitlines()
            if (m := re.match(r"JobId=(\d+) JobName=(\S+)", line))
            and m.group(2) == name
            and int(m.group(1)) >= since
        ]
        return [self.job(i) for i in sorted(ids)]

    def completed(self, job_id: int) -> str:
        """The job's final state from the completion log (``sacct --completion``)."""
        text = self.run("sacct", "--completion", "-j", str(job_id), "-n", "-o", "State").stdout
        return text.split()[-1] if text.split() else ""

    def wait(self, what: str, done: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}\n"
                                     f"{self.run('squeue').stdout}")  # fmt: skip
            time.sleep(0.5)

    def wait_for_chain(self, name: str, first: int, timeout_s: float) -> list[Job]:
        """Every job of the chain of ``name`` that started with job ``first``, once none is
        pending or running any more."""
        self.wait(
            f"chain {name} to end",
            lambda: not any(job.state in ACTIVE for job in self.jobs(name, first)),
            timeout_s,
        )
        return self.jobs(name, first)

    def node(self, name: str, action: str) -> None:
        """Take a node's link ``down`` or bring it ``up`` (a lost node, a repaired one)."""
        self.run(str(SCRIPT), action, str(self.directory), name, PREFIX=PREFIX, NODES=str(NODES))

    def resume_nodes(self) -> None:
        """Put every node back in service (after a test took one down)."""
        for k in range(1, NODES + 1):
            self.node(f"n{k}", "up")
        self.run("scontrol", "update", f"NodeName=n[1-{NODES}]", "State=RESUME", check=False)
        self.wait(
            "every node to be idle",
            lambda: set(self.run("sinfo", "-h", "-N", "-o", "%t").stdout.split()) <= {"idle"},
            90,
        )


def start_cluster(directory: Path) -> SlurmCluster:
    env = {**os.environ, "PREFIX": PREFIX, "SUBNET": SUBNET, "NODES": str(NODES)}
    # A cluster a killed run left behind holds the names: stop it first (only ours).
    subprocess.run([str(SCRIPT), "stop", str(directory)], env=env, capture_output=True)
    started = subprocess.run(
        [str(SCRIPT), "start", str(directory)], env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    if started.returncode != 0:
        logs = "\n".join(p.read_text()[-2000:] for p in (directory / "log").glob("*.log"))
        raise AssertionError(f"the cluster did not start:\n{started.stderr}\n{logs}")
    return SlurmCluster(directory)


def stop_cluster(directory: Path) -> None:
    env = {**os.environ, "PREFIX": PREFIX, "SUBNET": SUBNET, "NODES": str(NODES)}
    subprocess.run([str(SCRIPT), "stop", str(directory)], env=env, capture_output=True)
