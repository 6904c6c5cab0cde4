"""Programs that tests/test_mpi_backend.py runs under ``mpiexec`` (every rank runs this file).

``python driver.py MODE STORE WORKDIR``; ranks >= 1 serve as workers, rank 0 does MODE:

* ``mixed``: real built-in-trainer trials of 1, 2 and 4 nodes (needs 4 workers, one
  device each) through the mpi backend, first come first served, each started as soon as
  enough nodes are free; every trial is recorded in the store at STORE;
* ``vanish``: make the backend, then die by SIGKILL: the workers must notice the silence
  and exit by themselves, so ``mpiexec`` ends;
* ``idle``: make the backend and sleep 3 s, so the test can read an idle worker's CPU time;
  the workers' pids go to WORKDIR/workers.json;
* ``unheard``: make the backend with a fast heartbeat and ignore it for 1 s, so dozens of
  heartbeats wait unreceived when the job ends (MPI_Finalize must not fail on them).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from parsearch.backends import mpi
from parsearch.config import ParallelLayout
from parsearch.space import space_from_dict
from parsearch.store import open_store
from parsearch.trial import TrialSpec

SPACE = {
    "name": "mpi-mixed",
    "model": {
        "num_layers": 2,
        "hidden_size": 64,
        "num_heads": 4,
        "vocab_size": 128,
        "seq_length": 32,
    },
    "allocation": {
        "nodes": 4,
        "devices_per_node": 1,
        "device": "cpu",
        "device_memory": "1GiB",
        "peak_tflops": 0.05,
    },
    "search": {"tp": [1, 2], "pp": [1, 2], "mbs": [1, 2, 4, 8]},
    "global_batch": 8,
    "trainer": {"kind": "builtin", "steps": 2, "warmup_steps": 1, "timeout": 240},
}
# Node counts 2, 1, 1 | 4 | 1, 2, 1: three waves that each fill the 4 nodes exactly.
LAYOUTS = [
    ParallelLayout(tp=1, pp=1, dp=2, mbs=4, gas=1),
    ParallelLayout(tp=1, pp=1, dp=1, mbs=8, gas=1),
    ParallelLayout(tp=1, pp=1, dp=1, mbs=4, gas=2),
    ParallelLayout(tp=2, pp=1, dp=2, mbs=4, gas=1),
    ParallelLayout(tp=1, pp=1, dp=1, mbs=2, gas=4),
    ParallelLayout(tp=2, pp=1, dp=1, mbs=4, gas=2),
    ParallelLayout(tp=1, pp=1, dp=1, mbs=1, gas=8),
]


def mixed(store_path: str, workdir: str) -> None:
    space = space_from_dict(SPACE)
    backend = mpi.create(space, slots=None, options={"workdir": workdir})
    with open_store(store_path) as store:
        campaign = store.create_campaign("mixed", SPACE, budget=len(LAYOUTS), backend="mpi")
        queue = []
        for layout in LAYOUTS:
            record = store.add_trial(campaign.id, layout, origin="user")
            spec = TrialSpec(
                trial_id=f"trial-{record.number:05d}",
                model=space.model,
                layout=layout,
                allocation=space.allocation,
                trainer=dict(space.trainer),
                timeout_s=240.0,
            )
            queue.append((record, spec))
        running = {}
        try:
            while queue or running:
                while queue and backend.free_nodes() >= queue[0][1].nodes:
                    record, spec = queue.pop(0)
                    running[spec.trial_id] = store.mark_running(
                        record.id, backend.submit(spec), attempt=1
                    )
                for item in backend.poll(0.5):
                    value = item.result.metrics.get("tokens_per_s") if item.result.ok else None
                    store.finish_trial(running.pop(item.trial_id).id, item.result, value)
        finally:
            backend.close()


def main(mode: str, store_path: str, workdir: str) -> None:
    if mpi.serve_if_worker():
        return
    if mode == "mixed":
        mixed(store_path, workdir)
        return
    one_node = {**SPACE, "allocation": {**SPACE["allocation"], "nodes": 1}}
    options = {"driver_timeout": "2", "driver_worker": "no"}
    if mode == "unheard":
        options["heartbeat"] = "0.02"
    backend = mpi.create(space_from_dict(one_node), slots=None, options=options)
    if mode == "unheard":
        time.sleep(1.0)
        backend.close()
        return
    if mode == "vanish":
        os.kill(os.getpid(), signal.SIGKILL)
    pids = [worker["pid"] for worker in backend.describe()["workers"]]
    Path(workdir, "workers.json").write_text(json.dumps(pids))
    time.sleep(3.0)
    backend.close()


if __name__ == "__main__":
    main(*sys.argv[1:4])
