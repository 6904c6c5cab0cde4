"""``{hosts}`` and ``{hostfile}``: a command trainer that launches with its own srun or mpiexec
learns where its trial runs, from the backend that placed it."""

import socket
import sys
import time
from pathlib import Path

from parsearch.backends.local import LocalBackend
from parsearch.config import AllocationSpec, ModelSpec, ParallelLayout
from parsearch.launch.node import NodeOrder, NodeSlot
from parsearch.space import space_from_dict
from parsearch.trainers.command.trainer import validate_section
from parsearch.trial import TrialSpec
from parsearch.trial_kinds import node_run

# Prints what the template passed it, as a launcher would receive it, then exits non-zero
# (no metrics: the trial is an error, which does not matter here).
SHOW = "import sys; print('hosts=' + sys.argv[1]); print(open(sys.argv[2]).read(), end='')"
TRAINER = {
    "kind": "command",
    "launch": "per_node",
    "command": ["{python}", "-c", SHOW, "{hosts}", "{hostfile}"],
    "vars": {"python": sys.executable},
    "timeout": 30,
}


def spec(nodes: int) -> TrialSpec:
    model = ModelSpec(num_layers=2, hidden_size=32, num_heads=2, vocab_size=64, seq_length=16)
    allocation = AllocationSpec(nodes=nodes, devices_per_node=1, device_memory_bytes=1 << 30,
                                peak_flops_per_device=1e12, device="cpu")  # fmt: skip
    layout = ParallelLayout(tp=1, pp=1, dp=nodes, mbs=1, gas=1)
    trainer = validate_section(dict(TRAINER), "test")
    return TrialSpec("t1", model, layout, allocation, trainer=trainer, timeout_s=30.0)


def wait(poll, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while (done := poll()) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert done is not None, "the trial never ended"
    return done


def test_a_worker_node_gets_the_hosts_its_backend_ordered(tmp_path):
    """The mpi and ray backends order each node with the trial's hosts (node 0 first)."""
    slot = NodeSlot(tmp_path, grace_s=1.0, node_run=node_run)
    trial = spec(nodes=2)
    order = NodeOrder(trial.to_dict(), 1, 2, "127.0.0.1", 1, hosts=("nid000007", "nid000009"))
    started = slot.start(order)
    assert started.error is None
    wait(slot.poll)
    slot.close()
    assert (tmp_path / "t1" / "hosts").read_text() == "nid000007\nnid000009\n"
    log = (tmp_path / "t1" / "rank1.log").read_text()
    assert "hosts=nid000007,nid000009" in log and "nid000009\n" in log


def test_the_local_backend_names_this_host_for_every_node(tmp_path):
    space = space_from_dict(
        {
            "model": {"num_layers": 2, "hidden_size": 32, "num_heads": 2, "vocab_size": 64,
                      "seq_length": 16},
            "allocation": {"nodes": 2, "devices_per_node": 1, "device_memory": "1GiB",
                           "peak_tflops": 1, "device": "cpu"},
            "search": {"tp": 1, "pp": 1, "mbs": 1, "gas": 1},
            "trainer": TRAINER,
        }
    )  # fmt: skip
    backend = LocalBackend(space, slots=1, workdir=tmp_path, grace_s=1.0)
    backend.submit(spec(nodes=2))
    wait(lambda: backend.poll(0.2) or None)
    backend.close()
    host = socket.gethostname()
    assert (tmp_path / "t1" / "hosts").read_text() == f"{host}\n{host}\n"
    assert f"hosts={host},{host}" in (tmp_path / "t1" / "rank0.log").read_text()
    assert Path(tmp_path / "t1" / "rank1.log").exists()


def test_a_single_trial_on_this_machine_names_this_host_as_a_campaign_would(tmp_path):
    """``parsearch trial`` places its nodes on the loopback rendezvous without hosts."""
    from parsearch.launch.placement import NodePlacement
    from parsearch.launch.process import run_local
    from parsearch.trial_kinds import plan_node

    host = socket.gethostname()
    assert NodePlacement(spec(2), 0, 2, "127.0.0.1", 1, tmp_path).hosts == (host, host)
    run_local(spec(1), plan_node, tmp_path / "t1")
    assert (tmp_path / "t1" / "hosts").read_text() == f"{host}\n"
    assert f"hosts={host}\n" in (tmp_path / "t1" / "rank0.log").read_text()
