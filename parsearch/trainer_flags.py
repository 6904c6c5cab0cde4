"""A layout as the settings of the trainers people run: Megatron-LM, Megatron-DeepSpeed,
DeepSpeed and torchtitan.

A search is only useful if its answer can be pasted into the real training job, so every name
below was checked against the trainer's own source (cited at each function, with the commit
read). Settings a trainer cannot express are refused with :class:`ExportError` instead of
being silently approximated into a different layout than the one that was measured.

Each exporter takes the layout and the campaign's :class:`~parsearch.space.SearchSpace` (for
the model's layer count, heads, sequence length, precision and pipeline schedule) and returns
text.

Context parallelism (``cp``) is estimated, and run by the built-in trainer, as a ring: each CP
rank passes its K/V chunk to the next with send/recv, overlapped with attention. Megatron-LM
(``--cp-comm-type p2p``) and torchtitan v0.2.x (``context_parallel_rotate_method =
"alltoall"``, torch's ring rotater) are told to run that ring. DeepSpeed and Megatron-DeepSpeed
have no ring: their sequence parallelism is Ulysses, which all-to-alls Q, K, V and the output
so each rank attends over the whole sequence for ``heads/cp`` heads. It splits the ranks, the
tokens and the activation memory the same way, so the layout is exported, but its
communication is not the one measured (four all-to-alls per layer that do not overlap compute,
instead of a ring hidden behind attention): re-measure the throughput there before trusting
the ranking. What Ulysses cannot run (heads not divisible by cp, TP or PP beside it,
grouped-query attention in Megatron-DeepSpeed) is refused with the reason.
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
    optim_grads, optim_grads_params}, ``--context-parallel-size`` (int) and ``--cp-comm-type``
    (``nargs='+'``, str: p2p, a2a, allgather or a2a+p2p; ``p2p`` is the ring the estimate
    models). Megatron derives DP from the world size (world / (tp*cp*pp)), so there is no DP
    flag; the global batch fixes gradient accumulation (global / (mbs * dp)). Its CP runs only
    in Transformer Engine's attention (the local ``DotProductAttention`` asserts cp == 1), the
    default ``--transformer-impl``.
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
    if layout.cp > 1:
        args += ["--context-parallel-size", str(layout.cp), "--cp-comm-type", MEGATRON_RING]
    return _one_per_line(args)


def megatron_deepspeed_args(layout: ParallelLayout, space: SearchSpace) -> str:
    """Megatron-DeepSpeed arguments (the trainer of the Frontier study), one per line.

    Checked against microsoft/Megatron-DeepSpeed ``megatron/arguments.py`` at f4157bea
    (2024-12-24) by building its real parser (DeepSpeed's own ``--deepspeed`` and
    ``--deepspeed_config`` come from ``deepspeed.add_config_arguments``): besides the
    Megatron-LM flags above, ``--zero-stage`` (int), ``--no-pipeline-parallel`` (how its
    examples run without DeepSpeed's pipeline engine when PP is 1) and
    ``--deepspeed-activation-checkpointing``, and ``--ds-sequence-parallel-size`` (int) for
    context parallelism, which it runs as DeepSpeed-Ulysses (see the module docstring). Pair
    it with ``--format deepspeed`` for ``ds_config.json``; the batch sizes in both must agree,
    and do.
    """
    _check_deepspeed_pipeline(layout, "Megatron-DeepSpeed")
    _check_ulysses(layout, space, "Megatron-DeepSpeed")
    args = _common_megatron_args(layout, space)
    if layout.pp == 1:
        args.append("--no-pipeline-parallel")
    args += ["--deepspeed", "--deepspeed_config", "ds_config.json"]
    args += ["--zero-stage", str(layout.zero_stage)]
    if layout.recompute == "full":
        args.append("--deepspeed-activation-checkpointing")
    if layout.cp > 1:
        args += ["--ds-sequence-parallel-size", str(layout.cp)]
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
    world size, where DP excludes the TP, CP and PP ranks (Megatron passes its ``mpu``).

    With cp > 1, ``sequence_parallel_size`` and ``data_parallel_size``: given both,
    ``deepspeed.initialize`` (``deepspeed/__init__.py``, deepspeed 0.19.8) builds a
    (data_parallel, sequence_parallel) device mesh, sequence ranks innermost as parsearch places
    cp, and reduces gradients and checks the batch over its data-parallel ranks. The model must
    still run Ulysses attention over that group (``UlyssesSPAttentionHF`` or
    ``DistributedAttention``); see the module docstring for what that changes.
    """
    _check_deepspeed_pipeline(layout, "DeepSpeed")
    _check_ulysses(layout, space, "DeepSpeed")
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
    if layout.cp > 1:
        config["sequence_parallel_size"] = layout.cp
        config["data_parallel_size"] = layout.dp
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

    Context parallelism: ``context_parallel_degree`` and ``context_parallel_rotate_method``
    (v0.2.2 ``job_config.py``; ``"alltoall"`` selects torch's ``_AllToAllRotater``, which sends
    each K/V shard to the next rank: the ring; its default ``"allgather"`` gathers every shard
    at once). torchtitan 0.3.0 keeps ``context_parallel_degree`` on ``ParallelismConfig`` but
    has no rotate method. torchtitan needs ``seq_len % (tp * 2 * cp) == 0`` whether or not the
    trial used sequence parallelism (``ParallelDims.seq_len_divisor``, asserted in
    ``models/llama3/infra/parallelize.py``), and with cp > 1 it always shards parameters with
    FSDP over the dp_shard and cp ranks (``ParallelDims.fsdp_enabled``).
    """
    _check_torchtitan_sequence(layout, space)
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
    if layout.cp > 1 and layout.zero_stage == 0:
        # Kept gathered after forward: the fewest extra all-gathers FSDP allows.
        parallelism["fsdp_reshard_after_forward"] = "never"
        notes.append(
            "torchtitan shards parameters with FSDP over the cp ranks whenever cp > 1; the "
            "trial replicated them (zero_stage 0)"
        )
    parallelism["tensor_parallel_degree"] = layout.tp
    if layout.tp > 1 and not layout.sequence_parallel:
        notes.append("torchtitan always applies sequence parallelism with TP; the trial did not")
    if layout.cp > 1:
        parallelism["context_parallel_degree"] = layout.cp
        parallelism["context_parallel_rotate_method"] = "alltoall"  # the ring
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


# Megatron-core's --cp-comm-type for the ring the estimate models ("Exchange KV chunks with P2P
# communications in ring topology ... can be overlapped with attention compute",
# megatron/core/transformer/transformer_config.py, cp_comm_type, at d98e8a64).
MEGATRON_RING = "p2p"

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


def _check_ulysses(layout: ParallelLayout, space: SearchSpace, trainer: str) -> None:
    """What DeepSpeed-Ulysses needs of a cp > 1 layout, or :class:`ExportError` saying why.

    Megatron-DeepSpeed at f4157bea: ``megatron/core/parallel_state.py`` asserts tp == pp == 1
    beside ``--ds-sequence-parallel-size``; ``megatron/model/transformer.py`` asserts
    ``num_attention_heads % sp == 0`` and an equal K/V projection (no grouped-query
    attention). DeepSpeed 0.19.8: the (data_parallel, sequence_parallel) mesh covers the whole
    world (so tp == pp == 1) and ``UlyssesSPAttentionHF`` (``runtime/sequence_parallel/
    ulysses_sp.py``) needs ``heads % sp == 0`` and kv_heads and sp dividing one or the other.
    """
    if layout.cp == 1:
        return
    where = f"{trainer} cannot run {layout.short()} as DeepSpeed-Ulysses sequence parallelism"
    if layout.tp > 1 or layout.pp > 1:
        raise ExportError(
            f"{where}: it runs beside neither tensor nor pipeline parallelism (tp={layout.tp}, "
            f"pp={layout.pp}); pick a trial with tp = pp = 1, or export with --format megatron "
            f"or torchtitan"
        )
    model = space.model
    if model.num_heads % layout.cp:
        raise ExportError(
            f"{where}: it splits the {model.num_heads} attention heads (model.num_heads) over "
            f"the cp={layout.cp} ranks; valid cp: {_divisors(model.num_heads)}"
        )
    kv_heads = model.kv_heads
    if trainer == "Megatron-DeepSpeed" and kv_heads != model.num_heads:
        raise ExportError(
            f"{where}: its Ulysses attention needs as many K/V heads as query heads "
            f"(model.num_kv_heads {kv_heads} != model.num_heads {model.num_heads}); export "
            f"with --format deepspeed, megatron or torchtitan"
        )
    if kv_heads % layout.cp and layout.cp % kv_heads:
        raise ExportError(
            f"{where}: the {kv_heads} K/V heads (model.num_kv_heads) and cp={layout.cp} must "
            f"divide one or the other; valid cp: {_divisors(model.num_heads, kv_heads)}"
        )


def _divisors(heads: int, kv_heads: int | None = None) -> str:
    """cp values > 1 that split ``heads`` (and pair with ``kv_heads``), for an error."""
    valid = [
        cp
        for cp in range(2, heads + 1)
        if heads % cp == 0 and (kv_heads is None or kv_heads % cp == 0 or cp % kv_heads == 0)
    ]
    return ", ".join(map(str, valid)) or "none"


def _check_torchtitan_sequence(layout: ParallelLayout, space: SearchSpace) -> None:
    """torchtitan's ``seq_len % (tp * 2 * cp)`` (``ParallelDims.seq_len_divisor``), which it
    asserts for every layout, even at cp 1 and where the trial ran TP without sequence
    parallelism (parsearch's own rule is looser there)."""
    divisor = layout.tp * 2 * layout.cp
    seq = space.model.seq_length
    if seq % divisor:
        raise ExportError(
            f"torchtitan cannot run {layout.short()}: it needs seq_len % (tp * 2 * cp) == 0, "
            f"and model.seq_length {seq} % ({layout.tp} * 2 * {layout.cp}) = {seq % divisor}; "
            f"pick a trial whose tp*2*cp divides {seq}"
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
