"""The command trainer: templates checked at load time, and trials of tests/fake_trainer.py
driven through the real node agent (parsearch.launch.process), one class of outcome per test.

Campaigns of the same fake trainer on the local and mpi backends are in
tests/test_local_backend.py and tests/test_mpi_backend.py.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from trials_seen import trials_seen

from parsearch.config import AllocationSpec, ModelSpec, MoESpec, ParallelLayout
from parsearch.errors import SpaceError
from parsearch.launch.placement import NodePlacement
from parsearch.launch.process import NodeRun, free_port
from parsearch.result import TrialResult, TrialState
from parsearch.space import load_space, space_from_dict
from parsearch.trainers.command.template import PLACEHOLDERS, CommandTemplate, trial_values
from parsearch.trainers.command.trainer import (
    CommandNode,
    CommandSettings,
    merge_node_results,
    run_node,
    validate_section,
)
from parsearch.trial import TrialSpec
from parsearch.trial_kinds import merge_results, node_run

FAKE = str(Path(__file__).with_name("fake_trainer.py"))
ROOT = Path(__file__).resolve().parent.parent
MIB = 1024**2
SEQ = 128


def section(fmt="megatron", *extra, parser=None, **keys):
    """A command section that runs the fake trainer with the trial's layout."""
    command = [
        "{python}", "{fake}", "--format", fmt,
        "--tp", "{tp}", "--pp", "{pp}", "--dp", "{dp}", "--mbs", "{mbs}", "--gas", "{gas}",
        "--global-batch", "{global_batch}", "--seq-length", "{seq_length}", "--steps", "{steps}",
        *extra,
    ]  # fmt: skip
    data = {
        "kind": "command",
        "command": command,
        "parser": parser or fmt,
        "steps": 6,
        "warmup_steps": 2,
        "vars": {"python": sys.executable, "fake": FAKE},
    }
    data.update(keys)
    return validate_section(data, "test")


def make_spec(trainer, tp=1, pp=1, dp=1, mbs=2, gas=2, per_node=None, timeout=30.0):
    model = ModelSpec(num_layers=4, hidden_size=64, num_heads=4, vocab_size=100, seq_length=SEQ)
    layout = ParallelLayout(tp=tp, pp=pp, dp=dp, mbs=mbs, gas=gas)
    world = layout.world_size
    allocation = AllocationSpec(
        nodes=world // (per_node or world),
        devices_per_node=per_node or world,
        device_memory_bytes=1 << 30,
        peak_flops_per_device=1e12,
        device="cpu",
    )
    return TrialSpec("t1", model, layout, allocation, trainer=trainer, timeout_s=timeout)


def run(spec, tmp_path):
    return run_node(
        NodePlacement(spec, 0, spec.nodes, "127.0.0.1", free_port("127.0.0.1"), tmp_path)
    )


def expected_tokens_per_s(spec, step_ms=100.0, steps=6, warmup=2):
    layout = spec.layout
    base = step_ms / 1000 * layout.mbs * layout.gas / (layout.tp * layout.pp)
    times = [base * (1.01 if it % 2 else 1.0) for it in range(warmup + 1, steps + 1)]
    tokens = layout.global_batch * SEQ
    rates = sorted(tokens / t for t in times)
    return (rates[len(rates) // 2 - 1] + rates[len(rates) // 2]) / 2


# --- templates, checked when the space is loaded ---------------------------------------


def space_with(trainer):
    return space_from_dict(
        {
            "model": {
                "num_layers": 4, "hidden_size": 64, "num_heads": 4, "vocab_size": 100,
                "seq_length": SEQ,
            },
            "allocation": {"nodes": 1, "devices_per_node": 2, "device_memory": "1GiB",
                           "peak_tflops": 1},
            "search": {"tp": [1, 2], "pp": 1, "mbs": [1], "gas": [1]},
            "trainer": trainer,
        },
        source="space.yaml",
    )  # fmt: skip


def test_unknown_placeholder_is_a_load_time_error_listing_valid_ones():
    with pytest.raises(SpaceError) as caught:
        space_with({"kind": "command", "command": ["train", "--tp", "{tpp}"]})
    error = caught.value
    assert error.field == "trainer.command[2]"
    assert "unknown placeholder {tpp}" in str(error)
    assert "{tp}" in str(error) and "{global_batch}" in str(error) and "space.yaml" in str(error)


@pytest.mark.parametrize(
    "trainer, field, message",
    [
        ({"command": "x {mbs!r}"}, "trainer.command[1]", "no formatting allowed"),
        ({"command": "x 'unclosed"}, "trainer.command", "cannot be split"),
        ({"command": ["x"], "launch": "srun"}, "trainer.launch", "per_rank"),
        ({"command": ["x"], "steps": 3, "warmup_steps": 3}, "trainer.warmup_steps", "[0, steps"),
        ({"command": ["x"], "vars": {"tp": 3}}, "trainer.vars.tp", "built-in"),
        ({"command": ["x"], "env": {"A": "{nope}"}}, "trainer.env.A", "unknown placeholder"),
        ({"command": ["x"], "files": {"../a.json": {}}}, "trainer.files.../a.json", "plain"),
        ({"command": ["x"], "parser": "regex"}, "trainer.patterns", "mapping"),
        ({"command": ["x"], "patterns": {"loss": "(1)"}}, "trainer.patterns", "regex"),
        ({"command": ["x"], "colour": 1}, "trainer.colour", "valid keys"),
        ({}, "trainer.command", "required"),
        (
            {"command": ["x", {"switch": "recompute", "cases": {"none": []}}]},
            "trainer.command[1].cases",
            "no case for recompute = selective, full",
        ),
        (
            {"command": ["x", {"switch": "recompute", "cases": {"some": []}, "default": []}]},
            "trainer.command[1].cases",
            "never 'some'",
        ),
        (
            {"command": ["x", {"switch": "tp", "cases": {1: []}}]},
            "trainer.command[1].default",
            "needs a 'default'",
        ),
        (
            {"command": ["x", {"switch": "tpp", "cases": {1: []}}]},
            "trainer.command[1].switch",
            "must name a placeholder",
        ),
        ({"command": [{"switch": "tp", "cases": {1: []}, "default": []}]}, "trainer.command[0]",
         "cannot be a switch"),
    ],
)  # fmt: skip
def test_section_errors_name_the_field(trainer, field, message):
    with pytest.raises(SpaceError) as caught:
        validate_section({"kind": "command", **trainer}, "s.yaml")
    assert caught.value.field == field
    assert message in str(caught.value)


def values(spec, settings, node_rank=0):
    return settings.values(
        spec, node_rank=node_rank, nnodes=1, master_addr="h", master_port=1, trial_dir=Path("/t")
    )


def test_a_value_with_shell_syntax_stays_one_argument():
    hostile = "x; rm -rf ~ && echo $(whoami)"
    for command in (["prog", "--data", "{data}"], "prog --data {data}"):
        trainer = validate_section(
            {"kind": "command", "command": command, "vars": {"data": hostile}}, "s"
        )
        settings = CommandSettings.from_section(trainer, "s")
        spec = make_spec(trainer)
        assert settings.template.argv(values(spec, settings)) == ["prog", "--data", hostile]


def test_shell_mode_quotes_every_value(tmp_path):
    trainer = validate_section(
        {
            "kind": "command",
            "shell": True,
            "command": "echo {data} tp={tp} > out.txt",
            "vars": {"data": "a; touch pwned"},
        },
        "s",
    )
    settings = CommandSettings.from_section(trainer, "s")
    argv = settings.template.argv(values(make_spec(trainer), settings))
    assert argv[:2] == ["/bin/sh", "-c"]
    subprocess.run(argv, cwd=tmp_path, check=True)
    assert (tmp_path / "out.txt").read_text() == "a; touch pwned tp=1\n"
    assert not (tmp_path / "pwned").exists()


def test_switches_expand_to_zero_or_more_arguments():
    trainer = validate_section(
        {
            "kind": "command",
            "command": [
                "x",
                {"switch": "seq_parallel", "cases": {True: ["--sp"], False: []}},
                {"switch": "recompute", "cases": {"none": [], "full": ["--rc", "full"]},
                 "default": ["--rc={recompute}"]},
                {"switch": "vpp", "cases": {1: []}, "default": ["--vpp", "{vpp}"]},
                "--braces={{literal}}",
            ],
        },
        "s",
    )  # fmt: skip
    # Survives the trial spec's JSON round trip (case keys are text).
    trainer = json.loads(json.dumps(trainer, sort_keys=True))
    settings = CommandSettings.from_section(trainer, "s")
    model = ModelSpec(num_layers=4, hidden_size=64, num_heads=4, vocab_size=100, seq_length=SEQ)
    allocation = AllocationSpec(1, 4, 1 << 30, 1e12, device="cpu")
    plain = TrialSpec("a", model, ParallelLayout(1, 1, 4, 1, 1), allocation, trainer=trainer)
    rich = TrialSpec(
        "b",
        model,
        ParallelLayout(2, 2, 1, 1, 2, recompute="selective", vpp=2, sequence_parallel=True),
        allocation,
        trainer=trainer,
    )
    assert settings.template.argv(values(plain, settings)) == ["x", "--braces={literal}"]
    assert settings.template.argv(values(rich, settings)) == [
        "x", "--sp", "--rc=selective", "--vpp", "2", "--braces={literal}",
    ]  # fmt: skip


def test_a_cp_layout_fills_cp_and_a_world_of_tp_cp_pp_dp():
    """``{cp}`` and its switch reach the command, and ``{world_size}`` counts the cp ranks:
    torchrun started with tp*pp*dp ranks would hand Megatron half the world it needs."""
    model = ModelSpec(num_layers=4, hidden_size=64, num_heads=4, vocab_size=100, seq_length=SEQ)
    layout = ParallelLayout(tp=2, pp=1, dp=2, mbs=1, gas=2, cp=2)
    spec = TrialSpec("c", model, layout, AllocationSpec(1, 8, 1 << 30, 1e12, device="cpu"))
    filled = trial_values(
        spec, node_rank=0, nnodes=1, master_addr="h", master_port=1, trial_dir=Path("/t"),
        steps=1, warmup_steps=0,
    )  # fmt: skip
    megatron_cp = {
        "switch": "cp",
        "cases": {1: []},
        "default": ["--context-parallel-size={cp}", "--cp-comm-type=p2p"],
    }
    assert set(filled) == set(PLACEHOLDERS), set(filled) ^ set(PLACEHOLDERS)
    template = CommandTemplate.parse(
        ["train", "--nproc={world_size}", "--cp", "{cp}", megatron_cp], frozenset(PLACEHOLDERS)
    )
    assert template.argv(filled) == [
        "train", "--nproc=8", "--cp", "2", "--context-parallel-size=2", "--cp-comm-type=p2p",
    ]  # fmt: skip
    plain = dataclasses.replace(spec, layout=dataclasses.replace(layout, cp=1, dp=4))
    assert template.argv(trial_values(
        plain, node_rank=0, nnodes=1, master_addr="h", master_port=1, trial_dir=Path("/t"),
        steps=1, warmup_steps=0,
    )) == ["train", "--nproc=8", "--cp", "1"]  # fmt: skip


def test_an_moe_layout_fills_ep_etp_and_the_expert_shape():
    """``{ep}``, ``{etp}`` and the MoE shape reach a Megatron command; a dense model's
    ``{num_experts}`` is 0, which Megatron reads as no MoE (arguments.py, d98e8a64)."""
    moe = MoESpec(
        num_experts=8, top_k=2, expert_ffn_hidden_size=96, shared_expert_ffn_hidden_size=32
    )
    model = ModelSpec(
        num_layers=4, hidden_size=64, num_heads=4, vocab_size=100, seq_length=SEQ, moe=moe
    )
    layout = ParallelLayout(tp=2, pp=1, dp=4, mbs=1, gas=2, ep=4, etp=2)
    spec = TrialSpec("m", model, layout, AllocationSpec(1, 8, 1 << 30, 1e12, device="cpu"))
    template = CommandTemplate.parse(
        [
            "train", "--num-experts={num_experts}", "--moe-router-topk={moe_top_k}",
            "--moe-ffn-hidden-size={moe_ffn_hidden_size}",
            "--moe-shared-expert-intermediate-size={moe_shared_ffn_hidden_size}",
            "--expert-model-parallel-size={ep}", "--expert-tensor-parallel-size={etp}",
        ],
        frozenset(PLACEHOLDERS),
    )  # fmt: skip

    def argv(spec: TrialSpec) -> list[str]:
        filled = trial_values(
            spec, node_rank=0, nnodes=1, master_addr="h", master_port=1, trial_dir=Path("/t"),
            steps=1, warmup_steps=0,
        )  # fmt: skip
        return template.argv(filled)

    assert argv(spec) == [
        "train", "--num-experts=8", "--moe-router-topk=2", "--moe-ffn-hidden-size=96",
        "--moe-shared-expert-intermediate-size=32", "--expert-model-parallel-size=4",
        "--expert-tensor-parallel-size=2",
    ]  # fmt: skip
    dense = dataclasses.replace(
        spec,
        model=dataclasses.replace(model, moe=None),
        layout=dataclasses.replace(layout, ep=1, etp=1),
    )
    assert argv(dense)[1:3] == ["--num-experts=0", "--moe-router-topk=0"]


COMMAND_SPACES = [
    path
    for path in sorted((ROOT / "search_spaces").glob("*.yaml"))
    if "kind: command" in path.read_text()
]


@pytest.mark.parametrize("path", COMMAND_SPACES, ids=lambda path: path.stem)
def test_example_spaces_load_and_fill(path):
    space = load_space(path)
    settings = CommandSettings.from_section(space.trainer, str(path))
    layout, _ = space.plan().feasible[0]
    spec = TrialSpec("x", space.model, layout, space.allocation, trainer=space.trainer)
    argv = settings.template.argv(values(spec, settings))
    joined = " ".join(argv)
    assert "{" not in joined.replace("{literal}", "")
    assert str(layout.tp) in joined and str(layout.global_batch) in joined


# --- trials through the node agent -------------------------------------------------------


def test_megatron_metrics_come_from_the_last_rank(tmp_path):
    spec = make_spec(section("megatron", "--print-rank", "last"), pp=2, mbs=2, gas=4)
    result = run(spec, tmp_path)
    assert result.status is TrialState.OK, result.error
    metrics = result.metrics
    assert metrics["metrics_log"] == "rank1.log"
    assert metrics["measured_steps"] == 4
    assert metrics["tokens_per_s"] == pytest.approx(expected_tokens_per_s(spec), rel=1e-3)
    assert metrics["reported_tflops_per_device"] == 42.0
    assert metrics["peak_mem_bytes"] == pytest.approx(2001 * MIB)  # rank 1's, the larger
    assert 0 < metrics["mfu"] == pytest.approx(metrics["tflops_per_device"] / 1.0)


def test_megatron_deepspeed_with_generated_deepspeed_config(tmp_path):
    files = {
        "ds_config.json": {
            "train_batch_size": "{global_batch}",
            "train_micro_batch_size_per_gpu": "{mbs}",
            "zero_optimization": {"stage": "{zero_stage}"},
            "bf16": {"enabled": True},
            "note": "tp={tp}",
        }
    }
    spec = make_spec(section("megatron-deepspeed", files=files), dp=2, mbs=1, gas=3)
    result = run(spec, tmp_path)
    assert result.status is TrialState.OK, result.error
    assert result.metrics["tokens_per_s"] == pytest.approx(expected_tokens_per_s(spec), rel=1e-3)
    config = json.loads((tmp_path / "ds_config.json").read_text())
    assert config == {
        "train_batch_size": 6,
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 0},
        "bf16": {"enabled": True},
        "note": "tp=1",
    }


def test_per_node_launcher_torchtitan(tmp_path):
    trainer = section(
        "torchtitan",
        "--spawn",
        "--nnodes", "{nnodes}", "--node-rank", "{node_rank}",
        "--nproc-per-node", "{nproc_per_node}",
        launch="per_node",
    )  # fmt: skip
    spec = make_spec(trainer, tp=2, dp=2, mbs=1, gas=2)
    result = run(spec, tmp_path)
    assert result.status is TrialState.OK, result.error
    assert sorted(p.name for p in tmp_path.glob("rank*.log")) == ["rank0.log"]  # one per node
    assert result.metrics["tokens_per_s"] == pytest.approx(expected_tokens_per_s(spec), rel=2e-3)
    assert result.metrics["reported_mfu"] == pytest.approx(0.042)


def test_json_trainer(tmp_path):
    spec = make_spec(section("json"), mbs=2, gas=2)
    result = run(spec, tmp_path)
    assert result.status is TrialState.OK, result.error
    assert result.metrics["peak_mem_bytes"] == 2000 * MIB


def test_hostile_value_reaches_the_trainer_as_one_argument(tmp_path):
    hostile = "/data; rm -rf ~"
    variables = {"python": sys.executable, "fake": FAKE, "data": hostile}
    trainer = section("json", "--record-argv", "--data-path", "{data}", vars=variables)
    result = run(make_spec(trainer), tmp_path)
    assert result.ok, result.error
    argv = json.loads((tmp_path / "argv_rank0.json").read_text())
    assert argv[argv.index("--data-path") + 1] == hostile


def test_trainer_reported_status_wins(tmp_path):
    command = ["{python}", "-c", 'print(\'{{"tokens_per_s": 5, "status": "oom"}}\')']
    trainer = validate_section({"kind": "command", "command": command,
                                "vars": {"python": sys.executable}}, "s")  # fmt: skip
    result = run(make_spec(trainer), tmp_path)
    assert result.status is TrialState.OOM, trials_seen([result])
    assert "reported status 'oom'" in result.error


def test_recovered_oom_with_metrics_and_clean_exit_is_ok(tmp_path):
    script = (
        "print('torch.OutOfMemoryError: CUDA out of memory; retrying with smaller chunks');"
        "print('{{\"tokens_per_s\": 5}}')"
    )
    trainer = validate_section({"kind": "command", "command": ["{python}", "-c", script],
                                "vars": {"python": sys.executable}}, "s")  # fmt: skip
    result = run(make_spec(trainer), tmp_path)
    assert result.status is TrialState.OK, result.error
    assert result.metrics["tokens_per_s"] == 5


def test_out_of_memory(tmp_path):
    spec = make_spec(section("megatron", "--oom-above", "1"), dp=2, mbs=2, gas=1)
    result = run(spec, tmp_path)
    assert result.status is TrialState.OOM, trials_seen([result])
    assert result.error.startswith("rank 0 ran out of memory: torch.OutOfMemoryError")


def test_one_rank_oom_others_hang_ends_as_oom_at_the_timeout(tmp_path):
    trainer = section("megatron", "--oom-above", "1", "--oom-rank", "-1", "--hang-after-oom")
    spec = make_spec(trainer, dp=2, mbs=2, gas=1, timeout=2.0)
    result = run(spec, tmp_path)
    assert result.status is TrialState.OOM, trials_seen([result])
    assert "rank 1 ran out of memory" in result.error


def test_hang_without_metric_lines_is_a_timeout(tmp_path):
    result = run(make_spec(section("megatron", "--hang"), timeout=1.5), tmp_path)
    assert result.status is TrialState.TIMEOUT, trials_seen([result])


def test_metrics_before_a_hang_are_kept_but_the_trial_is_a_timeout(tmp_path):
    spec = make_spec(section("megatron", "--hang-after-steps"), timeout=2.0)
    result = run(spec, tmp_path)
    assert result.status is TrialState.TIMEOUT  # a deadlock after warm-up is never best
    assert "after 4 measured steps: it hung after its warm-up" in result.error
    assert result.metrics["ended_by_timeout"] is True
    assert result.metrics["tokens_per_s"] == pytest.approx(expected_tokens_per_s(spec), rel=1e-3)
    allowed = make_spec(section("megatron", "--hang-after-steps", timeout_ok=True), timeout=2.0)
    result = run(allowed, tmp_path)
    assert result.status is TrialState.OK and result.metrics["ended_by_timeout"] is True


def test_nonzero_exit_is_an_error_with_the_log_tail(tmp_path):
    result = run(make_spec(section("megatron", "--exit-code", "3")), tmp_path)
    assert result.status is TrialState.ERROR, trials_seen([result])
    assert "exited with code 3" in result.error
    assert "RuntimeError: boom" in result.log_tail


def test_clean_exit_without_metric_lines_is_an_error(tmp_path):
    result = run(make_spec(section("megatron", parser="torchtitan")), tmp_path)
    assert result.status is TrialState.ERROR, trials_seen([result])
    assert "no torchtitan metric lines in rank0.log" in result.error


def test_layout_the_trainer_refuses_is_an_error(tmp_path):
    trainer = section("megatron")
    trainer["command"][trainer["command"].index("{dp}")] = "3"
    result = run(make_spec(validate_section(trainer, "s"), dp=2), tmp_path)
    assert result.status is TrialState.ERROR, trials_seen([result])
    assert "tp*pp*dp != world size" in result.log_tail


def test_environment_of_each_mode(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    monkeypatch.delenv("ROCR_VISIBLE_DEVICES", raising=False)
    gpu = AllocationSpec(1, 4, 1 << 30, 1e12, device="cuda")

    def env(backend_env=None, **keys):
        trainer = section("json", env={"TP_TIMES": "tp={tp}"}, **keys)
        spec = make_spec(trainer, dp=4, mbs=1, gas=1)
        spec.allocation = gpu
        where = NodePlacement(spec, 0, 1, "127.0.0.1", 1234, Path("/tmp/unused"), backend_env or {})
        node = node_run(where)
        return node.rank_env(2, 2, 4)

    per_rank = env()
    assert env(backend_env={"TP_TIMES": "slot"})["TP_TIMES"] == "slot"  # the backend's wins
    assert (per_rank["RANK"], per_rank["TP_TIMES"]) == ("2", "tp=1")
    assert per_rank["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"  # every device; LOCAL_RANK picks one
    assert env(bind_devices=True)["CUDA_VISIBLE_DEVICES"] == "6"
    per_node = env(launch="per_node")
    assert "RANK" not in per_node and "LOCAL_RANK" not in per_node
    assert (per_node["NNODES"], per_node["NPROC_PER_NODE"]) == ("1", "4")
    assert per_node["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"


def test_two_nodes_metrics_from_the_last(tmp_path):
    spec = make_spec(section("megatron", "--print-rank", "last"), pp=2, mbs=1, gas=2, per_node=1)
    assert spec.nodes == 2
    port = free_port("127.0.0.1")
    nodes = [
        node_run(NodePlacement(spec, node, 2, "127.0.0.1", port, tmp_path / f"node{node}"))
        for node in range(2)
    ]
    assert all(isinstance(node.plan.conclusion, CommandNode) for node in nodes)
    for node in nodes:
        node.start()
    results = [node.wait() for node in nodes]
    assert results[0].ok and "tokens_per_s" not in results[0].metrics
    merged = merge_results(spec, results)
    assert merged.ok
    assert merged.metrics["metrics_log"] == "rank1.log"
    assert merged.metrics["peak_mem_bytes"] == pytest.approx(1001 * MIB)


def test_builtin_trainer_keeps_the_agent_run():
    spec = make_spec({"kind": "builtin"})
    node = node_run(NodePlacement(spec, 0, 1, "127.0.0.1", 1, Path("/tmp/unused")))
    assert type(node) is NodeRun
    first = TrialResult(status=TrialState.OK, metrics={"tokens_per_s": 1.0})
    assert merge_results(spec, [first, TrialResult(status=TrialState.OK)]) is first


def test_merge_prefers_the_most_telling_failure():
    ok = TrialResult(status=TrialState.OK, metrics={"tokens_per_s": 1.0})
    timeout = TrialResult(status=TrialState.TIMEOUT, error="timed out")
    oom = TrialResult(status=TrialState.OOM, error="rank 9 ran out of memory")
    assert merge_node_results([ok, timeout, oom]) is oom
    assert merge_node_results([ok, timeout]) is timeout
    empty = merge_node_results([TrialResult(status=TrialState.OK, error="no lines")])
    assert empty.status is TrialState.ERROR and "no lines" in empty.error
