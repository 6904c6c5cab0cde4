"""A layout as the settings of the trainers people run: Megatron-LM, Megatron-DeepSpeed,
DeepSpeed and torchtitan.

A search is only useful if its answer can be pasted into the real training job, so every name
below was checked against the trainer's own source (cited at each function, with the commit
read). Settings a trainer cannot express are refused with :class:`ExportError` instead of
being silently approximated into a different layout than the one that was measured.

Each exporter takes the layout and the campaign's :class:`~parsearch.space.SearchSpace` (for
the model's layer count, sequence length, precision and pipeline schedule) and returns text.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from parsearch.config import ParallelLayout
from parsearch.errors import ParsearchError
from parsearch.space import SearchSpace, space_from_dict

if TYPE_CHECKING:
    from parsearch.store import Campaign, TrialRecord


class ExportError(ParsearchError):
    """The layout has no faithful equivalent in the requested trainer's settings."""

    exit_code = 2


def megatron_args(layout: ParallelLayout, space: SearchSpace) -> str:
    """Megatron-LM arguments for ``pretrain_gpt.py``, one per line (``$(...)``-safe).

    Checked against NVIDIA/Megatron-LM ``megatron/training/arguments.py`` at d98e8a64
    (2026-08-22) by building its real parser: ``--tensor-model-parallel-size``,
    ``--pipeline-model-parallel-size``, ``--micro-batch-size``, ``--global-batch-size`` (int),
    ``--num-layers-per-virtual-pipeline-stage`` (int), ``--sequence-parallel`` and
    ``--use-distributed-optimizer`` (store_true), ``--recompute-granularity`` {full,
    selective}, ``--recompute-method`` {uniform, block}, ``--recompute-num-layers`` (int),
    ``--use-megatron-fsdp`` and ``--data-parallel-sharding-strategy`` {no_shard, optim,
    optim_grads, optim_grads_params}. Megatron derives DP from the world size, so there is
    no DP flag; the global batch fixes gradient accumulation (global / (mbs * dp)).
    """
    args = _common_megatron_args(layout, space)
    if layout.zero_stage == 1:
        # The distributed optimizer shards optimizer states and fp32 master weights: ZeRO-1.
        args.append("--use-distributed-optimizer")
    elif layout.zero_stage in (2, 3):
        strategy = "optim_grads" if layout.zero_stage == 2 else "optim_grads_params"
        args += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", strategy]
    if layout.vpp > 1:
        args += [
            "--num-layers-per-virtual-pipeline-stage",
            str(space.model.num_layers // (layout.pp * layout.vpp)),
        ]
    return _one_per_line(args)


def megatron_deepspeed_args(layout: ParallelLayout, space: SearchSpace) -> str:
    """Megatron-DeepSpeed arguments (the trainer of the Frontier study), one per line.

    Checked against microsoft/Megatron-DeepSpeed ``megatron/arguments.py`` at f4157bea
    (2024-12-24) by building its real parser (DeepSpeed's own ``--deepspeed`` and
    ``--deepspeed_config`` come from ``deepspeed.add_config_arguments``): besides the
    Megatron-LM flags above, ``--zero-stage`` (int), ``--no-pipeline-parallel`` (how its
    examples run without DeepSpeed's pipeline engine when PP is 1) and
    ``--deepspeed-activation-checkpointing``. Pair it with ``--format deepspeed`` for
    ``ds_config.json``; the batch sizes in both must agree, and do.
    """
    _check_deepspeed_pipeline(layout, "Megatron-DeepSpeed")
    args = _common_megatron_args(layout, space)
    if layout.pp == 1:
        args.append("--no-pipeline-parallel")
    args += ["--deepspeed", "--deepspeed_config", "ds_config.json"]
    args += ["--zero-stage", str(layout.zero_stage)]
    if layout.recompute == "full":
        args.append("--deepspeed-activation-checkpointing")
    return _one_per_line(args)


def deepspeed_config(layout: ParallelLayout, space: SearchSpace) -> str:
    """A DeepSpeed JSON fragment: batch sizes, ZeRO stage, precision, checkpointing.

    Keys checked against deepspeedai/DeepSpeed at edaa7221 (2026-08-22):
    ``deepspeed/runtime/constants.py`` (``train_batch_size``,
    ``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``, ``bf16``, ``fp16``),
    ``deepspeed/runtime/zero/config.py`` (``zero_optimization.stage``) and
    ``deepspeed/runtime/activation_checkpointing/config.py`` (``activation_checkpointing``
    and its ``partition_activations``, ``contiguous_memory_optimization``,
    ``cpu_checkpointing``). DeepSpeed requires train_batch_size = micro * accumulation * DP
    world size, where DP excludes the TP and PP ranks (Megatron passes its ``mpu``).
    """
    _check_deepspeed_pipeline(layout, "DeepSpeed")
    config: dict[str, object] = {
        "train_batch_size": layout.global_batch,
        "train_micro_batch_size_per_gpu": layout.mbs,
        "gradient_accumulation_steps": layout.gas,
        "zero_optimization": {"stage": layout.zero_stage},
    }
    precision = space.estimate.precision
    if precision in ("bf16", "fp16"):
        config[precision] = {"enabled": True}
    if layout.recompute == "full":
        # Only configures DeepSpeed's checkpointing; the model must still checkpoint each
        # layer (Megatron-DeepSpeed: --deepspeed-activation-checkpointing, printed by
        # --format megatron-deepspeed). Selective recompute is Megatron's, not DeepSpeed's.
        config["activation_checkpointing"] = {
            "partition_activations": False,
            "contiguous_memory_optimization": False,
            "cpu_checkpointing": False,
        }
    return json.dumps(config, indent=2)


def torchtitan_toml(layout: ParallelLayout, space: SearchSpace) -> str:
    """torchtitan's job-config TOML sections for the layout (torchtitan v0.2.x).

    Keys checked against pytorch/torchtitan ``torchtitan/config/job_config.py`` at tag
    v0.2.2, the latest release (``[training] local_batch_size, global_batch_size, seq_len``;
    ``[parallelism] data_parallel_replicate_degree, data_parallel_shard_degree,
    fsdp_reshard_after_forward, tensor_parallel_degree, pipeline_parallel_degree,
    pipeline_parallel_schedule, pipeline_parallel_microbatch_size,
    pipeline_parallel_layers_per_stage, pipeline_parallel_first_stage_less_layers,
    pipeline_parallel_last_stage_less_layers``; ``[activation_checkpoint] mode,
    selective_ac_option``) and ``torchtitan/distributed/pipeline_parallel.py`` (micro-batches
    = local_batch_size / pipeline_parallel_microbatch_size). torchtitan's main branch has since
    replaced TOML files with Python configs (commit 9810191b, 2026-02-23); the same fields live
    on ``Trainer.Config.parallelism`` there, but the batch fields were renamed.
    """
    notes: list[str] = []
    # With PP every micro-batch goes through the schedule (no separate accumulation);
    # without, torchtitan accumulates global / (local * dp) micro-batches.
    local_batch = layout.mbs * layout.gas if layout.pp > 1 else layout.mbs
    training = {
        "local_batch_size": local_batch,
        "global_batch_size": layout.global_batch,
        "seq_len": space.model.seq_length,
    }
    parallelism: dict[str, object] = {}
    if layout.zero_stage == 0:
        parallelism["data_parallel_replicate_degree"] = layout.dp
        parallelism["data_parallel_shard_degree"] = 1
    else:
        parallelism["data_parallel_replicate_degree"] = 1
        parallelism["data_parallel_shard_degree"] = layout.dp
        # FSDP2 keeping parameters gathered after forward behaves like ZeRO-2; resharding
        # them after forward is ZeRO-3. torchtitan has no optimizer-only sharding (ZeRO-1).
        parallelism["fsdp_reshard_after_forward"] = "always" if layout.zero_stage == 3 else "never"
        if layout.zero_stage == 1:
            notes.append("ZeRO-1 has no torchtitan equivalent; FSDP also shards grads and weights")
    parallelism["tensor_parallel_degree"] = layout.tp
    if layout.tp > 1 and not layout.sequence_parallel:
        notes.append("torchtitan always applies sequence parallelism with TP; the trial did not")
    parallelism["pipeline_parallel_degree"] = layout.pp
    if layout.pp > 1:
        parallelism["pipeline_parallel_schedule"] = _torch_schedule(space.schedule, layout.vpp)
        parallelism["pipeline_parallel_microbatch_size"] = layout.mbs
        if layout.vpp > 1:
            # Exactly pp*vpp equal stages, as measured: no lighter first and last stage.
            parallelism["pipeline_parallel_layers_per_stage"] = space.model.num_layers // (
                layout.pp * layout.vpp
            )
            parallelism["pipeline_parallel_first_stage_less_layers"] = 0
            parallelism["pipeline_parallel_last_stage_less_layers"] = 0
    checkpoint: dict[str, object] = {"mode": layout.recompute}
    if layout.recompute == "selective":
        checkpoint["selective_ac_option"] = "op"
    lines = [f"# parsearch layout {layout.short()}: torchtitan v0.2.x job config sections"]
    lines += [f"# note: {note}" for note in notes]
    for section, values in (
        ("training", training),
        ("parallelism", parallelism),
        ("activation_checkpoint", checkpoint),
    ):
        lines += ["", f"[{section}]"]
        lines += [f"{key} = {_toml_value(value)}" for key, value in values.items()]
    return "\n".join(lines)


# Name -> exporter; the CLI's ``--format`` choices and the report's best-layout section.
EXPORTERS: dict[str, Callable[[ParallelLayout, SearchSpace], str]] = {
    "megatron": megatron_args,
    "megatron-deepspeed": megatron_deepspeed_args,
    "deepspeed": deepspeed_config,
    "torchtitan": torchtitan_toml,
}


def export(name: str, layout: ParallelLayout, space: SearchSpace) -> str:
    """Render ``layout`` in the format called ``name`` (a key of :data:`EXPORTERS`)."""
    try:
        exporter = EXPORTERS[name]
    except KeyError:
        raise ExportError(
            f"unknown export format {name!r}; valid: {', '.join(EXPORTERS)}"
        ) from None
    return exporter(layout, space)


def record_formatter(name: str) -> Callable[[TrialRecord, Campaign], str]:
    """The exporter ``name`` as a ``parsearch best --format`` formatter (trial, campaign).

    The campaign keeps its space as loaded, so the export uses the model and settings the
    trial was measured with, not whatever the space file says today.
    """
    exporter = EXPORTERS[name]

    def format_record(record: TrialRecord, campaign: Campaign) -> str:
        space = space_from_dict(campaign.space, source=campaign.space_path or campaign.name)
        return exporter(record.layout, space)

    return format_record


def _common_megatron_args(layout: ParallelLayout, space: SearchSpace) -> list[str]:
    """Flags Megatron-LM and Megatron-DeepSpeed spell and mean the same way."""
    args = [
        "--tensor-model-parallel-size",
        str(layout.tp),
        "--pipeline-model-parallel-size",
        str(layout.pp),
        "--micro-batch-size",
        str(layout.mbs),
        "--global-batch-size",
        str(layout.global_batch),
    ]
    if layout.sequence_parallel:
        args.append("--sequence-parallel")
    if layout.recompute == "full":
        # Every layer recomputed: uniform chunks of one layer (DeepSpeed's pipeline engine
        # supports only the uniform method).
        args += [
            "--recompute-granularity",
            "full",
            "--recompute-method",
            "uniform",
            "--recompute-num-layers",
            "1",
        ]
    elif layout.recompute == "selective":
        args += ["--recompute-granularity", "selective"]  # Megatron refuses a method here
    return args


def _check_deepspeed_pipeline(layout: ParallelLayout, trainer: str) -> None:
    """DeepSpeed's pipeline engine limits: checked in ``deepspeed/runtime/pipe/engine.py``."""
    if layout.pp > 1 and layout.zero_stage >= 2:
        raise ExportError(
            f"{trainer} cannot run {layout.short()}: its pipeline engine refuses ZeRO-2 and "
            f"ZeRO-3 with pipeline parallelism (pp={layout.pp}); pick a trial with zero_stage "
            f"<= 1 or pp = 1, or export with --format megatron"
        )
    if layout.vpp > 1:
        raise ExportError(
            f"{trainer} cannot run {layout.short()}: DeepSpeed's pipeline engine has no "
            f"interleaved schedule (vpp={layout.vpp}); export with --format megatron"
        )


def _torch_schedule(schedule: str, vpp: int) -> str:
    """torch.distributed.pipelining's schedule name (``get_schedule_class``)."""
    if schedule == "gpipe":
        return "LoopedBFS" if vpp > 1 else "GPipe"
    return "Interleaved1F1B" if vpp > 1 else "1F1B"


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(str(value))  # a TOML basic string is JSON-escaped text


def _one_per_line(args: list[str]) -> str:
    """Each flag with its value on one line: readable, and word-splits in ``$(...)``."""
    lines: list[str] = []
    for arg in args:
        if arg.startswith("--") or not lines:
            lines.append(arg)
        else:
            lines[-1] += f" {arg}"
    return "\n".join(lines)
