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

Mixtures of experts (``ep``, ``etp``) are searched under Megatron-core's folding rule (etp·ep
divides tp·cp·dp per stage). Megatron-LM takes every such layout, with the all-to-all
dispatcher and grouped GEMM the estimate models. torchtitan folds the experts only into its
sharded ranks ((dp_shard·cp·tp) % (ep·etp) == 0) and DeepSpeed carves them out of the
data-parallel ranks (ep divides dp): a layout either cannot express is refused with the
reason, as is Megatron-DeepSpeed's MoE, whose layer plan and expert width differ.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from parsearch.config import ModelSpec, MoESpec, ParallelLayout
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
    if space.model.moe is not None:
        args += _megatron_moe_args(layout, space.model)
    if layout.precision == "fp8":
        # Transformer Engine FP8 (transformer_config.py ``fp8``: e4m3 or hybrid; ``Fp8Recipe``
        # in megatron/core/enums.py): E4M3 forward, E5M2 gradients, amax taken in the cast
        # with a history (delayed scaling), the recipe the estimate's casts count.
        args += ["--fp8-format", "hybrid", "--fp8-recipe", "delayed"]
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
    _check_no_fp8(layout, "Megatron-DeepSpeed (with its ds_config.json)")
    _check_deepspeed_pipeline(layout, "Megatron-DeepSpeed")
    _check_ulysses(layout, space, "Megatron-DeepSpeed")
    if space.model.moe is not None:
        raise ExportError(
            f"Megatron-DeepSpeed cannot run {layout.short()} as measured: its MoE "
            f"(--num-experts, --moe-expert-parallel-size, megatron/model/transformer.py) sizes "
            f"every expert at --ffn-hidden-size, puts experts on the layers whose 1-based number "
            f"is a multiple of --expert-interval, and has no shared experts, and the "
            f"ds_config.json of --format deepspeed would switch on DeepSpeed's AutoEP beside it; "
            f"export with --format megatron"
        )
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

    With ep > 1, ``expert_parallel: {enabled, autoep_size}``: DeepSpeed 0.19.8's AutoEP
    (``deepspeed/module_inject/auto_ep_config.py`` ``parse_autoep_config``), which replaces
    the model's MoE blocks by expert-parallel ones of ``autoep_size`` ranks; see
    :func:`_check_deepspeed_experts` for what it cannot run.
    """
    _check_no_fp8(layout, "DeepSpeed")
    _check_deepspeed_pipeline(layout, "DeepSpeed")
    _check_ulysses(layout, space, "DeepSpeed")
    _check_deepspeed_experts(layout)
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
    if layout.ep > 1:
        config["expert_parallel"] = {"enabled": True, "autoep_size": layout.ep}
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

    Mixtures of experts: ``expert_parallel_degree`` and ``expert_tensor_parallel_degree``
    (v0.2.2 ``job_config.py``), written for an MoE model; the model itself is a torchtitan
    MoE model (llama4, deepseek_v3, qwen3) the user picks. See
    :func:`_check_torchtitan_experts` for what it cannot run.
    """
    _check_torchtitan_sequence(layout, space)
    _check_torchtitan_experts(layout, space.model)
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
    if space.model.moe is not None:
        parallelism["expert_parallel_degree"] = layout.ep
        parallelism["expert_tensor_parallel_degree"] = layout.etp
        if layout.ep > 1 and layout.zero_stage == 0:
            notes.append(
                "torchtitan wraps the experts in FSDP whenever ep > 1 (ParallelDims keeps "
                "its efsdp mesh); the trial replicated them (zero_stage 0)"
            )
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
    sections: list[tuple[str, dict[str, object]]] = []
    if layout.precision == "fp8":
        # torchao float8 linears (v0.2.x job_config.py ``Float8Linear``, converter registered
        # as "quantize.linear.float8"): tensorwise dynamic scaling, FP8 all-gather under FSDP,
        # the output layer left in bf16 as the estimate counts it.
        float8: dict[str, object] = {"recipe_name": "tensorwise", "filter_fqns": ["output"]}
        if layout.zero_stage:
            float8["enable_fsdp_float8_all_gather"] = True
            float8["precompute_float8_dynamic_scale_for_fsdp"] = True
        sections = [("model", {"converters": ["quantize.linear.float8"]})]
        sections.append(("quantize.linear.float8", float8))
        notes.append("float8 needs [compile] enable = true for its published speed")
    lines = [f"# parsearch layout {layout.short()}: torchtitan v0.2.x job config sections"]
    lines += [f"# note: {note}" for note in notes]
    for section, values in (
        ("training", training),
        ("parallelism", parallelism),
        ("activation_checkpoint", checkpoint),
        *sections,
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


def _megatron_moe_args(layout: ParallelLayout, model: ModelSpec) -> list[str]:
    """Megatron-core's MoE flags for ``model.moe`` and the layout's ``ep`` and ``etp``.

    Checked against NVIDIA/Megatron-LM at d98e8a64: ``--num-experts`` and ``--moe-layer-freq``
    (``moe_freq_type``: an int ``k`` makes layer ``i`` MoE when ``i % k == 0``, as
    ``MoESpec.is_moe_layer``; a bracketed list expression, evaluated by ``_eval_pattern``,
    gives one 0/1 per layer) and ``--moe-router-load-balancing-type`` in
    ``megatron/training/arguments.py``; the rest are ``TransformerConfig`` and
    ``ModelParallelConfig`` dataclass flags: ``--moe-router-topk``, ``--moe-ffn-hidden-size``,
    ``--moe-shared-expert-intermediate-size`` (the shared experts' summed width),
    ``--moe-token-dispatcher-type`` {allgather, alltoall, flex}, ``--moe-grouped-gemm``,
    ``--moe-expert-capacity-factor`` (unset: dropless), ``--expert-model-parallel-size`` and
    ``--expert-tensor-parallel-size`` (unset, Megatron takes tp: so always written). The
    all-to-all dispatcher and grouped GEMM are what the estimate models. The shape flags are
    written because ``--expert-model-parallel-size`` is refused without ``--num-experts``.
    """
    moe = model.moe
    assert moe is not None
    args = [
        "--num-experts",
        str(moe.num_experts),
        "--moe-router-topk",
        str(moe.top_k),
        "--moe-ffn-hidden-size",
        str(moe.expert_ffn_hidden_size),
    ]
    if moe.shared_expert_ffn_hidden_size:
        args += ["--moe-shared-expert-intermediate-size", str(moe.shared_expert_ffn_hidden_size)]
    args += ["--moe-layer-freq", _megatron_layer_freq(moe, model.num_layers)]
    args += [
        "--expert-model-parallel-size",
        str(layout.ep),
        "--expert-tensor-parallel-size",
        str(layout.etp),
        "--moe-token-dispatcher-type",
        "alltoall",
        "--moe-grouped-gemm",
        "--moe-router-load-balancing-type",
        "aux_loss",
    ]
    if moe.capacity_factor is not None:
        args += ["--moe-expert-capacity-factor", str(moe.capacity_factor)]
    return args


def _megatron_layer_freq(moe: MoESpec, num_layers: int) -> str:
    """``--moe-layer-freq``: ``k`` alone when no leading layer is dense, else the per-layer
    pattern run-length coded, e.g. ``([0]*3+[1]*58)`` for DeepSeek-V3's first three dense
    layers (only digits, brackets, ``*``, ``+``: what ``_eval_pattern`` accepts)."""
    if moe.first_dense_layers == 0:
        return str(moe.layer_freq)
    pattern = [int(moe.is_moe_layer(i)) for i in range(num_layers)]
    runs: list[list[int]] = []
    for value in pattern:
        if runs and runs[-1][0] == value:
            runs[-1][1] += 1
        else:
            runs.append([value, 1])
    return "(" + "+".join(f"[{value}]*{count}" for value, count in runs) + ")"


def _check_no_fp8(layout: ParallelLayout, trainer: str) -> None:
    """DeepSpeed's config has no FP8 training setting (bf16 and fp16 only): an FP8 layout
    cannot be exported to it as measured."""
    if layout.precision == "fp8":
        raise ExportError(
            f"{trainer} cannot run {layout.short()}: DeepSpeed's config has no FP8 training "
            "setting (only bf16 and fp16); export with --format megatron (Transformer Engine "
            "FP8) or torchtitan (torchao float8)"
        )


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


def _check_deepspeed_experts(layout: ParallelLayout) -> None:
    """DeepSpeed carves expert parallelism out of data parallelism.

    deepspeed 0.19.8: ``deepspeed.utils.groups._create_expert_and_data_parallel`` lays each
    expert-parallel group over ``ep`` data-parallel ranks of one tensor-parallel lane
    (``ep`` must divide them), and AutoEP's ``validate_folding_global``
    (``module_inject/auto_ep_folding.py``) reserves ``expert_tensor_parallel_size`` != 1 and
    refuses folding beside pipeline parallelism. Beside Ulysses (cp > 1) its groups would
    take the sequence ranks, not parsearch's, so that is refused too.
    """
    if layout.ep == 1:
        return
    where = f"DeepSpeed cannot run {layout.short()}"
    if layout.dp % layout.ep:
        raise ExportError(
            f"{where}: its expert-parallel groups are carved out of the data-parallel ranks, "
            f"so ep must divide dp, and dp {layout.dp} % ep {layout.ep} = "
            f"{layout.dp % layout.ep}; pick a trial whose ep divides dp, or export with "
            f"--format megatron"
        )
    if layout.etp > 1 or layout.cp > 1 or (layout.tp > 1 and layout.pp > 1):
        raise ExportError(
            f"{where}: its AutoEP expert parallelism runs neither expert tensor parallelism "
            f"(etp={layout.etp}), nor beside sequence parallelism (cp={layout.cp}), nor "
            f"folded into tp beside pp (tp={layout.tp}, pp={layout.pp}); export with "
            f"--format megatron"
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


def _check_torchtitan_experts(layout: ParallelLayout, model: ModelSpec) -> None:
    """torchtitan v0.2.2's expert mesh, stricter than Megatron's folding.

    ``ParallelDims.build_mesh`` unflattens each stage into (dp_replicate, efsdp, ep, etp) with
    ``efsdp = dp_shard * cp * tp / (etp * ep)``: the experts fold only into the sharded
    data-parallel, cp and tp ranks, never the replicated ones (parsearch exports zero_stage 0
    as pure replication, dp_shard 1). With ep 1, ``apply_moe_ep_tp``
    (``models/llama4/infra/parallelize.py``) splits the experts over the tp ranks whatever
    ``expert_tensor_parallel_degree`` says, so a trial that kept them whole there (etp 1)
    has no equivalent.
    """
    if model.moe is None:
        return
    where = f"torchtitan cannot run {layout.short()}"
    if layout.ep == 1 and layout.etp != layout.tp:
        raise ExportError(
            f"{where}: with ep = 1 it splits the experts over the tp={layout.tp} ranks "
            f"(expert_tensor_parallel_degree has no effect), but the trial ran etp="
            f"{layout.etp}; pick a trial with ep > 1 or etp = tp, or export with --format megatron"
        )
    dp_shard = layout.dp if layout.zero_stage > 0 else 1
    folded = dp_shard * layout.cp * layout.tp
    if folded % (layout.ep * layout.etp):
        raise ExportError(
            f"{where}: it folds the experts only into the sharded ranks, (dp_shard * cp * tp) "
            f"% (ep * etp) == 0, and ({dp_shard} * {layout.cp} * {layout.tp}) % ({layout.ep} * "
            f"{layout.etp}) = {folded % (layout.ep * layout.etp)} (zero_stage "
            f"{layout.zero_stage}: dp_shard {dp_shard}); pick a trial with zero_stage >= 1, or "
            f"export with --format megatron"
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
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
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
