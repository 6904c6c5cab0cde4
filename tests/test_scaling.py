"""`parsearch scaling`: the best layout at several sizes on simulate and on real local ranks,
bad --nodes refused before anything runs, and a study stopped half-way continued without
losing or repeating a size."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from trials_seen import trials_seen

from parsearch.campaign.progress import Progress
from parsearch.campaign.scaling import run_study
from parsearch.cli import main
from parsearch.store import open_store

ROOT = Path(__file__).resolve().parent.parent
GPT_175B = ROOT / "search_spaces" / "gpt-175b-frontier.yaml"
TINY = ROOT / "search_spaces" / "tiny-cpu.yaml"


def _pinned_175b(tmp_path: Path) -> Path:
    """The 175B space with one layout, so the parent's best is known: tp8 pp8 mbs1 gas128."""
    text = GPT_175B.read_text()
    for old, new in [
        ("tp: {pow2: [1, 32]}", "tp: [8]"),
        ("pp: {pow2: [1, 64]}", "pp: [8]"),
        ("mbs: {pow2: [1, 16]}", "mbs: [1]"),
        ("gas: {pow2: [1, 128]}", "gas: [128]"),
    ]:
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / "gpt-175b-pinned.yaml"
    path.write_text(text)
    return path


def _parent(store: Path, space: Path, *extra: str) -> None:
    assert main(["run", str(space), "--store", str(store), "--strategy", "random", "--quiet",
                 *extra]) == 0  # fmt: skip


def _study(capsys, store: Path, *args: str) -> dict:
    capsys.readouterr()
    assert main(["scaling", "--store", str(store), "--format", "json", "--quiet", *args]) == 0
    return json.loads(capsys.readouterr().out)


def _children(store: Path) -> dict[str, list]:
    with open_store(store, readonly=True) as db:
        return {c.name: db.trials(c.id) for c in db.list_campaigns() if "-scaling-" in c.name}


def _per_device(point: dict) -> float:
    return point["tokens_per_s"] / point["devices"]


def test_weak_and_strong_studies_on_simulate(tmp_path, capsys):
    store = tmp_path / "s.db"
    _parent(store, _pinned_175b(tmp_path), "--backend", "simulate", "--budget", "1")
    with open_store(store, readonly=True) as db:
        best = db.best(db.get_campaign("gpt-175b-frontier").id).layout
    weak = _study(capsys, store, "--nodes", "128,64,32", "--weak")
    strong = _study(capsys, store, "--nodes", "32,64,128", "--strong")
    assert weak["complete"] and strong["complete"]
    assert [p["nodes"] for p in weak["points"]] == [32, 64, 128]
    # Weak: mbs and gas kept, the batch grows with dp. Strong: the batch is the parent's.
    assert [p["global_batch"] for p in weak["points"]] == [
        best.mbs * best.gas * dp for dp in (best.dp // 4, best.dp // 2, best.dp)
    ]
    assert {p["global_batch"] for p in strong["points"]} == {best.global_batch}
    for study in (weak, strong):
        points = [p for p in study["points"] if p["state"] == "ok"]
        assert len(points) >= 2
        reference = points[0]
        assert reference["efficiency"] == pytest.approx(1.0)
        for point in points:
            assert point["efficiency"] == pytest.approx(_per_device(point) / _per_device(reference))
    children = _children(store)
    assert len(children) == 6 and all(len(trials) == 1 for trials in children.values())
    # Run again: everything is read back, nothing runs twice.
    again = _study(capsys, store, "--nodes", "32,64,128", "--strong")
    assert again == strong
    assert all(len(trials) == 1 for trials in _children(store).values())
    # Without --name, commands mean the search, never its newest study size.
    capsys.readouterr()
    assert main(["best", "--store", str(store), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["campaign"] == "gpt-175b-frontier"
    assert main(["status", "--store", str(store), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["campaign"] == "gpt-175b-frontier"
    # The parent's report (the default campaign) shows both studies, figure and table.
    out = tmp_path / "report"
    assert main(["report", "--store", str(store), "--out", str(out)]) == 0
    page = (out / "index.html").read_text()
    assert "Weak scaling study" in page and "Strong scaling study" in page
    assert (out / "scaling-weak.png").stat().st_size > 0
    efficiency = f"{strong['points'][-1]['efficiency']:.1%}"
    assert efficiency in page


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        ("0,16", "must be >= 1"),
        ("16,256", "larger than campaign 'gpt-175b-frontier''s allocation (128 nodes)"),
        ("3", "do not divide into the best layout's tp*cp*pp = 64 ranks"),
        ("16,x", "comma-separated"),
    ],
)
def test_bad_nodes_are_refused_before_anything_runs(tmp_path, capsys, nodes, message):
    store = tmp_path / "s.db"
    _parent(store, _pinned_175b(tmp_path), "--backend", "simulate", "--budget", "1")
    capsys.readouterr()
    assert main(["scaling", "--store", str(store), "--nodes", nodes]) == 2
    err = capsys.readouterr().err
    assert "parsearch scaling: error: --nodes" in err and message in err
    assert "Traceback" not in err
    assert _children(store) == {}


def test_a_stopped_study_continues_without_losing_or_repeating(tmp_path, capsys):
    store = tmp_path / "s.db"
    _parent(store, _pinned_175b(tmp_path), "--backend", "simulate", "--budget", "1")
    command = [sys.executable, "-m", "parsearch", "scaling", "--store", str(store), "--nodes",
               "32,64,128", "--quiet", "--backend-opt", "delay=1.5"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        finished = [t for ts in _children(store).values() for t in ts if t.state.finished]
        if finished:
            break
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0 and "study stopped" in out
    before = {
        name: [(t.id, t.finished_at) for t in trials if t.state.finished]
        for name, trials in _children(store).items()
    }
    assert 1 <= sum(map(len, before.values())) < 3
    study = _study(capsys, store, "--nodes", "32,64,128")
    assert study["complete"] and all(p["state"] == "ok" for p in study["points"]), trials_seen(
        t for ts in _children(store).values() for t in ts
    )
    after = _children(store)
    assert sorted(after) == [f"gpt-175b-frontier-scaling-weak-{n}n" for n in (128, 32, 64)]
    assert all(len(trials) == 1 for trials in after.values())
    for name, done in before.items():  # what finished before is kept as it was
        assert [(t.id, t.finished_at) for t in after[name]][: len(done)] == done


class _SignalAsFirstSizeEnds(Progress):
    """Sends this process SIGTERM as the first size's campaign closes its display, after its
    last trial: the moment a real job's time limit can strike between two sizes."""

    def __init__(self) -> None:
        super().__init__(enabled=False)
        self.sent = False

    def close(self) -> None:
        if not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGTERM)


def test_a_signal_after_a_sizes_last_trial_stops_the_study(tmp_path):
    store = tmp_path / "s.db"
    _parent(store, _pinned_175b(tmp_path), "--backend", "simulate", "--budget", "1")
    before = signal.getsignal(signal.SIGTERM)
    study = run_study(store, name=None, nodes=[32, 64, 128], mode="weak",
                      progress=_SignalAsFirstSizeEnds())  # fmt: skip
    assert not study.complete
    assert [p.state for p in study.points].count("ok") == 1
    assert sum(map(len, _children(store).values())) == 1
    assert signal.getsignal(signal.SIGTERM) == before  # the handlers are put back


@pytest.mark.multiprocess
def test_weak_study_on_local_ranks(tmp_path, capsys):
    """The tiny GPT at 1, 2 and 4 real gloo ranks (one per "node")."""
    space = tmp_path / "tiny-4n.yaml"
    text = TINY.read_text()
    for old, new in [
        ("nodes: 1", "nodes: 4"),
        ("devices_per_node: 4", "devices_per_node: 1"),
        ("tp: [1, 2, 4]", "tp: [1]"),
        ("pp: [1, 2, 4]", "pp: [1]"),
        ("mbs: [1, 2, 4, 8]", "mbs: [2]"),
        ("recompute: [none, full]", "recompute: [none]"),
        ("global_batch: 16", "global_batch: 8"),
        ("steps: 4", "steps: 2"),
        ("warmup_steps: 2", "warmup_steps: 1"),
    ]:
        assert old in text
        text = text.replace(old, new)
    space.write_text(text)
    store = tmp_path / "s.db"
    _parent(store, space, "--budget", "1")
    study = _study(capsys, store, "--nodes", "1,2")
    points = study["points"]
    assert [(p["devices"], p["dp"], p["global_batch"]) for p in points] == [(1, 1, 2), (2, 2, 4)]
    assert all(p["state"] == "ok" and p["tokens_per_s"] > 0 for p in points), trials_seen(
        t for ts in _children(store).values() for t in ts
    )
    assert points[1]["efficiency"] == pytest.approx(_per_device(points[1]) / _per_device(points[0]))
    # The 4-rank size: the parent's own layout, measured again as part of the study.
    study = _study(capsys, store, "--nodes", "1,2,4")
    assert [p["devices"] for p in study["points"]] == [1, 2, 4]
    assert study["points"][:2] == points  # the first two are read back, not rerun
    assert all(len(trials) == 1 for trials in _children(store).values())


MPI_SPACE = """
name: mpi-scaling
model: {num_layers: 2, hidden_size: 64, num_heads: 4, vocab_size: 128, seq_length: 32}
allocation: {nodes: 2, devices_per_node: 1, device: cpu, device_memory: 1GiB,
             peak_tflops: 0.05}
search: {tp: [1], pp: [1], mbs: [2]}
global_batch: 8
trainer: {kind: builtin, steps: 2, warmup_steps: 1, timeout: 120}
"""


@pytest.mark.mpi
@pytest.mark.slow
def test_a_study_runs_every_size_on_one_mpi_job(tmp_path):
    """``mpiexec -n 3``: the driver and two worker nodes; both sizes in the one job (its
    workers serve one backend, so the study shares it between its child campaigns)."""
    pytest.importorskip("mpi4py")
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "mpiexec").exists():
        pytest.skip("no mpiexec next to the interpreter")
    (tmp_path / "space.yaml").write_text(MPI_SPACE)
    store = tmp_path / "x.db"
    _parent(store, tmp_path / "space.yaml", "--budget", "1")
    hosts = ["-disable-auto-cleanup", "-launcher", "fork", "-hosts", "n0,n1,n2", "-ppn", "1"]
    command = [str(bin_dir / "mpiexec"), *hosts, "-n", "3", str(bin_dir / "parsearch"),
               "scaling", "--store", str(store), "--nodes", "1,2", "--backend", "mpi",
               "--format", "json", "--quiet"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stdout + done.stderr
    study = json.loads(done.stdout)
    assert [(p["devices"], p["state"]) for p in study["points"]] == [(1, "ok"), (2, "ok")]
    with open_store(store, readonly=True) as db:
        for child in ("mpi-scaling-scaling-weak-1n", "mpi-scaling-scaling-weak-2n"):
            (trial,) = db.trials(db.get_campaign(child).id)
            assert db.get_campaign(child).backend == "mpi" and trial.hosts
