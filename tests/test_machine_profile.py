"""Machine profiles: the strict loader (errors name the file and field, exit 2), the
estimate's use of a profile (hand-computed), the alpha-beta fit, and a campaign recording
the profile it used."""

import copy
import shutil
from pathlib import Path

import pytest
import yaml

from parsearch.cli import main
from parsearch.config import AllocationSpec, ModelSpec, ParallelLayout
from parsearch.errors import SpaceError
from parsearch.estimate import EstimateSettings, memory_per_rank, predict
from parsearch.estimate.machine import CollectiveFit, GemmPoint, MachineProfile, MemoryBaseline
from parsearch.estimate.profile import profile_from_dict, profile_to_dict, with_machine
from parsearch.estimate.timing import gemm_efficiency, pipeline_slots, tp_allreduce_s
from parsearch.probe.fit import alpha_beta
from parsearch.profiles import load_profile
from parsearch.space import apply_profile, load_space
from parsearch.store import open_store

ROOT = Path(__file__).parent.parent
TINY = ROOT / "search_spaces" / "tiny-cpu.yaml"
PROFILE = {
    "name": "test-machine",
    "allocation": {"nodes": 1, "devices_per_node": 4},
    "precision": "fp32",
    "peak_tflops": 0.25,  # the tiny space's peak: its efficiencies are taken as they are
    "measured": {"by": "hand", "host": "nowhere"},
    "gemm": [
        {"tp": tp, "mbs": mbs, "seq": 128, "efficiency": 0.1 / tp}
        for tp in (1, 2, 4)
        for mbs in (1, 2, 4, 8)
    ],
    "collectives": [
        {
            "kind": "tp-intra-node",
            "op": "all-reduce",
            "group_size": 2,
            "latency": "1ms",
            "bandwidth": "1GB/s",
        }
    ],
    "memory": {"context": "0B", "communicator_buffers": "1MiB", "allocator_reserve": 0.1},
}


def write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def plan_with(tmp_path, profile: dict, capsys) -> tuple[int, str]:
    code = main(["plan", str(TINY), "--machine", str(write(tmp_path / "m.yaml", profile))])
    return code, capsys.readouterr().err


def test_a_valid_profile_loads_with_units(tmp_path):
    profile = load_profile(write(tmp_path / "m.yaml", PROFILE))
    (fit,) = profile.collectives
    assert fit.alpha_s == pytest.approx(1e-3)
    assert fit.beta_s_per_byte == pytest.approx(1e-9)
    assert profile.memory.communicator_bytes == 2**20
    assert profile.gemm_efficiency(2, 4, 128) == pytest.approx(0.05)


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        (lambda d: d.pop("memory"), "memory", "missing"),
        (lambda d: d["gemm"][0].pop("efficiency"), "gemm[0].efficiency", "missing"),
        (
            lambda d: d["collectives"][0].update(bandwidth="1GB"),
            "collectives[0].bandwidth",
            "GB/s",
        ),
        (lambda d: d["collectives"][0].update(latency=85), "collectives[0].latency", "85us"),
        (lambda d: d["memory"].update(context=512), "memory.context", "512MiB"),
        (lambda d: d["gemm"][1].update(efficiency=3), "gemm[1].efficiency", "(0, 1]"),
        (lambda d: d["collectives"][0].update(kind="tp"), "collectives[0].kind", "tp-intra-node"),
        (lambda d: d["allocation"].update(devices_per_node=8), "allocation", "1 x 4"),
        (lambda d: d.update(precision="bf16"), "precision", "fp32"),
        (
            lambda d: d["allocation"].update(compute_slots_per_node=0),
            "allocation.compute_slots_per_node",
            "integer >= 1",
        ),
    ],
)
def test_bad_profile_exits_2_naming_the_field(tmp_path, capsys, change, field, says):
    data = copy.deepcopy(PROFILE)
    change(data)
    code, err = plan_with(tmp_path, data, capsys)
    assert code == 2
    assert "m.yaml" in err and f"field '{field}'" in err and says in err
    assert "Traceback" not in err


def test_space_names_its_profile_relative_to_its_file(tmp_path, capsys):
    write(tmp_path / "m.yaml", PROFILE)
    space_data = yaml.safe_load(TINY.read_text())
    space_data["estimate"]["machine"] = "m.yaml"
    space_path = write(tmp_path / "space.yaml", space_data)
    space = load_space(space_path)
    assert space.estimate.machine is not None and space.estimate.machine.name == "test-machine"
    # The best measured efficiency becomes the cap of the curve elsewhere (logits).
    assert space.estimate.compute_efficiency == pytest.approx(0.1)
    plain = load_space(TINY)
    layout = ParallelLayout(tp=2, pp=1, dp=2, mbs=4, gas=2)
    assert space.predict(layout).tp_comm_s > plain.predict(layout).tp_comm_s
    space_data["estimate"]["machine"] = "absent.yaml"
    write(space_path, space_data)
    assert main(["plan", str(space_path)]) == 2
    assert "machine profile not found" in capsys.readouterr().err


def test_estimate_uses_the_profile_by_hand():
    model = ModelSpec(num_layers=2, hidden_size=64, num_heads=4, vocab_size=256, seq_length=32)
    allocation = AllocationSpec(
        nodes=1, devices_per_node=4, device_memory_bytes=2**30, peak_flops_per_device=1e11
    )
    profile = MachineProfile(
        name="m",
        nodes=1,
        devices_per_node=4,
        precision="fp32",
        peak_flops_per_device=2e11,  # measured against another peak: rescaled by 2
        gemm=(GemmPoint(tp=2, mbs=1, seq=32, efficiency=0.1),),
        collectives=(CollectiveFit("tp-intra-node", "all-reduce", 2, 1e-3, 1e-9),),
        memory=MemoryBaseline(
            context_bytes=1e6, communicator_bytes=2e6, allocator_reserve_fraction=0.5
        ),
    )
    base = EstimateSettings(precision="fp32", framework="torch")
    settings = with_machine(base, profile, allocation)
    assert tp_allreduce_s(1e6, 2, allocation, settings) == pytest.approx(1e-3 + 1e-3)
    # Four ranks from a fit at two: 3x the ring steps, 1.5x the bytes each rank moves.
    assert tp_allreduce_s(1e6, 4, allocation, settings) == pytest.approx(3e-3 + 1.5e-3)
    layout = ParallelLayout(tp=2, pp=1, dp=2, mbs=1, gas=1)
    assert gemm_efficiency(model, layout, settings) == pytest.approx(0.2)
    with_profile = memory_per_rank(model, layout, settings)
    without = memory_per_rank(model, layout, base)
    assert with_profile.total == pytest.approx(3e6 + 1.5 * without.total)
    assert predict(model, layout, allocation, settings).fits


def test_alpha_beta_recovers_a_line():
    sizes = [4096 * 4**i for i in range(6)]
    times = [2e-4 + size * 5e-10 for size in sizes]
    alpha, beta = alpha_beta(sizes, times)
    assert alpha == pytest.approx(2e-4, rel=1e-6)
    assert beta == pytest.approx(5e-10, rel=1e-6)


@pytest.mark.e2e
def test_campaign_records_the_profile_it_used(tmp_path):
    profile = write(tmp_path / "m.yaml", PROFILE)
    store_path = tmp_path / "c.db"
    shutil.copy(TINY, tmp_path / "tiny.yaml")
    args = ["run", str(tmp_path / "tiny.yaml"), "--store", str(store_path), "--budget", "1"]
    args += ["--backend", "simulate", "--machine", str(profile), "--quiet"]
    assert main(args) == 0
    with open_store(store_path, readonly=True) as store:
        settings = store.get_campaign().settings
    assert settings["machine"] == str(profile.resolve())
    assert settings["machine_profile"]["name"] == "test-machine"
    assert settings["machine_profile"]["measured"] == {"by": "hand", "host": "nowhere"}
    out = tmp_path / "report"
    assert main(["report", "--store", str(store_path), "--out", str(out)]) == 0
    assert "machine profile test-machine" in (out / "index.html").read_text()


def test_a_space_run_by_a_relative_path_is_served_from_any_folder(tmp_path, monkeypatch, capsys):
    """Its profile is named relative to the space's file: a campaign started as ``run
    space.yaml`` in that folder is reported (which reloads its space) from another."""
    campaign_dir, elsewhere = tmp_path / "campaign", tmp_path / "elsewhere"
    campaign_dir.mkdir()
    elsewhere.mkdir()
    write(campaign_dir / "m.yaml", PROFILE)
    space_data = yaml.safe_load(TINY.read_text())
    space_data["estimate"]["machine"] = "m.yaml"
    write(campaign_dir / "space.yaml", space_data)
    monkeypatch.chdir(campaign_dir)
    args = ["run", "space.yaml", "--store", "c.db", "--budget", "1", "--backend", "simulate"]
    assert main([*args, "--quiet"]) == 0
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    out = elsewhere / "report"
    code = main(["report", "--store", str(campaign_dir / "c.db"), "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    assert "machine profile test-machine" in (out / "index.html").read_text()


@pytest.mark.parametrize("slots", [None, 2])
def test_stored_profile_reads_back_as_it_was(tmp_path, slots):
    """A resumed campaign rebuilds its profile from the campaign's settings."""
    data = copy.deepcopy(PROFILE)
    if slots is not None:
        data["allocation"]["compute_slots_per_node"] = slots
    profile = load_profile(write(tmp_path / "m.yaml", data))
    assert profile.compute_slots_per_node == slots
    again = profile_from_dict(profile_to_dict(profile), source=profile.path)
    assert again == profile


@pytest.mark.parametrize(
    ("microbatches", "share", "slots"),
    [
        (8, 1.0, 11.0),  # a device per rank: the bubble is idle time
        (8, 0.5, 8.0),  # 4 ranks on 2 cores: the idle stages' cores fill the bubble
        (4, 0.5, 4.0),  # critical path 7 slots at twice the speed = 3.5 < the work, 4
        (2, 0.5, 2.5),  # a short pipeline is still bound by its critical path
    ],
)
def test_ranks_sharing_cores_fill_the_pipeline_bubble(microbatches, share, slots):
    """pp=4 (3 bubble slots): max(m, (m + 3) * share), computed by hand."""
    assert pipeline_slots(microbatches, 3.0, share) == pytest.approx(slots)


def test_a_cpu_profile_with_fewer_cores_than_ranks_shortens_pipelines_only():
    model = ModelSpec(num_layers=4, hidden_size=64, num_heads=4, vocab_size=256, seq_length=32)
    allocation = AllocationSpec(
        nodes=1, devices_per_node=4, device_memory_bytes=2**30, peak_flops_per_device=1e11
    )
    base = EstimateSettings(precision="fp32", framework="torch")
    own = MachineProfile("m", 1, 4, "fp32", 1e11, gemm=(GemmPoint(1, 2, 32, 0.1),))
    shared = MachineProfile(
        "m", 1, 4, "fp32", 1e11, gemm=(GemmPoint(1, 2, 32, 0.1),), compute_slots_per_node=2
    )
    pipeline = ParallelLayout(tp=1, pp=4, dp=1, mbs=2, gas=8)
    alone = predict(model, pipeline, allocation, with_machine(base, own, allocation))
    sharing = predict(model, pipeline, allocation, with_machine(base, shared, allocation))
    slot = alone.bubble_s / 3  # (pp - 1) slots of bubble
    assert sharing.bubble_s == pytest.approx(0.0)  # max(8, 11 * 0.5) = 8 slots
    assert alone.step_time_s - sharing.step_time_s == pytest.approx(3 * slot)
    flat = ParallelLayout(tp=1, pp=1, dp=4, mbs=2, gas=2)
    assert predict(model, flat, allocation, with_machine(base, shared, allocation)) == predict(
        model, flat, allocation, with_machine(base, own, allocation)
    )


def test_mismatched_space_error_is_a_space_error(tmp_path):
    data = copy.deepcopy(PROFILE)
    data["allocation"]["nodes"] = 2
    space = load_space(TINY)
    with pytest.raises(SpaceError, match="probe this allocation"):
        apply_profile(space, write(tmp_path / "m.yaml", data))


def test_a_single_device_profile_has_no_collectives_and_loads():
    data = copy.deepcopy(PROFILE)
    data["collectives"] = []
    assert profile_from_dict(data).collectives == ()
    data["gemm"] = []
    with pytest.raises(SpaceError, match="non-empty list"):
        profile_from_dict(data)
