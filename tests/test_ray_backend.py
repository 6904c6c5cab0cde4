"""The ray backend on a local 4-CPU Ray cluster: real built-in-trainer trials of one and two
node bundles recorded in a store, and an actor killed mid-trial (``ray.kill``)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from process_census import child_pids_alive
from trials_seen import trials_seen

ray = pytest.importorskip("ray")

from parsearch.backends import create_backend  # noqa: E402
from parsearch.config import ParallelLayout  # noqa: E402
from parsearch.space import space_from_dict  # noqa: E402
from parsearch.store import open_store  # noqa: E402
from parsearch.trial import TrialSpec  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]

BIN = Path(sys.executable).parent
SPACE = {
    "name": "ray-test",
    "model": {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "vocab_size": 128,
              "seq_length": 32},
    "allocation": {"nodes": 1, "devices_per_node": 1, "device": "cpu",
                   "device_memory": "1GiB", "peak_tflops": 0.05},
    "search": {"tp": [1], "pp": [1], "mbs": [1, 2, 4, 8], "recompute": ["none", "full"]},
    "global_batch": 8,
    "trainer": {"kind": "builtin", "steps": 2, "warmup_steps": 1, "timeout": 240},
}  # fmt: skip


class Runner:
    """Submits trials to a backend and records them in a store, as the driver does."""

    def __init__(self, backend, store, space):
        self.backend, self.store, self.space = backend, store, space
        self.campaign = store.create_campaign("ray", SPACE, backend="ray")
        self.running: dict = {}

    def submit(self, layout: ParallelLayout) -> str:
        record = self.store.add_trial(self.campaign.id, layout, origin="user")
        spec = TrialSpec(
            trial_id=f"trial-{record.number:05d}",
            model=self.space.model,
            layout=layout,
            allocation=self.space.allocation,
            trainer=dict(self.space.trainer),
            timeout_s=240.0,
        )
        self.running[spec.trial_id] = self.store.mark_running(
            record.id, self.backend.submit(spec), attempt=1
        )
        return spec.trial_id

    def drain(self, timeout_s: float = 240.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.running and time.monotonic() < deadline:
            for item in self.backend.poll(0.5):
                value = item.result.metrics.get("tokens_per_s") if item.result.ok else None
                self.store.finish_trial(self.running.pop(item.trial_id).id, item.result, value)
        assert not self.running, f"still running after {timeout_s} s: {list(self.running)}"


def test_bundles_of_one_and_two_nodes_and_a_killed_actor(tmp_path):
    space = space_from_dict(SPACE)
    work = tmp_path / "work"
    backend = create_backend(
        "ray", space, options={"num_cpus": "4", "workdir": str(work), "start_timeout": "120"}
    )
    try:
        assert backend.capacity == 4
        with open_store(tmp_path / "x.db") as store:
            run = Runner(backend, store, space)
            # Two one-node trials and a two-node one fill the 4 CPUs; the room the driver
            # sees for trials of each size (proxies are smaller) follows.
            assert [backend.room_for(n) for n in (1, 2, 4)] == [4, 2, 1]
            run.submit(ParallelLayout(tp=1, pp=1, dp=2, mbs=4, gas=1))
            assert [backend.room_for(n) for n in (1, 2, 4)] == [2, 1, 0]
            run.submit(ParallelLayout(tp=1, pp=1, dp=1, mbs=8, gas=1))
            run.submit(ParallelLayout(tp=1, pp=1, dp=1, mbs=4, gas=2))
            assert backend.free_nodes() == 0 and backend.room_for(1) == 0
            run.drain()
            # An actor killed mid-trial: error, its rank gone, and trials go on after it.
            killed = run.submit(ParallelLayout(tp=1, pp=1, dp=1, mbs=2, gas=4))
            node_file = work / killed / "node0.json"
            deadline = time.monotonic() + 120
            while not node_file.exists() and time.monotonic() < deadline:
                backend.poll(0.2)
            ray.kill(ray.get_actor(f"parsearch-{killed}-node0"))
            run.drain()
            run.submit(ParallelLayout(tp=2, pp=1, dp=1, mbs=8, gas=1))
            run.drain()
            rows = {t.number: t for t in store.trials(run.campaign.id)}
    finally:
        backend.close()
    states = [rows[n].state.value for n in range(5)]
    assert states == ["ok", "ok", "ok", "error", "ok"], trials_seen(rows.values())
    assert rows[3].error.startswith("node lost: the actor of node 0 on ")
    assert "ActorDiedError" in rows[3].error or "died" in rows[3].error
    assert child_pids_alive(json.loads(node_file.read_text())["pids"]) == []
    for number, nodes in ((0, 2), (4, 2)):
        trial_dir = work / f"trial-{number:05d}"
        files = [json.loads(p.read_text()) for p in sorted(trial_dir.glob("node*.json"))]
        assert len(files) == nodes and len(rows[number].hosts) == nodes
        assert {f["port"] for f in files} == {files[0]["port"]}  # one rendezvous
        assert len({f["pid"] for f in files}) == nodes  # one actor per bundle
        assert rows[number].metrics["world_size"] == 2


def test_an_actor_killed_before_its_start_returned_names_its_node(tmp_path):
    """A kill that lands before an actor's start returns (a fresh-clone run under load
    killed one between its node file and its reply) is named by the node Ray placed its
    bundle on, as a kill mid-trial is: the user learns which node to look at."""
    space = space_from_dict(SPACE)
    options = {"num_cpus": "2", "workdir": str(tmp_path / "work"), "start_timeout": "120"}
    backend = create_backend("ray", space, options=options)
    try:
        with open_store(tmp_path / "x.db") as store:
            run = Runner(backend, store, space)
            killed = run.submit(ParallelLayout(tp=1, pp=1, dp=1, mbs=2, gas=4))
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not any(
                group["state"] == "CREATED" for group in ray.util.placement_group_table().values()
            ):
                time.sleep(0.01)
            actor = ray.get_actor(f"parsearch-{killed}-node0")
            ray.kill(actor)  # the backend has not polled since it submitted the start
            run.drain()
            rows = store.trials(run.campaign.id)
    finally:
        backend.close()
    assert [t.state.value for t in rows] == ["error"], trials_seen(rows)
    assert rows[0].error.startswith("node lost: the actor of node 0 on "), trials_seen(rows)
    assert rows[0].hosts and rows[0].hosts[0] in rows[0].error, trials_seen(rows)


def test_a_campaign_runs_on_a_local_ray_cluster(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text(json.dumps(SPACE))
    done = subprocess.run(
        [str(BIN / "parsearch"), "run", str(space), "--store", "x.db", "--backend", "ray",
         "--backend-opt", "num_cpus=2", "--budget", "3", "--quiet"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "budget reached; 3/3 trials finished (ok 3)" in done.stdout


GPU_RANK = """
import json, os
with open(f"devices-{os.environ['RANK']}.json", "w") as out:
    json.dump(os.environ.get("CUDA_VISIBLE_DEVICES"), out)
print(json.dumps({"tokens_per_s": 1.0}))
"""


def test_gpu_trials_get_gpu_bundles_and_one_device_per_rank(tmp_path):
    """Ray's pretend GPUs (no CUDA needed): each node's bundle is {"GPU": 1}, so each actor
    gets its own device, which its rank sees alone."""
    script = tmp_path / "rank.py"
    script.write_text(GPU_RANK)
    data = {
        **SPACE,
        "allocation": {**SPACE["allocation"], "nodes": 2, "device": "cuda"},
        "trainer": {"kind": "command", "command": ["{python}", "{script}"],
                    "vars": {"python": sys.executable, "script": str(script)},
                    "steps": 2, "warmup_steps": 1, "timeout": 60},
    }  # fmt: skip
    space = space_from_dict(data)
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)
    try:
        backend = create_backend("ray", space, options={"workdir": str(tmp_path / "w")})
        assert backend.capacity == 1
        layout = ParallelLayout(tp=1, pp=1, dp=2, mbs=4, gas=1)
        spec = TrialSpec("gpu", space.model, layout, space.allocation, space.trainer, 60.0)
        backend.submit(spec)
        done, deadline = [], time.monotonic() + 120
        while not done and time.monotonic() < deadline:
            done = backend.poll(0.5)
        backend.close()
    finally:
        ray.shutdown()
    assert done and done[0].result.ok, done
    seen = [json.loads((tmp_path / "w" / "gpu" / f"devices-{r}.json").read_text()) for r in (0, 1)]
    assert sorted(seen) == ["0", "1"]
