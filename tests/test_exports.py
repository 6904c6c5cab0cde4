"""Exports must be accepted by the real trainers, so each test holds the trainer's own flags.

The flag and key lists below were read from the trainers' sources (cited per list), and every
exporter's output for hundreds of layouts of the shipped spaces was also parsed once by the
real Megatron-LM and Megatron-DeepSpeed argparse parsers and torchtitan v0.2.2's
``ConfigManager`` (which rejects unknown keys). These tests keep that contract without
installing the trainers: an argparse parser with the same flag kinds and choices must accept
the output and read back the measured layout.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from parsearch.config import ParallelLayout
from parsearch.space import SearchSpace, space_from_dict
from parsearch.trainer_flags import EXPORTERS, ExportError, export

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

# NVIDIA/Megatron-LM megatron/training/arguments.py (+ argument_utils.py dataclass flags) at
# d98e8a64, 2026-08-22: kind of action and choices, as its parser defines them.
MEGATRON_LM_FLAGS: dict[str, dict] = {
    "--tensor-model-parallel-size": {"type": int},
    "--pipeline-model-parallel-size": {"type": int},
    "--micro-batch-size": {"type": int},
    "--global-batch-size": {"type": int},
    "--num-layers-per-virtual-pipeline-stage": {"type": int},
    "--sequence-parallel": {"action": "store_true"},
    "--recompute-granularity": {"choices": ["full", "selective"]},
    "--recompute-method": {"choices": ["uniform", "block"]},
    "--recompute-num-layers": {"type": int},
    "--use-distributed-optimizer": {"action": "store_true"},
    "--use-megatron-fsdp": {"action": "store_true"},
    "--data-parallel-sharding-strategy": {
        "choices": ["no_shard", "optim", "optim_grads", "optim_grads_params"]
    },
    # ModelParallelConfig.context_parallel_size (dataclass flag); arguments.py's own.
    "--context-parallel-size": {"type": int},
    "--cp-comm-type": {"nargs": "+", "type": str},
}
# The values --cp-comm-type's help and TransformerConfig.cp_comm_type name.
MEGATRON_CP_COMM_TYPES = {"p2p", "a2a", "allgather", "a2a+p2p"}
# microsoft/Megatron-DeepSpeed megatron/arguments.py at f4157bea, 2024-12-24; --deepspeed and
# --deepspeed_config are added by deepspeed.add_config_arguments (deepspeed/__init__.py).
MEGATRON_DEEPSPEED_FLAGS: dict[str, dict] = {
    **{
        flag: kind
        for flag, kind in MEGATRON_LM_FLAGS.items()
        if flag
        not in (
            "--use-megatron-fsdp",
            "--data-parallel-sharding-strategy",
            "--context-parallel-size",
            "--cp-comm-type",
        )
    },
    "--ds-sequence-parallel-size": {"type": int},
    "--zero-stage": {"type": int},
    "--no-pipeline-parallel": {"action": "store_true"},
    "--deepspeed": {"action": "store_true"},
    "--deepspeed_config": {"type": str},
    "--deepspeed-activation-checkpointing": {"action": "store_true"},
}
# deepspeedai/DeepSpeed at edaa7221, 2026-08-22: deepspeed/runtime/constants.py,
# deepspeed/runtime/zero/config.py, deepspeed/runtime/activation_checkpointing/config.py.
DEEPSPEED_KEYS = {
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "zero_optimization",
    "bf16",
    "fp16",
    "activation_checkpointing",
    # read together by deepspeed.initialize (deepspeed/__init__.py) to build its
    # (data_parallel, sequence_parallel) mesh; checked against the installed package below.
    "sequence_parallel_size",
    "data_parallel_size",
}
DEEPSPEED_CHECKPOINT_KEYS = {
    "partition_activations",
    "number_checkpoints",
    "contiguous_memory_optimization",
    "synchronize_checkpoint_boundary",
    "profile",
    "cpu_checkpointing",
}
# pytorch/torchtitan torchtitan/config/job_config.py at tag v0.2.2 (fields of Training,
# Parallelism and ActivationCheckpoint that the exporter may write).
TORCHTITAN_KEYS = {
    "training": {"local_batch_size", "global_batch_size", "seq_len"},
    "parallelism": {
        "data_parallel_replicate_degree",
        "data_parallel_shard_degree",
        "fsdp_reshard_after_forward",
        "tensor_parallel_degree",
        "context_parallel_degree",
        "context_parallel_rotate_method",
        "pipeline_parallel_degree",
        "pipeline_parallel_schedule",
        "pipeline_parallel_microbatch_size",
        "pipeline_parallel_layers_per_stage",
        "pipeline_parallel_first_stage_less_layers",
        "pipeline_parallel_last_stage_less_layers",
    },
    "activation_checkpoint": {"mode", "selective_ac_option"},
}
# torch/distributed/pipelining/schedules.py get_schedule_class (torch 2.13).
TORCH_SCHEDULES = {"1F1B", "Interleaved1F1B", "GPipe", "LoopedBFS", "InterleavedZeroBubble"}

SPACE = {
    "name": "export-test",
    "model": {
        "num_layers": 32,
        "hidden_size": 4096,
        "num_heads": 32,
        "vocab_size": 32000,
        "seq_length": 4096,
    },
    "allocation": {
        "nodes": 8,
        "devices_per_node": 8,
        "device_memory": "80GiB",
        "peak_tflops": 989,
    },
    "search": {"tp": [1, 2, 4, 8], "pp": [1, 2, 4], "mbs": [1, 2]},
    "global_batch": 256,
    "estimate": {"precision": "bf16"},
}


@pytest.fixture(scope="module")
def space() -> SearchSpace:
    return space_from_dict(SPACE)


def _layout(**changes) -> ParallelLayout:
    base = ParallelLayout(tp=2, pp=4, dp=8, mbs=1, gas=32)
    return dataclasses.replace(base, **changes)


LAYOUTS = [
    _layout(),
    _layout(tp=8, pp=1, dp=8, mbs=2, gas=16, zero_stage=1, sequence_parallel=True),
    _layout(recompute="full", zero_stage=1),
    _layout(recompute="selective", vpp=2),
    _layout(tp=4, pp=1, dp=16, gas=16, zero_stage=3, recompute="full"),
    _layout(tp=1, pp=1, dp=64, gas=4, zero_stage=2),
    # Context parallelism: with TP and PP (Megatron, torchtitan), with sequence parallelism,
    # and alone (all four formats; DeepSpeed runs it as Ulysses).
    _layout(cp=2, dp=4, gas=64),
    _layout(tp=4, pp=1, cp=2, dp=8, sequence_parallel=True, recompute="selective"),
    _layout(tp=1, pp=1, cp=4, dp=16, gas=16, zero_stage=2),
    _layout(tp=1, pp=1, cp=2, dp=32, gas=8),
]

# DeepSpeed's pipeline engine runs neither interleaving nor ZeRO-2/3 with PP, and its
# Ulysses sequence parallelism neither TP nor PP.
DEEPSPEED_RUNNABLE = [
    layout
    for layout in LAYOUTS
    if layout.vpp == 1
    and not (layout.pp > 1 and layout.zero_stage > 1)
    and (layout.cp == 1 or layout.tp == layout.pp == 1)
]


def _parser(flags: dict[str, dict]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    for flag, kind in flags.items():
        parser.add_argument(flag, **kind)
    return parser


def _parse(flags: dict[str, dict], text: str) -> argparse.Namespace:
    # shlex.split: the way a launcher script's $(parsearch best ...) will split it.
    return _parser(flags).parse_args(shlex.split(text))


def _recompute(args: argparse.Namespace) -> str:
    return args.recompute_granularity or "none"


@pytest.mark.parametrize("layout", LAYOUTS, ids=ParallelLayout.short)
def test_megatron_lm_parser_accepts_the_layout(layout, space):
    args = _parse(MEGATRON_LM_FLAGS, export("megatron", layout, space))
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size) == (
        layout.tp,
        layout.pp,
    )
    assert args.micro_batch_size == layout.mbs
    assert args.global_batch_size == layout.global_batch
    assert args.sequence_parallel == layout.sequence_parallel
    assert _recompute(args) == layout.recompute
    if layout.recompute == "full":
        assert (args.recompute_method, args.recompute_num_layers) == ("uniform", 1)
    else:
        assert args.recompute_method is None  # Megatron refuses a method with selective
    assert args.use_distributed_optimizer == (layout.zero_stage == 1)
    sharding = {2: "optim_grads", 3: "optim_grads_params"}.get(layout.zero_stage)
    assert args.data_parallel_sharding_strategy == sharding
    assert args.use_megatron_fsdp == (sharding is not None)
    if layout.vpp > 1:
        stages = space.model.num_layers // args.num_layers_per_virtual_pipeline_stage
        assert stages == layout.pp * layout.vpp
    else:
        assert args.num_layers_per_virtual_pipeline_stage is None
    if layout.cp > 1:
        assert args.context_parallel_size == layout.cp
        assert args.cp_comm_type == ["p2p"]  # the ring the estimate models
        assert set(args.cp_comm_type) <= MEGATRON_CP_COMM_TYPES
        # Megatron's own checks: dp = world / (tp*cp*pp), seq % (2*cp) == 0.
        assert layout.world_size // (layout.tp * layout.cp * layout.pp) == layout.dp
        assert space.model.seq_length % (2 * layout.cp) == 0
    else:
        assert args.context_parallel_size is None and args.cp_comm_type is None


@pytest.mark.parametrize(
    "layout",
    DEEPSPEED_RUNNABLE,
    ids=ParallelLayout.short,
)
def test_megatron_deepspeed_parser_accepts_the_layout_and_agrees_with_ds_config(layout, space):
    args = _parse(MEGATRON_DEEPSPEED_FLAGS, export("megatron-deepspeed", layout, space))
    assert args.deepspeed and args.deepspeed_config == "ds_config.json"
    assert args.zero_stage == layout.zero_stage
    assert args.no_pipeline_parallel == (layout.pp == 1)
    assert args.deepspeed_activation_checkpointing == (layout.recompute == "full")
    assert _recompute(args) == layout.recompute
    assert args.ds_sequence_parallel_size == (layout.cp if layout.cp > 1 else None)
    config = json.loads(export("deepspeed", layout, space))
    assert config["train_batch_size"] == args.global_batch_size
    assert config["train_micro_batch_size_per_gpu"] == args.micro_batch_size
    assert config.get("sequence_parallel_size") == args.ds_sequence_parallel_size


@pytest.mark.parametrize(
    "layout",
    DEEPSPEED_RUNNABLE,
    ids=ParallelLayout.short,
)
def test_deepspeed_config_uses_real_keys_and_consistent_batches(layout, space):
    config = json.loads(export("deepspeed", layout, space))
    assert set(config) <= DEEPSPEED_KEYS
    # DeepSpeed's own check: train_batch_size = micro * accumulation * DP world size.
    assert config["train_batch_size"] == (
        config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"] * layout.dp
    )
    assert config["zero_optimization"] == {"stage": layout.zero_stage}
    assert config["bf16"] == {"enabled": True}
    checkpointing = config.get("activation_checkpointing")
    assert (checkpointing is not None) == (layout.recompute == "full")
    assert set(checkpointing or {}) <= DEEPSPEED_CHECKPOINT_KEYS
    if layout.cp > 1:
        # deepspeed.initialize's mesh (data_parallel, sequence_parallel) is the whole world.
        assert config["data_parallel_size"] * config["sequence_parallel_size"] == layout.world_size
        assert config["sequence_parallel_size"] == layout.cp
    else:
        assert "sequence_parallel_size" not in config and "data_parallel_size" not in config


def test_deepspeed_reads_the_sequence_parallel_keys_the_export_writes():
    """The installed DeepSpeed (0.19.8 in the dev environment) reads both keys
    together in ``initialize``; a JSON key DeepSpeed ignores would be accepted silently
    (``DeepSpeedConfig`` tolerates unknown keys), so the check is on its source."""
    deepspeed = pytest.importorskip("deepspeed")
    source = inspect.getsource(deepspeed.initialize)
    for key in ("sequence_parallel_size", "data_parallel_size"):
        assert f'config["{key}"]' in source, (
            f"deepspeed {deepspeed.__version__} no longer reads {key}"
        )
    assert '("data_parallel", "sequence_parallel")' in source  # sequence ranks innermost


@pytest.mark.parametrize("fmt", ["deepspeed", "megatron-deepspeed"])
@pytest.mark.parametrize(
    "layout,reason",
    [
        (_layout(zero_stage=2), "ZeRO-2 and ZeRO-3 with pipeline"),
        (_layout(zero_stage=3), "ZeRO-2 and ZeRO-3 with pipeline"),
        (_layout(vpp=2), "no interleaved schedule"),
    ],
    ids=["z2-pp", "z3-pp", "vpp"],
)
def test_deepspeed_formats_refuse_what_its_pipeline_engine_cannot_run(fmt, layout, reason, space):
    with pytest.raises(ExportError, match=reason):
        export(fmt, layout, space)


def _model_space(**model) -> SearchSpace:
    return space_from_dict({**SPACE, "model": {**SPACE["model"], **model}})


ULYSSES = _layout(tp=1, pp=1, dp=16, gas=16)


@pytest.mark.parametrize("fmt", ["deepspeed", "megatron-deepspeed"])
@pytest.mark.parametrize(
    "layout,model,reason",
    [
        (
            _layout(cp=2, dp=4, gas=64),
            {},
            r"neither tensor nor pipeline parallelism \(tp=2, pp=4\)",
        ),
        (
            dataclasses.replace(ULYSSES, cp=8, dp=8, gas=32),
            {"hidden_size": 768, "num_heads": 12},
            r"12 attention heads \(model.num_heads\) over the cp=8 ranks; valid cp: 2, 3, 4, 6, 12",
        ),
    ],
    ids=["tp-pp", "heads"],
)
def test_ulysses_refuses_what_it_cannot_split(fmt, layout, model, reason):
    """DeepSpeed-Ulysses gives each CP rank heads/cp whole heads, and runs without TP and PP."""
    with pytest.raises(ExportError, match=reason):
        export(fmt, layout, _model_space(**model))


def test_ulysses_kv_heads_megatron_deepspeed_needs_mha_deepspeed_needs_a_divisor():
    layout = dataclasses.replace(ULYSSES, cp=4, dp=4, gas=64)
    gqa = _model_space(num_kv_heads=8)  # 32 query heads, 8 K/V heads: cp 4 splits both
    with pytest.raises(ExportError, match="as many K/V heads as query heads"):
        export("megatron-deepspeed", layout, gqa)
    assert json.loads(export("deepspeed", layout, gqa))["sequence_parallel_size"] == 4
    # 24 heads, 6 K/V heads, cp 4: the heads split but 6 and 4 divide neither way.
    odd = _model_space(hidden_size=3072, num_heads=24, num_kv_heads=6)
    with pytest.raises(ExportError, match=r"6 K/V heads .* valid cp: 2, 3, 6, 12, 24"):
        export("deepspeed", layout, odd)


@pytest.mark.parametrize("layout", LAYOUTS, ids=ParallelLayout.short)
def test_torchtitan_toml_uses_v022_keys_and_reproduces_the_layout(layout, space):
    config = tomllib.loads(export("torchtitan", layout, space))
    assert set(config) == set(TORCHTITAN_KEYS)
    for section, keys in TORCHTITAN_KEYS.items():
        assert set(config[section]) <= keys, section
    training, parallel = config["training"], config["parallelism"]
    assert parallel["tensor_parallel_degree"] == layout.tp
    assert parallel["pipeline_parallel_degree"] == layout.pp
    assert parallel.get("context_parallel_degree", 1) == layout.cp
    # torchtitan's ParallelDims.seq_len_divisor, asserted by its parallelize_llama.
    assert training["seq_len"] % (layout.tp * 2 * layout.cp) == 0
    replicate = parallel["data_parallel_replicate_degree"]
    shard = parallel["data_parallel_shard_degree"]
    assert replicate * shard == layout.dp
    assert (shard > 1) == (layout.zero_stage > 0 and layout.dp > 1)
    assert training["global_batch_size"] == layout.global_batch
    assert training["seq_len"] == space.model.seq_length
    # torchtitan's arithmetic (train.py, pipeline_parallel.py): accumulation steps times
    # pipeline micro-batches must give back the trial's micro-batches per step.
    accumulation = training["global_batch_size"] // (training["local_batch_size"] * layout.dp)
    microbatches = (
        training["local_batch_size"] // parallel["pipeline_parallel_microbatch_size"]
        if layout.pp > 1
        else 1
    )
    assert accumulation * microbatches == layout.gas
    if layout.pp > 1:
        assert parallel["pipeline_parallel_schedule"] in TORCH_SCHEDULES
        assert parallel["pipeline_parallel_microbatch_size"] == layout.mbs
    if layout.vpp > 1:
        assert parallel["pipeline_parallel_schedule"] == "Interleaved1F1B"
        per_stage = parallel["pipeline_parallel_layers_per_stage"]
        assert space.model.num_layers // per_stage == layout.pp * layout.vpp
    assert config["activation_checkpoint"]["mode"] == layout.recompute


def test_torchtitan_runs_the_ring_with_its_sequence_rule(space):
    """cp > 1: torch's alltoall rotater (the ring), and torchtitan's seq_len % (tp*2*cp)
    refused with the numbers where the trial ran TP without sequence parallelism."""
    text = export("torchtitan", _layout(tp=1, pp=1, cp=2, dp=32, gas=8), space)
    parallel = tomllib.loads(text)["parallelism"]
    assert parallel["context_parallel_degree"] == 2
    assert parallel["context_parallel_rotate_method"] == "alltoall"
    assert parallel["data_parallel_replicate_degree"] == 32  # zero_stage 0 ...
    assert parallel["fsdp_reshard_after_forward"] == "never"  # ... but FSDP over cp anyway
    assert "# note: torchtitan shards parameters with FSDP over the cp ranks" in text
    layout = _layout(cp=2, dp=4, gas=64)  # tp 2, no sequence parallelism: parsearch needs % 4
    assert not layout.sequence_parallel
    with pytest.raises(
        ExportError,
        match=r"seq_len % \(tp \* 2 \* cp\) == 0, and model.seq_length 4100 % \(2 \* 2 \* 2\) = 4",
    ):
        export("torchtitan", layout, _model_space(seq_length=4100))
    assert "--context-parallel-size 2" in export("megatron", layout, _model_space(seq_length=4100))


def test_torchtitan_notes_what_it_cannot_express(space):
    text = export("torchtitan", _layout(zero_stage=1), space)
    assert "# note: ZeRO-1 has no torchtitan equivalent" in text
    assert "sequence parallelism" in text  # tp 2 without sequence parallel


def test_gpipe_schedule_maps_to_torch_names():
    data = {**SPACE, "trainer": {"kind": "builtin", "schedule": "gpipe"}}
    gpipe = space_from_dict(data)
    assert 'pipeline_parallel_schedule = "GPipe"' in export("torchtitan", _layout(), gpipe)
    interleaved = export("torchtitan", _layout(vpp=2), gpipe)
    assert 'pipeline_parallel_schedule = "LoopedBFS"' in interleaved


def test_megatron_output_is_one_flag_per_line(space):
    lines = export("megatron", _layout(recompute="full", cp=2, dp=4, gas=64), space).splitlines()
    assert all(line.startswith("--") for line in lines)
    assert "--recompute-method uniform" in lines
    assert {"--context-parallel-size 2", "--cp-comm-type p2p"} <= set(lines)


@pytest.mark.parametrize(
    "device,declared,expected",
    [("cpu", None, None), ("cuda", None, "bf16"), ("cpu", "bf16", "bf16"), ("cuda", "fp32", None)],
)
def test_deepspeed_config_turns_on_only_the_precision_the_device_trains_in(
    device, declared, expected
):
    """An fp32 CPU run exported as bf16 would change what the user's next run measures."""
    data = {**SPACE, "allocation": {**SPACE["allocation"], "device": device}}
    data["estimate"] = {"precision": declared} if declared else {}
    config = json.loads(export("deepspeed", _layout(pp=1, dp=32), space_from_dict(data)))
    assert [key for key in ("bf16", "fp16") if key in config] == ([expected] if expected else [])


def test_unknown_format_names_the_valid_ones(space):
    with pytest.raises(ExportError, match="megatron, megatron-deepspeed, deepspeed, torchtitan"):
        export("nemo", _layout(), space)
    assert list(EXPORTERS) == ["megatron", "megatron-deepspeed", "deepspeed", "torchtitan"]


def test_parsearch_best_prints_each_format_of_the_stored_best(tmp_path):
    """End to end: a simulated campaign, then ``parsearch best --format`` for each trainer."""
    root = Path(__file__).parent.parent
    store = tmp_path / "l8.db"

    def parsearch(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "parsearch", *args]
        return subprocess.run(command, capture_output=True, text=True, cwd=root)

    space_file = root / "search_spaces" / "llama3-8b-h200.yaml"
    ran = parsearch("run", str(space_file), "--store", str(store), "--backend", "simulate",
                    "--budget", "12", "--quiet")  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    best = json.loads(parsearch("best", "--store", str(store), "--format", "json").stdout)
    layout = ParallelLayout.from_dict(best["layout"])
    printed = {
        fmt: parsearch("best", "--store", str(store), "--format", fmt)
        for fmt in ("megatron", "deepspeed", "torchtitan")
    }
    deepspeed_runs_it = layout.vpp == 1 and not (layout.pp > 1 and layout.zero_stage > 1)
    for fmt, result in printed.items():
        if fmt == "deepspeed" and not deepspeed_runs_it:
            assert result.returncode == 2 and "cannot run" in result.stderr
        else:
            assert result.returncode == 0, (fmt, result.stderr)
    args = _parse(MEGATRON_LM_FLAGS, printed["megatron"].stdout)
    assert (args.tensor_model_parallel_size, args.micro_batch_size) == (layout.tp, layout.mbs)
    if deepspeed_runs_it:
        config = json.loads(printed["deepspeed"].stdout)
        assert config["train_batch_size"] == layout.global_batch
    parallel = tomllib.loads(printed["torchtitan"].stdout)["parallelism"]
    assert parallel["pipeline_parallel_degree"] == layout.pp


# --- mixtures of experts -------------------------------------------------------------------

# NVIDIA/Megatron-LM at d98e8a64: --num-experts, --moe-layer-freq (moe_freq_type) and
# --moe-router-load-balancing-type in megatron/training/arguments.py; the rest are
# TransformerConfig / ModelParallelConfig dataclass flags (argument_utils.py).
MEGATRON_MOE_FLAGS: dict[str, dict] = {
    **MEGATRON_LM_FLAGS,
    "--num-experts": {"type": int},
    "--moe-router-topk": {"type": int},
    "--moe-ffn-hidden-size": {"type": int},
    "--moe-shared-expert-intermediate-size": {"type": int},
    "--moe-layer-freq": {"type": str},  # moe_freq_type: read back with _moe_layer_pattern
    "--expert-model-parallel-size": {"type": int},
    "--expert-tensor-parallel-size": {"type": int},
    "--moe-token-dispatcher-type": {"choices": ["allgather", "alltoall", "flex"]},
    "--moe-grouped-gemm": {"action": "store_true"},
    "--moe-router-load-balancing-type": {
        "nargs": "+",
        "choices": [
            "aux_loss",
            "seq_aux_loss",
            "global_aux_loss",
            "sinkhorn",
            "quantile_balancing",
            "none",
        ],
    },
    "--moe-expert-capacity-factor": {"type": float},
}
# DeepSeek-V3's layer plan, 8 layers: first 3 dense, one shared expert.
MOE = {
    "num_experts": 16,
    "top_k": 4,
    "expert_ffn_hidden_size": 1024,
    "shared_expert_ffn_hidden_size": 1024,
    "first_dense_layers": 3,
}
MOE_LAYOUTS = [
    _layout(tp=2, pp=1, dp=32, gas=8, ep=8, etp=1, zero_stage=1, sequence_parallel=True),
    _layout(tp=4, pp=2, dp=8, gas=32, ep=4, etp=4, sequence_parallel=True),
    _layout(tp=1, pp=1, cp=2, dp=32, gas=8, ep=16, zero_stage=2),
]


def _moe_layer_pattern(value: str, num_layers: int) -> list[int]:
    """Megatron's moe_freq_type then its layer spec (gpt_layer_specs.py)."""
    if "[" not in value:
        return [int(i % int(value) == 0) for i in range(num_layers)]
    assert set(value) <= set("0123456789,[]()+*"), value  # what _eval_pattern accepts
    return eval(value)  # as Megatron's _eval_pattern does, on the characters checked


@pytest.mark.parametrize("layout", MOE_LAYOUTS, ids=ParallelLayout.short)
def test_megatron_exports_the_experts_and_their_layers(layout):
    space = _model_space(moe=MOE)
    args = _parse(MEGATRON_MOE_FLAGS, export("megatron", layout, space))
    assert (args.num_experts, args.moe_router_topk) == (16, 4)
    assert (args.moe_ffn_hidden_size, args.moe_shared_expert_intermediate_size) == (1024, 1024)
    assert (args.expert_model_parallel_size, args.expert_tensor_parallel_size) == (
        layout.ep,
        layout.etp,
    )
    assert args.moe_token_dispatcher_type == "alltoall" and args.moe_grouped_gemm
    assert args.moe_router_load_balancing_type == ["aux_loss"]
    assert args.moe_expert_capacity_factor is None  # dropless
    model = space.model
    pattern = _moe_layer_pattern(args.moe_layer_freq, model.num_layers)
    assert pattern == [int(model.moe.is_moe_layer(i)) for i in range(model.num_layers)]
    assert args.moe_layer_freq == "([0]*3+[1]*29)"


def test_megatron_moe_layer_freq_and_capacity():
    moe = {**MOE, "first_dense_layers": 0, "layer_freq": 2, "shared_expert_ffn_hidden_size": 0,
           "capacity_factor": 1.25}  # fmt: skip
    layout = MOE_LAYOUTS[0]
    args = _parse(MEGATRON_MOE_FLAGS, export("megatron", layout, _model_space(moe=moe)))
    assert args.moe_layer_freq == "2" and args.moe_expert_capacity_factor == 1.25
    assert args.moe_shared_expert_intermediate_size is None
    dense = export("megatron", _layout(), _model_space())
    assert "--num-experts" not in dense and "--expert" not in dense


def test_torchtitan_exports_ep_and_refuses_what_its_expert_mesh_cannot_fold():
    space = _model_space(moe=MOE)
    text = export("torchtitan", MOE_LAYOUTS[0], space)
    parallel = tomllib.loads(text)["parallelism"]
    assert (parallel["expert_parallel_degree"], parallel["expert_tensor_parallel_degree"]) == (8, 1)
    assert set(parallel) <= TORCHTITAN_KEYS["parallelism"] | {
        "expert_parallel_degree",
        "expert_tensor_parallel_degree",
    }
    # zero_stage 0: dp replicated, so only cp*tp = 4 ranks can take the experts; ep 8 cannot.
    replicated = _layout(tp=4, pp=1, dp=16, gas=16, ep=8, sequence_parallel=True)
    with pytest.raises(ExportError, match=r"\(1 \* 1 \* 4\) % \(8 \* 1\) = 4 \(zero_stage 0"):
        export("torchtitan", replicated, space)
    assert "--expert-model-parallel-size 8" in export("megatron", replicated, space)
    folds = export("torchtitan", dataclasses.replace(replicated, ep=4), space)
    assert "# note: torchtitan wraps the experts in FSDP whenever ep > 1" in folds
    ep1 = _layout(tp=4, pp=1, dp=16, gas=16, zero_stage=1, sequence_parallel=True)
    with pytest.raises(ExportError, match="with ep = 1 it splits the experts over the tp=4"):
        export("torchtitan", ep1, space)
    assert "expert_parallel_degree" not in export("torchtitan", _layout(), _model_space())


def test_deepspeed_carves_ep_out_of_dp_or_refuses():
    space = _model_space(moe=MOE)
    layout = _layout(tp=1, pp=1, dp=64, gas=4, ep=16, zero_stage=2)
    config = json.loads(export("deepspeed", layout, space))
    assert config["expert_parallel"] == {"enabled": True, "autoep_size": 16}
    # ep 8 folded into tp 4 * dp 2 (Megatron runs it): DeepSpeed needs ep | dp.
    folded = _layout(tp=4, pp=1, dp=2, gas=128, ep=8, sequence_parallel=True)
    with pytest.raises(ExportError, match="ep must divide dp, and dp 2 % ep 8 = 2"):
        export("deepspeed", folded, _model_space(moe=MOE, num_layers=32))
    with pytest.raises(ExportError, match=r"expert tensor parallelism \(etp=2\)"):
        export("deepspeed", _layout(tp=2, pp=1, dp=32, gas=8, ep=2, etp=2), space)
    with pytest.raises(ExportError, match="sizes every expert at --ffn-hidden-size"):
        export("megatron-deepspeed", layout, space)
    assert "expert_parallel" not in json.loads(
        export("deepspeed", _layout(pp=1, dp=32, gas=8), space)
    )


def test_deepspeed_reads_the_expert_parallel_keys_the_export_writes():
    """AutoEP's parser in the installed DeepSpeed reads the section as written."""
    pytest.importorskip("deepspeed")
    from deepspeed.module_inject.auto_ep_config import parse_autoep_config

    config = json.loads(
        export("deepspeed", _layout(tp=1, pp=1, dp=64, gas=4, ep=16), _model_space(moe=MOE))
    )
    parsed = parse_autoep_config(config["expert_parallel"])
    assert (parsed.enabled, parsed.autoep_size, parsed.expert_tensor_parallel_size) == (True, 16, 1)


def test_every_runnable_layout_of_a_shipped_moe_space_exports_or_is_refused_with_a_reason():
    """Megatron takes every layout parsearch's folding rule calls runnable (the rule is
    Megatron's), with ep and etp read back; torchtitan and DeepSpeed, stricter, export or
    refuse by name, and do both for some layouts of the space."""
    from parsearch.space import load_space

    space = load_space(Path(__file__).parent.parent / "search_spaces" / "qwen3-30b-a3b-h100.yaml")
    plan = space.plan()
    layouts = [layout for layout, _ in plan.feasible + plan.predicted_oom]
    assert any(layout.ep > 1 for layout in layouts), "the space searches no ep > 1"
    outcomes: dict[str, set[str]] = {"torchtitan": set(), "deepspeed": set()}
    megatron = _parser(MEGATRON_MOE_FLAGS)
    for layout in layouts:
        args = megatron.parse_args(shlex.split(export("megatron", layout, space)))
        assert (args.expert_model_parallel_size, args.expert_tensor_parallel_size) == (
            layout.ep,
            layout.etp,
        )
        for fmt, seen in outcomes.items():
            try:
                export(fmt, layout, space)
                seen.add("exported")
            except ExportError as error:
                assert f"cannot run {layout.short()}" in str(error), error
                seen.add("refused")
    assert outcomes == {"torchtitan": {"exported", "refused"}, "deepspeed": {"exported", "refused"}}


def _fp8_space() -> SearchSpace:
    from parsearch.space import load_space

    return load_space(Path(__file__).parent.parent / "search_spaces/llama3-70b-h100-fp8.yaml")


FP8_LAYOUT = ParallelLayout(
    tp=8, pp=4, dp=4, mbs=1, gas=128, zero_stage=1, sequence_parallel=True, precision="fp8"
)


def test_fp8_layout_exports_megatron_fp8_flags_and_torchtitan_float8_converter():
    space = _fp8_space()
    args = export("megatron", FP8_LAYOUT, space).split()
    at = args.index("--fp8-format")
    assert args[at : at + 4] == ["--fp8-format", "hybrid", "--fp8-recipe", "delayed"], args
    bf16 = export("megatron", dataclasses.replace(FP8_LAYOUT, precision="auto"), space)
    assert "--fp8-format" not in bf16, bf16
    toml = tomllib.loads(export("torchtitan", FP8_LAYOUT, space))
    assert toml["model"]["converters"] == ["quantize.linear.float8"], toml
    float8 = toml["quantize"]["linear"]["float8"]
    assert float8["recipe_name"] == "tensorwise" and float8["filter_fqns"] == ["output"], float8
    assert float8["enable_fsdp_float8_all_gather"] is True, float8


@pytest.mark.parametrize("fmt", ["deepspeed", "megatron-deepspeed"])
def test_deepspeed_formats_refuse_fp8_with_the_reason(fmt):
    with pytest.raises(ExportError, match="no FP8 training setting") as caught:
        export(fmt, FP8_LAYOUT, _fp8_space())
    assert "--format megatron" in str(caught.value), caught.value
