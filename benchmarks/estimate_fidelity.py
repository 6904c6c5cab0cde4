"""The analytic estimate against published A100 measurements and Megatron-LM's memory formula.

Sets (each transcribed below with its source):

* ``megatron-memory``: Megatron-LM's ``megatron/training/theoretical_memory_usage.py``
  (NVIDIA/Megatron-LM commit 1bcb3b9e0b029c6109d8d32872645bd540052963), reimplemented here:
  ``compute_weight_and_optimizer_memory`` (dense GPT), ``compute_activation_memory`` with
  sequence parallel + selective recompute (Korthikanti et al.'s ``34·s·b·h/t`` per layer)
  and ``compute_activation_memory_without_sp`` otherwise (``s·b·h·(10 + 24/t)`` per layer,
  token ids and embedding dropout mask on the first stage, x1.05). Neither branch models full
  recompute; there Korthikanti et al. 2022 (arXiv 2205.05198) Table 2's ``2·s·b·h`` per layer
  stands in (marked "full" below).
* ``narayanan-table1``: Narayanan et al. 2021, "Efficient Large-Scale Language Model
  Training on GPU Clusters Using Megatron-LM" (arXiv 2104.04473), Table 1: weak scaling, 1.7B
  to 1T on up to 3072 A100s, achieved teraFLOP/s per GPU (counting recompute's FLOPs, their
  Eq. 3). Runs used activation recomputation; micro-batch 1 and the non-interleaved schedule
  are assumed (the table lists neither).
* ``korthikanti-table5``: Korthikanti et al. 2022 (arXiv 2205.05198), Table 5, iteration time
  with full recompute vs sequence parallel + selective recompute for the Table 3
  configurations (22B/175B/530B/1T, TP 8, DP 1, micro-batch 1 assumed).
  The SP+selective times reproduce the MFU the Megatron-LM README prints for them
  (41.5 / 51.4 / 56.0 / 56.3%), checked in :func:`main`.
* ``hagemann2023``: Hagemann et al. 2023 (arXiv 2311.05610), every FlashAttention-2 run of
  their five LLaMA layout sweeps on 64-256 A100 80GB (``replay/hagemann2023.csv``, see
  ``replay/README.md``), each predicted under its replay space file: throughput over the
  runs that fit, and which runs the estimate expects to fit against which ran out of memory.
* ``cp-published`` (issue 47, item 7): context-parallel training throughput as published.
  NeMo's "Long Sequence Performance" page (NVIDIA/NeMo ``docs/source/performance/
  performance_long_sequence.md``, commit 9421f21a): the "LLAMA2-7B (FP8) - H100" table
  (NeMo 24.03.01, DGX H100), the with-CP columns (TP, PP, DP, CP, TFLOP/s per GPU) and the
  batch (the same page's "LLAMA3-8B (FP8) - B200" table is left out: its TP·PP·DP·CP is a
  quarter of its GPU count on every row, 2 of 8 on the first, so its layouts are not known);
  and
  torchtitan's ``benchmarks/llama3_h100_202412_torchtitan.md`` (pytorch/torchtitan, runs of
  2024-12, Grand Teton H100 96 GB HBM2e at 500 W, 400 Gb/s per GPU) Table 2 (Llama 3.1 8B,
  8 GPUs, FSDP + CP, local batch 1, full activation checkpointing) and Table 6 (Llama 3.1
  405B, 512 GPUs, TP 8, PP 8, FSDP + CP, local batch 8, 1F1B, full checkpointing), tokens/s
  per GPU. Every run there is FP8 (Transformer Engine; torchao Float8 linears), which the
  estimate does not model: it times bf16 at the bf16 peak, so its ratios sit below 1 by
  about the FP8 speed-up (1.1-1.5x on H100, REFERENCE.md); the order between CP degrees is
  the check. NeMo's TFLOP/s count full (non-causal) attention, as ``flops_per_step`` does
  (``nemo/utils/flops_formulas.py``'s ``llama2``: ``12 + 12·g/a + 18·f/h + 12·s/h +
  6·V/(L·h)`` per ``B·s·L·h²``), so the ratio of TFLOP/s is the ratio of tokens/s. Assumed
  (the sources do not say): micro-batch 1; NeMo with sequence parallel under TP, its
  distributed optimizer (ZeRO-1) and no recompute; torchtitan's micro-batches of 1 (local
  batch 8 = 8 micro-batches under PP).
  405B's 126 layers on 8 stages: the estimate gives each stage 15 (torchtitan splits
  unevenly), so its 405B step is ~5% short.
* ``moe-published`` (issue 49, item 7): mixture-of-experts training throughput as published
  on DGX H100 by NVIDIA's Megatron-Bridge performance summary (NVIDIA-NeMo/Megatron-Bridge
  ``docs/performance-summary-archive.md``, commit 0a25f911: the "26.02 NeMo Container"
  per-model tables' DGX-H100 rows, and the "25.11" and "25.09" DGX-H100 tables; GPUs, precision,
  GBS, MBS, sequence, TP, PP, CP, VP, EP, tokens/s per GPU, model TFLOP/s per GPU). Every MoE
  row there is token-dropless with "the token distribution among experts force-balanced" (the
  page's note; the 25.09 Qwen3 rows are "tokendrop", taken at capacity factor 1, an
  assumption) so the estimate's balanced load (``moe_imbalance`` 1) is the measured case. The
  models: GPT-OSS-120B (36 layers, hidden 2880, 64 heads of 64, 8 K/V heads, 128 experts of
  width 2880, top 4, vocabulary 201088), Qwen3-30B-A3B (48 layers, hidden 2048, 32 heads of
  128, 4 K/V heads, 128 experts of 768, top 8, vocabulary 151936), Qwen3-235B-A22B (94
  layers, hidden 4096, 64 heads of 128, 4 K/V heads, 128 experts of 1536, top 8) and
  DeepSeek-V3 (61 layers, first 3 dense of width 18432, 256 experts of 2048 top 8 plus one
  shared, hidden 7168, 128 heads), from their published config.json files. ``ModelSpec``
  ties the head size to ``hidden/heads`` and has no multi-head latent attention or sliding
  windows, so every one of these is described with lighter attention than it has (the
  table prints the estimate's FLOPs per token against the page's TFLOP/s ÷ tokens/s, which
  is that gap plus Megatron's causal halving); the ratio is therefore read on model TFLOP/s
  too. Assumed (the page does not say): the distributed optimizer, no recompute, sequence
  parallel under TP, expert TP 1. Most rows are FP8 (the estimate times bf16: ratios below 1
  by about the FP8 speed-up); GPT-OSS's are bf16. Qwen3-235B's 94 and DeepSeek-V3's 61 layers
  on 8 stages get 11 and 7 a stage in the estimate (Megatron-Bridge lays them out unevenly),
  so those steps are 6-8% short. Rows of one model come from different releases: an order
  pair there mixes the layout with the software.
* ``narayanan-table2`` (kept aside, not looked at while changing the model): Narayanan et
  al. 2021 Table 2 (also plotted as Figure 10): ZeRO-3 without model parallelism vs PTD-P,
  175B and 530B, fixed global batch, achieved teraFLOP/s per GPU.

How the tables were checked: Table 1 against a public CSV copy of it
(SotaroKaneda/MLCarbon, ``data/megatron_table.csv``); Table 5's SP+selective column against
the MFU the Megatron-LM README prints (asserted when the script runs); Table 2 against the
points of its Figure 10 as read in a public summary (175B ZeRO-3 ~143/88/44, 530B ~140/97/48
TFLOP/s). Table 5's full-recompute column and Table 2's PTD-P rows have no second source here.

The machine: Selene / DGX A100 from public figures: A100 80 GB, 312 TFLOP/s dense bf16
(NVIDIA A100 datasheet); third-generation NVLink 600 GB/s bidirectional per GPU, 300 GB/s
each way (same datasheet); 8× 200 Gb/s HDR InfiniBand per DGX A100 node, one per GPU:
25 GB/s per GPU (DGX A100 user guide; Narayanan et al. §5 "8 NVIDIA 80-GB A100 GPUs ...
connected to each other by NVLink and NVSwitch ... eight NVIDIA Mellanox 200Gbps HDR
Infiniband HCAs").

Per set: throughput ratio (predicted / measured) range, pairwise order agreement (pairs
whose measured values differ by more than 2%), Spearman, whether the predicted best is the
measured best, and the predicted / reference memory ratio.

    .venv/bin/python benchmarks/estimate_fidelity.py
"""

from __future__ import annotations

import itertools
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from scipy.optimize import linprog
from truths import REPLAY_DIR, PublishedSweep

from parsearch.config import AllocationSpec, ModelSpec, MoESpec, ParallelLayout
from parsearch.estimate import (
    EstimateSettings,
    flops_per_step,
    memory_per_rank,
    param_count,
    predict,
)
from parsearch.estimate.band import corner, predict_band, predict_scaled
from parsearch.estimate.profile import with_machine
from parsearch.estimate.timing import (
    bubble_in_slots,
    dp_collective_s,
    stage_compute_s,
    step_fixed_s,
    zero3_passes,
)
from parsearch.profiles import load_profile
from parsearch.result import TrialState
from parsearch.space import load_space

A100_SELENE = AllocationSpec(
    name="selene-dgx-a100",
    nodes=384,
    devices_per_node=8,
    device_memory_bytes=80 * 10**9,
    peak_flops_per_device=312e12,
    intra_node_bandwidth_bytes_per_s=300e9,
    inter_node_bandwidth_bytes_per_s=25e9,
)
SEQ, VOCAB = 2048, 51200

# H100 SXM (DGX H100): 989 TFLOP/s dense bf16 (H100 data sheet), NVLink 4 900 GB/s per GPU
# both ways (450 each), one 400 Gb/s NDR HCA per GPU (DGX H100 user guide): the figures of
# parsearch/profiles/h100-sxm-dgx.yaml. torchtitan's Grand Teton H100s are 96 GB HBM2e at
# 500 W; their peak lies between the SXM's and the NVL's (its footnote 2): the SXM's is used.
H100_DGX = AllocationSpec(
    name="dgx-h100",
    nodes=128,
    devices_per_node=8,
    device_memory_bytes=80 * 10**9,
    peak_flops_per_device=989e12,
    intra_node_bandwidth_bytes_per_s=450e9,
    inter_node_bandwidth_bytes_per_s=50e9,
    memory_bandwidth_bytes_per_s=3.35e12,
)
H100_GRAND_TETON = replace(
    H100_DGX, name="grand-teton-h100", device_memory_bytes=96 * 10**9, nodes=64
)


@dataclass(frozen=True)
class Run:
    """One published measurement: a layout of a GPT and what it achieved."""

    label: str
    model: ModelSpec
    layout: ParallelLayout
    tflops_per_gpu: float  # as the source counts it
    counts_recompute: bool = True  # the source's FLOP count includes recompute's
    # Megatron-LM of 2021-22 all-reduced the gradients after the backward pass (overlap came
    # with megatron-core's DDP in 2023); DeepSpeed's ZeRO-3 prefetches behind compute.
    dp_overlap: float = 0.0


def gpt(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        vocab_size=VOCAB,
        seq_length=SEQ,
    )


def layout(tp: int, pp: int, gpus: int, batch: int, mbs: int = 1, **extra) -> ParallelLayout:
    dp = gpus // (tp * pp)
    return ParallelLayout(tp=tp, pp=pp, dp=dp, mbs=mbs, gas=batch // (dp * mbs), **extra)


# Narayanan et al. 2021 (arXiv 2104.04473) Table 1:
# (params, heads, hidden, layers, t, p, GPUs, batch, achieved TFLOP/s per GPU).
NARAYANAN_TABLE1 = [
    ("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137),
    ("3.6B", 32, 3072, 30, 2, 1, 64, 512, 138),
    ("7.5B", 32, 4096, 36, 4, 1, 128, 512, 142),
    ("18B", 48, 6144, 40, 8, 1, 256, 1024, 135),
    ("39B", 64, 8192, 48, 8, 2, 512, 1536, 138),
    ("76B", 80, 10240, 60, 8, 4, 1024, 1792, 140),
    ("145B", 96, 12288, 80, 8, 8, 1536, 2304, 148),
    ("310B", 128, 16384, 96, 8, 16, 1920, 2160, 155),
    ("530B", 128, 20480, 105, 8, 35, 2520, 2520, 163),
    ("1T", 160, 25600, 128, 8, 64, 3072, 3072, 163),
]

# Korthikanti et al. 2022 (arXiv 2205.05198) Table 3 configurations and Table 5 iteration
# times in seconds: (name, heads, hidden, layers, t, p, GPUs, batch, full, SP+selective).
KORTHIKANTI_TABLE5 = [
    ("22B", 64, 6144, 48, 8, 1, 8, 4, 1.42, 1.10),
    ("175B", 96, 12288, 96, 8, 8, 64, 64, 18.13, 13.75),
    ("530B", 128, 20480, 105, 8, 35, 280, 280, 49.05, 37.83),
    ("1T", 160, 25600, 128, 8, 64, 512, 512, 94.42, 71.49),
]
MEGATRON_README_MFU = {"22B": 0.415, "175B": 0.514, "530B": 0.560, "1T": 0.563}

# Narayanan et al. 2021 Table 2: (scheme, model, t, p, mbs, GPUs, batch, TFLOP/s per GPU).
# The 530B ZeRO-3 rows ran at batch 2240 on 1120 and 2240 GPUs; only the 640-GPU row used
# batch 2560, because micro-batch 4 did not fit on 560 GPUs (the table's caption; see
# NARAYANAN_TABLE2_OOM).
NARAYANAN_TABLE2 = [
    ("ZeRO-3", "175B", 1, 1, 4, 384, 1536, 144),
    ("ZeRO-3", "175B", 1, 1, 2, 768, 1536, 88),
    ("ZeRO-3", "175B", 1, 1, 1, 1536, 1536, 44),
    ("PTD-P", "175B", 8, 12, 1, 384, 1536, 153),
    ("PTD-P", "175B", 8, 12, 1, 768, 1536, 149),
    ("PTD-P", "175B", 8, 12, 1, 1536, 1536, 141),
    ("ZeRO-3", "530B", 1, 1, 4, 640, 2560, 138),
    ("ZeRO-3", "530B", 1, 1, 2, 1120, 2240, 98),
    ("ZeRO-3", "530B", 1, 1, 1, 2240, 2240, 48),
    ("PTD-P", "530B", 8, 35, 1, 560, 2240, 171),
    ("PTD-P", "530B", 8, 35, 1, 1120, 2240, 167),
    ("PTD-P", "530B", 8, 35, 1, 2240, 2240, 159),
]
GPT3_175B = gpt("175B", 96, 12288, 96)
GPT_530B = gpt("530B", 105, 20480, 128)


def narayanan_table1() -> list[Run]:
    return [
        Run(
            f"{name} t{t} p{p}",
            gpt(name, layers, hidden, heads),
            layout(t, p, gpus, batch, recompute="full"),
            achieved,
        )
        for name, heads, hidden, layers, t, p, gpus, batch, achieved in NARAYANAN_TABLE1
    ]


def korthikanti_table5() -> list[Run]:
    runs = []
    for name, heads, hidden, layers, t, p, gpus, batch, full_s, selective_s in KORTHIKANTI_TABLE5:
        model = gpt(name, layers, hidden, heads)
        for recompute, seconds in (("full", full_s), ("selective", selective_s)):
            shape = layout(
                t, p, gpus, batch, recompute=recompute, sequence_parallel=recompute != "full"
            )
            model_flops = flops_per_step(model, shape.global_batch)
            runs.append(
                Run(
                    f"{name} {recompute}",
                    model,
                    shape,
                    model_flops / seconds / gpus / 1e12,
                    counts_recompute=False,
                )
            )
    return runs


def narayanan_table2() -> list[Run]:
    models = {"175B": GPT3_175B, "530B": GPT_530B}
    runs = []
    for scheme, name, t, p, mbs, gpus, batch, achieved in NARAYANAN_TABLE2:
        zero3 = scheme == "ZeRO-3"
        shape = layout(t, p, gpus, batch, mbs=mbs, recompute="full", zero_stage=3 if zero3 else 0)
        overlap = EstimateSettings().dp_overlap if zero3 else 0.0
        runs.append(
            Run(f"{scheme} {name} {gpus}", models[name], shape, achieved, dp_overlap=overlap)
        )
    return runs


# Published layouts that did not fit in an 80 GB A100: (label, model, layout). Narayanan et
# al. 2021 Table 2's caption: the 530B ZeRO-3 run at micro-batch 4 did not fit on 560 GPUs
# (batch 2240), so it ran on 640 at batch 2560. And, as issue 31 transcribes Korthikanti et
# al. 2022 (145B, 80 layers, hidden 12288, 96 heads, t8 p16 on 128 GPUs, micro-batch 1): no
# run without recompute past batch 8 (transcription not checked against the paper here).
GPT_145B = gpt("145B", 80, 12288, 96)
PUBLISHED_OOM = [
    (
        "530B ZeRO-3 560 GPUs mbs4",
        GPT_530B,
        layout(1, 1, 560, 2240, mbs=4, recompute="full", zero_stage=3),
    ),
    ("145B t8 p16 no recompute batch 16", GPT_145B, layout(8, 16, 128, 16)),
]
# ... and their neighbours that ran (they must stay predicted to fit).
PUBLISHED_RAN = [
    (
        "530B ZeRO-3 640 GPUs mbs4",
        GPT_530B,
        layout(1, 1, 640, 2560, mbs=4, recompute="full", zero_stage=3),
    ),
    ("145B t8 p16 no recompute batch 8", GPT_145B, layout(8, 16, 128, 8)),
]


LLAMA2_7B = ModelSpec(
    name="llama2-7b",
    num_layers=32,
    hidden_size=4096,
    num_heads=32,
    ffn_hidden_size=11008,
    vocab_size=32000,
    seq_length=4096,
    arch="llama",
)
LLAMA31_8B = ModelSpec(
    name="llama3.1-8b",
    num_layers=32,
    hidden_size=4096,
    num_heads=32,
    num_kv_heads=8,
    ffn_hidden_size=14336,
    vocab_size=128256,
    seq_length=8192,
    arch="llama",
)
LLAMA31_405B = ModelSpec(
    name="llama3.1-405b",
    num_layers=126,
    hidden_size=16384,
    num_heads=128,
    num_kv_heads=8,
    ffn_hidden_size=53248,
    vocab_size=128256,
    seq_length=8192,
    arch="llama",
)

# NeMo performance_long_sequence.md (commit 9421f21a), with-CP columns:
# (sequence in K tokens, GPUs, batch, TP, PP, DP, CP, TFLOP/s per GPU).
NEMO_LLAMA2_7B_H100 = [
    (4, 4, 1024, 1, 1, 4, 1, 768),
    (8, 8, 512, 1, 2, 4, 1, 730),
    (16, 16, 256, 2, 1, 8, 1, 660),
    (32, 32, 128, 2, 1, 8, 2, 610),
    (64, 64, 64, 4, 1, 8, 2, 574),
    (128, 128, 32, 4, 1, 8, 4, 555),
    (256, 256, 16, 4, 1, 8, 8, 549),
    (512, 512, 8, 8, 1, 4, 16, 549),
    (1024, 1024, 4, 8, 1, 4, 32, 536),
]
# torchtitan benchmarks/llama3_h100_202412_torchtitan.md: (sequence, TP, PP, FSDP, CP,
# micro-batches per step, tokens/s per GPU). Table 2: Llama 3.1 8B on 8 GPUs; Table 6:
# Llama 3.1 405B on 512 GPUs.
TORCHTITAN_8B_TABLE2 = [
    (32768, 1, 1, 8, 1, 1, 3890),
    (65536, 1, 1, 4, 2, 1, 2540),
    (131072, 1, 1, 2, 4, 1, 1071),
    (262144, 1, 1, 1, 8, 1, 548),
]
TORCHTITAN_405B_TABLE6 = [
    (32768, 8, 8, 8, 1, 8, 76),
    (65536, 8, 8, 4, 2, 8, 47),
    (131072, 8, 8, 2, 4, 8, 31),
    (262144, 8, 8, 1, 8, 8, 16),
]


@dataclass(frozen=True)
class CpRun:
    """One published context-parallel measurement, as tokens/s per GPU (NeMo's TFLOP/s
    converted with the same FLOP count, which is also ours)."""

    table: str
    model: ModelSpec
    layout: ParallelLayout
    allocation: AllocationSpec
    tokens_per_s_per_gpu: float
    framework: str = "megatron"


def cp_published() -> list[CpRun]:
    runs = []
    for table, model, allocation, rows in (
        ("nemo llama2-7b h100", LLAMA2_7B, H100_DGX, NEMO_LLAMA2_7B_H100),
    ):
        for seq_k, gpus, batch, tp, pp, dp, cp, tflops in rows:
            sized = replace(model, seq_length=seq_k * 1024)
            shape = ParallelLayout(
                tp=tp,
                pp=pp,
                dp=dp,
                cp=cp,
                mbs=1,
                gas=batch // dp,
                zero_stage=1,
                sequence_parallel=tp > 1,
            )
            assert shape.world_size == gpus, (table, seq_k, shape.world_size, gpus)
            tokens = tflops * 1e12 * gpus / flops_per_step(sized, batch) * batch * sized.seq_length
            runs.append(CpRun(table, sized, shape, allocation, tokens / gpus))
    for table, model, rows in (
        ("torchtitan 8b table 2", LLAMA31_8B, TORCHTITAN_8B_TABLE2),
        ("torchtitan 405b table 6", LLAMA31_405B, TORCHTITAN_405B_TABLE6),
    ):
        for seq, tp, pp, fsdp, cp, microbatches, tps in rows:
            shape = ParallelLayout(
                tp=tp,
                pp=pp,
                dp=fsdp,
                cp=cp,
                mbs=1,
                gas=microbatches,
                zero_stage=3,
                recompute="full",
                sequence_parallel=tp > 1,
            )
            sized = replace(model, seq_length=seq)
            runs.append(CpRun(table, sized, shape, H100_GRAND_TETON, tps, framework="torch"))
    return runs


def cp_order(runs: list[CpRun], predicted: list[float]) -> tuple[int, int]:
    """Pairs of one table's rows at different CP degrees whose measured throughputs differ
    by more than 2%: how many the estimate orders as measured, and how many there are."""
    agree = total = 0
    for i, j in itertools.combinations(range(len(runs)), 2):
        a, b = runs[i], runs[j]
        if a.table != b.table or a.layout.cp == b.layout.cp:
            continue
        ma, mb = a.tokens_per_s_per_gpu, b.tokens_per_s_per_gpu
        if abs(ma - mb) <= 0.02 * max(ma, mb):
            continue
        total += 1
        agree += (predicted[i] > predicted[j]) == (ma > mb)
    return agree, total


def report_cp(runs: list[CpRun] | None = None) -> dict[str, dict[str, float]]:
    """Issue 47, item 7: each published CP row's ratio (predicted / measured tokens/s per
    GPU), the exposed ring time's share of the step, and the pairwise order between CP
    degrees of one model, per table."""
    runs = cp_published() if runs is None else runs
    print("\n### published context-parallel runs (tokens/s per GPU; all FP8, estimated bf16)\n")
    print(
        "| table | seq | layout | measured | predicted | ratio | ring exposed | memory GiB "
        "| ratio, h100-sxm-dgx profile |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    predicted = []
    profile = load_profile("h100-sxm-dgx")
    for run in runs:
        settings = EstimateSettings(framework=run.framework)
        prediction = predict(run.model, run.layout, run.allocation, settings)
        per_gpu = prediction.tokens_per_s / run.layout.world_size
        predicted.append(per_gpu)
        profiled = predict(
            run.model,
            run.layout,
            run.allocation,
            with_machine(settings, profile, run.allocation),
        )
        profiled_ratio = profiled.tokens_per_s / run.layout.world_size / run.tokens_per_s_per_gpu
        print(
            f"| {run.table} | {run.model.seq_length} | {run.layout.short()} | "
            f"{run.tokens_per_s_per_gpu:.0f} | {per_gpu:.0f} | "
            f"{per_gpu / run.tokens_per_s_per_gpu:.2f} | "
            f"{prediction.cp_comm_s / prediction.step_time_s:.1%} | "
            f"{prediction.memory.total / 2**30:.1f} | {profiled_ratio:.2f} |"
        )
    summaries = {}
    print("\n| table | rows (cp > 1) | ratio range | CP pairs ordered as measured |")
    print("|---|---|---|---|")
    for table in dict.fromkeys(run.table for run in runs):
        index = [i for i, run in enumerate(runs) if run.table == table]
        rows = [runs[i] for i in index]
        guesses = [predicted[i] for i in index]
        ratios = [g / r.tokens_per_s_per_gpu for g, r in zip(guesses, rows, strict=True)]
        agree, total = cp_order(rows, guesses)
        summaries[table] = {
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "cp_agree": agree,
            "cp_pairs": total,
        }
        print(
            f"| {table} | {len(rows)} ({sum(r.layout.cp > 1 for r in rows)}) | "
            f"{min(ratios):.2f}–{max(ratios):.2f} | {agree} of {total} |"
        )
    return summaries


def predicted_tflops(run: Run, settings: EstimateSettings) -> float:
    settings = replace(settings, dp_overlap=run.dp_overlap)
    prediction = predict(run.model, run.layout, A100_SELENE, settings)
    recompute = run.layout.recompute if run.counts_recompute else "none"
    flops = flops_per_step(run.model, run.layout.global_batch, recompute)
    return flops / prediction.step_time_s / run.layout.world_size / 1e12


def megatron_memory_bytes(
    model: ModelSpec, shape: ParallelLayout, optimizer_sharded: bool
) -> float:
    """Megatron-LM's theoretical memory of the first pipeline stage (commit 1bcb3b9e,
    ``compute_weight_and_optimizer_memory`` for a dense GPT, then
    ``compute_activation_memory`` with SP + selective recompute or
    ``compute_activation_memory_without_sp`` otherwise). Full recompute, which neither branch
    models, takes Korthikanti et al.'s ``2·s·b·h`` per layer in the second branch's place."""
    h, L, t, p = model.hidden_size, model.num_layers, shape.tp, shape.pp
    s, b = model.seq_length, shape.mbs
    layer_params = 2 * L * h * h * (1 + model.ffn / h + 1 + 2 / h + 1 / (L * h))
    embedding = h * VOCAB
    shard = (layer_params / p + embedding) / t
    per_param = 6 + 12 / shape.dp if optimizer_sharded else 18
    states = shard * per_param
    sbh = s * b * h
    in_flight = min(1, shape.gas / p) if p > 1 else 1
    if shape.sequence_parallel and shape.recompute == "selective":
        activations = sbh * (18 + 4 * model.ffn / h) * L
        activations += 8 * s * b * p + sbh * p
        activations *= in_flight
        if p == 1:
            activations += sbh * 4 * (1 + VOCAB / h)
        return states + activations / t
    per_layer = 2 * sbh / (t if shape.sequence_parallel else 1)
    if shape.recompute != "full":
        per_layer = sbh * (10 + 24 / t)
    activations = per_layer * L + 8 * s * b * p + sbh * p
    activations *= in_flight
    if p == 1:
        activations += (s * b * VOCAB / t + sbh) * 2
    return states + activations * 1.05


def memory_cases() -> list[tuple[str, ModelSpec, ParallelLayout, bool]]:
    cases = []
    for name, heads, hidden, layers, t, p, gpus, batch, _, _ in KORTHIKANTI_TABLE5:
        model = gpt(name, layers, hidden, heads)
        for recompute, sp in (("selective", True), ("selective", False), ("full", True)):
            shape = layout(t, p, gpus, batch, recompute=recompute, sequence_parallel=sp)
            cases.append((f"{name} {recompute}{' sp' if sp else ''}", model, shape, False))
    return cases


def spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=values.__getitem__)
        result = [0.0] * len(values)
        for rank, index in enumerate(order):
            result[index] = float(rank)
        return result

    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((x - mx) * (y - my) for x, y in zip(rx, ry, strict=True))
    var = math.sqrt(sum((x - mx) ** 2 for x in rx) * sum((y - my) ** 2 for y in ry))
    return cov / var if var else float("nan")


def pairwise_agreement(predicted: list[float], measured: list[float], tie: float = 0.02) -> float:
    agree = total = 0
    for i, j in itertools.combinations(range(len(measured)), 2):
        if abs(measured[i] - measured[j]) <= tie * max(measured[i], measured[j]):
            continue
        total += 1
        agree += (predicted[i] > predicted[j]) == (measured[i] > measured[j])
    return agree / total if total else float("nan")


def report_throughput(name: str, runs: list[Run], settings: EstimateSettings) -> dict[str, float]:
    predicted = [predicted_tflops(run, settings) for run in runs]
    measured = [run.tflops_per_gpu for run in runs]
    ratios = [p / m for p, m in zip(predicted, measured, strict=True)]
    print(f"\n### {name}\n")
    print("| run | layout | measured TFLOP/s | predicted | ratio | memory GiB |")
    print("|---|---|---|---|---|---|")
    for run, p, m, r in zip(runs, predicted, measured, ratios, strict=True):
        memory = memory_per_rank(run.model, run.layout, settings).total / 2**30
        print(
            f"| {run.label} | {run.layout.short()} | {m:.1f} | {p:.1f} | {r:.2f} | {memory:.1f} |"
        )
    return agreement(predicted, measured)


def agreement(predicted: list[float], measured: list[float]) -> dict[str, float]:
    """Ratio range, pairwise order agreement, Spearman, and whether the predicted best is
    the measured best (ties within 2% among the measured best count as the same)."""
    ratios = [p / m for p, m in zip(predicted, measured, strict=True)]
    return {
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "pairwise": pairwise_agreement(predicted, measured),
        "spearman": spearman(predicted, measured),
        "same_best": float(measured[predicted.index(max(predicted))] >= 0.98 * max(measured)),
    }


def report_memory(settings: EstimateSettings) -> dict[str, float]:
    print("\n### megatron-memory (first stage, GiB)\n")
    print("| case | layout | Megatron | estimate | ratio |")
    print("|---|---|---|---|---|")
    ratios: dict[str, list[float]] = {"sp+selective": [], "other": []}
    for label, model, shape, sharded in memory_cases():
        reference = megatron_memory_bytes(model, shape, sharded)
        estimate = memory_per_rank(model, shape, settings).total
        ratio = estimate / reference
        group = (
            "sp+selective"
            if shape.sequence_parallel and shape.recompute == "selective"
            else "other"
        )
        ratios[group].append(ratio)
        print(
            f"| {label} | {shape.short()} | {reference / 2**30:.1f} | "
            f"{estimate / 2**30:.1f} | {ratio:.3f} |"
        )
    return {
        "sp_selective_min": min(ratios["sp+selective"]),
        "sp_selective_max": max(ratios["sp+selective"]),
        "other_min": min(ratios["other"]),
        "other_max": max(ratios["other"]),
    }


def separating_margin(parts: np.ndarray, oom: np.ndarray) -> float:
    """How well any memory model ``w · parts`` (``w >= 0``, one weight per column of
    ``parts``) tells the runs that ran out of memory from those that ran: the largest ``m``
    with ``w · x <= 1 - m`` for every run that fit and ``>= 1 + m`` for every one that did
    not, a fraction of the wall (a linear programme). Negative: no weighting separates
    them, and ``-m`` is how far the best one misses."""
    rows = np.where(oom[:, None], -parts, parts)
    bounds = np.where(oom, -1.0, 1.0)
    # Variables (w, m); maximise m: minimise -m.
    result = linprog(
        c=np.r_[np.zeros(parts.shape[1]), -1.0],
        A_ub=np.c_[rows, np.ones(len(rows))],
        b_ub=bounds,
        bounds=[(0, None)] * parts.shape[1] + [(None, 1.0)],
    )
    if not result.success:
        raise RuntimeError(f"separating_margin: {result.message}")
    return float(result.x[-1])


def dominance_verdicts(parts: np.ndarray, oom: np.ndarray, fits: np.ndarray) -> tuple[int, int]:
    """What the order of the parts alone says, with no weights: a run that needs at least
    as much of every part as one that ran out of memory would run out too, if memory grows
    with each part. Returns how many out-of-memory runs the estimate expected to fit that
    order catches (from another out-of-memory run), and how many runs that *ran* it would
    wrongly rule out."""
    above = np.all(parts[:, None, :] >= parts[None, :, :], axis=2)  # [y, x]: y >= x in all
    np.fill_diagonal(above, False)
    implied = (above & oom[None, :]).any(axis=1)
    return int((implied & oom & fits).sum()), int((implied & ~oom).sum())


def report_sweeps() -> dict[str, dict[str, float]]:
    """The estimate against each published sweep: throughput of the runs that fit, which
    runs it expects to fit, and whether any re-weighting of its memory parts could tell
    them apart (:func:`separating_margin`, fitted to the whole sweep at once), and what the
    parts' order alone rules out (:func:`dominance_verdicts`)."""
    print("\n### hagemann2023 (tokens/s of the runs that fit; memory as fit / out of memory)\n")
    print(
        "| sweep | runs ok / oom | ratio range | pairwise | Spearman | same best "
        "| ran, predicted OOM | OOM, predicted to fit | margin: total / state, activations "
        "| ordered: caught / ran ruled out |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    summaries = {}
    for path in sorted(REPLAY_DIR.glob("*.yaml")):
        space = load_space(path)
        truth = PublishedSweep(space, 0)
        plan = space.plan()
        predicted, measured, wrong_oom, wrong_fit, ooms = [], [], 0, 0, 0
        parts, labels, expected_fit = [], [], []
        for layout, prediction in plan.feasible + plan.predicted_oom:
            result = truth.measure(layout)
            memory = prediction.memory
            fits = memory.total <= space.memory_limit_bytes
            if result.status is TrialState.OK:
                predicted.append(prediction.tokens_per_s)
                measured.append(result.metrics["tokens_per_s"])
                wrong_oom += not fits
            elif result.status is TrialState.OOM:
                ooms += 1
                wrong_fit += fits
            if result.status in (TrialState.OK, TrialState.OOM):
                state = memory.weights + memory.grads + memory.optimizer
                parts.append((state, memory.total - state))
                labels.append(result.status is TrialState.OOM)
                expected_fit.append(fits)
        summary = agreement(predicted, measured)
        summaries[f"hagemann2023 {space.name}"] = summary
        split = np.array(parts) / space.memory_limit_bytes
        oom = np.array(labels)
        margins = (
            separating_margin(split.sum(axis=1, keepdims=True), oom),
            separating_margin(split, oom),
        )
        caught, ruled_out = dominance_verdicts(split, oom, np.array(expected_fit))
        print(
            f"| {space.name} | {len(measured)} / {ooms} | {summary['ratio_min']:.2f}–"
            f"{summary['ratio_max']:.2f} | {summary['pairwise']:.0%} | "
            f"{summary['spearman']:.2f} | {'yes' if summary['same_best'] else 'no'} "
            f"| {wrong_oom} of {len(measured)} | {wrong_fit} of {ooms} "
            f"| {margins[0]:+.3f} / {margins[1]:+.3f} | {caught} of {wrong_fit} / {ruled_out} |"
        )
    return summaries


def report_out_of_memory(settings: EstimateSettings) -> dict[str, int]:
    """The published out-of-memory cases and their neighbours that ran, against 80 GB."""
    limit = A100_SELENE.device_memory_bytes
    print(f"\n### published out-of-memory cases (limit {limit / 2**30:.1f} GiB)\n")
    print("| case | layout | published | predicted GiB | predicted |")
    print("|---|---|---|---|---|")
    caught = wrong = 0
    for published, cases in (("out of memory", PUBLISHED_OOM), ("ran", PUBLISHED_RAN)):
        for label, model, shape in cases:
            total = memory_per_rank(model, shape, settings).total
            verdict = "out of memory" if total > limit else "fits"
            caught += published == "out of memory" and verdict == "out of memory"
            wrong += published == "ran" and verdict == "out of memory"
            print(f"| {label} | {shape.short()} | {published} | {total / 2**30:.1f} | {verdict} |")
    return {"oom_caught": caught, "ran_predicted_oom": wrong}


def report_structure(settings: EstimateSettings) -> None:
    """What each structural part of issue 31 contributes on a published row: the
    hierarchical data-parallel all-reduce, ZeRO-3's gathers per micro-batch, the
    once-per-step optimizer work and the bubble's pace (each also has a hand-computed
    unit test in tests/test_estimate_fixes.py)."""
    print("\n### structural parts on published rows (seconds per step)\n")
    print("| part | row | quantity | value |")
    print("|---|---|---|---|")
    small = narayanan_table1()[0]
    size = 4 * param_count(small.model)  # fp32 main gradients, no ZeRO
    shape = small.layout
    flat = dp_collective_s("all-reduce", size, shape, A100_SELENE, settings, hierarchical=False)
    tree = dp_collective_s("all-reduce", size, shape, A100_SELENE, settings)
    print(
        f"| hierarchical DP all-reduce | {small.label} | flat ring / hierarchical | "
        f"{flat:.3f} / {tree:.3f} |"
    )
    zero3 = narayanan_table2()[2]
    print(
        f"| ZeRO-3 gathers per micro-batch | {zero3.label} | passes (fwd, recompute, bwd) | "
        f"{zero3_passes(zero3.layout)} |"
    )
    for run in (small, narayanan_table1()[-1]):
        step = predict(run.model, run.layout, A100_SELENE, settings).step_time_s
        fixed = step_fixed_s(run.model, run.layout, A100_SELENE, settings)
        print(
            f"| optimizer step and per-step reductions | {run.label} | seconds (share) | "
            f"{fixed:.3f} ({fixed / step:.1%}) |"
        )
    for run in (narayanan_table1()[-1], korthikanti_table5()[-1]):
        stages = stage_compute_s(run.model, run.layout, A100_SELENE, settings)
        paced = bubble_in_slots(stages, run.layout.vpp)
        print(
            f"| bubble at the passed stages' pace | {run.label} | bubble slots, was "
            f"{run.layout.pp - 1} | {paced:.2f} |"
        )


def report_with_profile(name: str) -> dict[str, dict[str, float]]:
    """The tables predicted with a shipped device profile instead of the calibrated
    defaults: what published micro-benchmarks alone give on the A100 tables."""
    base = EstimateSettings(flash_attention=False)
    settings = with_machine(base, load_profile(name), A100_SELENE)
    return {
        f"{table} with profile {name}": agreement(
            [predicted_tflops(run, settings) for run in runs],
            [run.tflops_per_gpu for run in runs],
        )
        for table, runs in (
            ("narayanan-table1", narayanan_table1()),
            ("korthikanti-table5", korthikanti_table5()),
            ("narayanan-table2", narayanan_table2()),
        )
    }


# The Frontier study's measured MFU (Dash et al., arXiv 2312.12705): the check of the
# mi250x-frontier profile's band, never an input to the profile.
ROOT = Path(__file__).resolve().parent.parent
FRONTIER_STUDY_MFU = {"22b": 0.3838, "175b": 0.3614, "1t": 0.3196}


def report_band() -> None:
    """Issue 38, item 2: each Frontier space's best predicted layout, its band under the
    mi250x-frontier profile's stated ranges (``parsearch plan``'s), the study's measured
    MFU against it, the band's width, and each figure's slow end alone (which figure the
    band's low end comes from)."""
    print("\n### the band on the Frontier spaces (mi250x-frontier's stated ranges)\n")
    print(
        "| space | best layout | MFU | band | study | inside | width (points; high/low) "
        "| each figure's slow end alone |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for size, study in FRONTIER_STUDY_MFU.items():
        space = load_space(ROOT / "search_spaces" / f"gpt-{size}-frontier.yaml")
        best, prediction = space.plan().feasible[0]
        band = predict_band(space.model, best, space.allocation, space.estimate, space.schedule)
        alone = []
        for figure, factor in corner(space.estimate.machine, "slow").items():
            one = {figure: factor}
            mfu = predict_scaled(
                space.model, best, space.allocation, space.estimate, one, space.schedule
            ).mfu
            alone.append(f"{figure} {mfu:.1%}")
        inside = band.mfu_low <= study <= band.mfu_high
        shape = f"tp{best.tp} pp{best.pp} dp{best.dp} mbs{best.mbs} gas{best.gas}"
        print(
            f"| {size} | {shape} | {prediction.mfu:.1%} | {band.mfu_low:.1%}–"
            f"{band.mfu_high:.1%} | {study:.2%} | {'yes' if inside else 'no'} | "
            f"{100 * (band.mfu_high - band.mfu_low):.1f}; {band.mfu_high / band.mfu_low:.2f} "
            f"| {', '.join(alone)} |"
        )


def report_band_on_tables(name: str = "a100-80gb-dgx") -> None:
    """The band of the A100 profile's stated ranges on the published A100 tables: how many
    measured rows it contains (TFLOP/s per GPU as each table counts it)."""
    settings = with_machine(
        EstimateSettings(flash_attention=False), load_profile(name), A100_SELENE
    )
    print(f"\n### the band of {name} on the published A100 tables\n")
    print("| table | rows inside | below the band | above | band width (high/low) |")
    print("|---|---|---|---|---|")
    for table, runs in (
        ("narayanan-table1", narayanan_table1()),
        ("korthikanti-table5", korthikanti_table5()),
        ("narayanan-table2", narayanan_table2()),
    ):
        inside = below = above = 0
        widths = []
        for run in runs:
            run_settings = replace(settings, dp_overlap=run.dp_overlap)
            band = predict_band(run.model, run.layout, A100_SELENE, run_settings)
            # The band's ratio to the prediction scales the table's own TFLOP/s count.
            nominal = predict(run.model, run.layout, A100_SELENE, run_settings).tokens_per_s
            tflops = predicted_tflops(run, settings)
            low = tflops * band.tokens_per_s_low / nominal
            high = tflops * band.tokens_per_s_high / nominal
            widths.append(high / low)
            if run.tflops_per_gpu < low:
                below += 1
            elif run.tflops_per_gpu > high:
                above += 1
            else:
                inside += 1
        print(
            f"| {table} | {inside} of {len(runs)} | {below} | {above} | "
            f"{min(widths):.2f}–{max(widths):.2f} |"
        )


GPT_OSS_120B = ModelSpec(
    name="gpt-oss-120b",
    num_layers=36,
    hidden_size=2880,
    num_heads=64,
    num_kv_heads=8,
    ffn_hidden_size=2880,
    vocab_size=201088,
    seq_length=4096,
    arch="llama",
    moe=MoESpec(num_experts=128, top_k=4, expert_ffn_hidden_size=2880),
)
QWEN3_30B_A3B = ModelSpec(
    name="qwen3-30b-a3b",
    num_layers=48,
    hidden_size=2048,
    num_heads=32,
    num_kv_heads=4,
    ffn_hidden_size=6144,
    vocab_size=151936,
    seq_length=4096,
    arch="llama",
    moe=MoESpec(num_experts=128, top_k=8, expert_ffn_hidden_size=768),
)
QWEN3_235B_A22B = replace(
    QWEN3_30B_A3B,
    name="qwen3-235b-a22b",
    num_layers=94,
    hidden_size=4096,
    num_heads=64,
    ffn_hidden_size=12288,
    moe=MoESpec(num_experts=128, top_k=8, expert_ffn_hidden_size=1536),
)
DEEPSEEK_V3 = ModelSpec(
    name="deepseek-v3",
    num_layers=61,
    hidden_size=7168,
    num_heads=128,
    ffn_hidden_size=18432,
    vocab_size=129280,
    seq_length=4096,
    arch="llama",
    moe=MoESpec(
        num_experts=256,
        top_k=8,
        expert_ffn_hidden_size=2048,
        shared_expert_ffn_hidden_size=2048,
        first_dense_layers=3,
    ),
)
# Megatron-Bridge docs/performance-summary-archive.md (commit 0a25f911), DGX-H100 rows:
# (release, model, precision, GPUs, GBS, MBS, TP, PP, VP, EP, tokens/s/GPU, TFLOP/s/GPU,
# capacity factor: None dropless).
MEGATRON_BRIDGE_H100_MOE = [
    ("26.02", GPT_OSS_120B, "bf16", 64, 1280, 1, 1, 4, 1, 8, 5993, 163, None),
    ("25.11", GPT_OSS_120B, "bf16", 64, 512, 4, 1, 4, 1, 8, 5630, 153, None),
    ("26.02", QWEN3_30B_A3B, "fp8", 16, 1024, 1, 1, 2, 12, 8, 5113, 118, None),
    ("25.11", QWEN3_30B_A3B, "fp8", 16, 512, 2, 1, 2, 24, 8, 5275, 121, None),
    ("25.09", QWEN3_30B_A3B, "fp8", 16, 512, 2, 1, 2, 24, 8, 10494, 241, 1.0),
    ("26.02", QWEN3_235B_A22B, "fp8", 256, 8192, 1, 2, 8, 4, 32, 1633, 242, None),
    ("25.11", QWEN3_235B_A22B, "fp8", 256, 2048, 1, 2, 8, 4, 32, 1575, 233, None),
    ("25.09", QWEN3_235B_A22B, "fp8", 256, 2048, 1, 2, 8, 4, 32, 1204, 178, 1.0),
    ("25.09", DEEPSEEK_V3, "fp8", 1024, 8192, 1, 2, 8, 4, 64, 1297, 338, None),
]


@dataclass(frozen=True)
class MoeRun:
    """One published MoE measurement: tokens/s and model TFLOP/s per GPU."""

    release: str
    model: ModelSpec
    precision: str
    layout: ParallelLayout
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float


def moe_published() -> list[MoeRun]:
    runs = []
    for row in MEGATRON_BRIDGE_H100_MOE:
        release, model, precision, gpus, gbs, mbs, tp, pp, vp, ep, tps, tflops, capacity = row
        dp = gpus // (tp * pp)
        shape = ParallelLayout(
            tp=tp,
            pp=pp,
            dp=dp,
            mbs=mbs,
            gas=gbs // (dp * mbs),
            vpp=vp,
            ep=ep,
            zero_stage=1,
            sequence_parallel=tp > 1,
        )
        assert shape.world_size == gpus and shape.global_batch == gbs, row
        if capacity is not None:
            model = replace(model, moe=replace(model.moe, capacity_factor=capacity))
        runs.append(MoeRun(release, model, precision, shape, tps, tflops))
    return runs


def moe_order(runs: list[MoeRun], predicted: list[float]) -> tuple[int, int]:
    """Pairs of one model's rows at different layouts whose measured throughputs differ by
    more than 2%: how many the estimate orders as measured, and how many there are."""
    agree = total = 0
    for i, j in itertools.combinations(range(len(runs)), 2):
        a, b = runs[i], runs[j]
        if a.model.name != b.model.name or a.layout == b.layout:
            continue
        ma, mb = a.tokens_per_s_per_gpu, b.tokens_per_s_per_gpu
        if abs(ma - mb) <= 0.02 * max(ma, mb):
            continue
        total += 1
        agree += (predicted[i] > predicted[j]) == (ma > mb)
    return agree, total


def report_moe(runs: list[MoeRun] | None = None) -> dict[str, dict[str, float]]:
    """Issue 49, item 7: each published MoE row's ratio (predicted / measured tokens/s and
    model TFLOP/s per GPU), the estimate's and the page's FLOPs per token, the all-to-all's
    share of the step, memory, and the pairwise order between layouts of one model."""
    runs = moe_published() if runs is None else runs
    print("\n### published mixture-of-experts runs (DGX H100; FP8 rows estimated in bf16)\n")
    print(
        "| release | model | precision | layout | tokens/s measured | predicted | ratio "
        "| TFLOP/s ratio | GFLOP/token ours / page | all-to-all | memory GiB "
        "| ratio, h100-sxm-dgx profile |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    profile = load_profile("h100-sxm-dgx")
    predicted, ratios, flop_ratios = [], [], []
    for run in runs:
        gpus = run.layout.world_size
        allocation = replace(H100_DGX, nodes=max(1, gpus // 8))
        settings = EstimateSettings()
        prediction = predict(run.model, run.layout, allocation, settings)
        per_gpu = prediction.tokens_per_s / gpus
        ours = flops_per_step(run.model, 1) / run.model.seq_length
        page = run.tflops_per_gpu * 1e12 / run.tokens_per_s_per_gpu
        profiled = predict(
            run.model, run.layout, allocation, with_machine(settings, profile, allocation)
        )
        predicted.append(per_gpu)
        ratios.append(per_gpu / run.tokens_per_s_per_gpu)
        flop_ratios.append(prediction.tflops_per_device / run.tflops_per_gpu)
        print(
            f"| {run.release} | {run.model.name} | {run.precision} | {run.layout.short()} | "
            f"{run.tokens_per_s_per_gpu:.0f} | {per_gpu:.0f} | {ratios[-1]:.2f} | "
            f"{flop_ratios[-1]:.2f} | {ours / 1e9:.0f} / {page / 1e9:.0f} | "
            f"{prediction.moe_comm_s / prediction.step_time_s:.1%} | "
            f"{prediction.memory.total / 2**30:.1f} | "
            f"{profiled.tokens_per_s / gpus / run.tokens_per_s_per_gpu:.2f} |"
        )
    agree, total = moe_order(runs, predicted)
    bf16 = [r for r, run in zip(ratios, runs, strict=True) if run.precision == "bf16"]
    print(
        f"\nrows {len(runs)}; tokens/s ratio {min(ratios):.2f}–{max(ratios):.2f} (bf16 rows "
        f"{min(bf16):.2f}–{max(bf16):.2f}); TFLOP/s ratio {min(flop_ratios):.2f}–"
        f"{max(flop_ratios):.2f}; layout pairs of one model ordered as measured: "
        f"{agree} of {total}"
    )
    return {
        "moe-published": {
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "agree": agree,
            "pairs": total,
        }
    }


LLAMA3_70B = ModelSpec(
    name="llama3-70b",
    num_layers=80,
    hidden_size=8192,
    num_heads=64,
    num_kv_heads=8,
    ffn_hidden_size=28672,
    vocab_size=128256,
    seq_length=8192,
    arch="llama",
)


@dataclass(frozen=True)
class Fp8Run:
    """One published FP8-vs-BF16 pair: the same model and layout measured both ways (all
    torchtitan, float8 tensorwise through torchao, on H100s), as its speed-up."""

    label: str
    model: ModelSpec
    layout: ParallelLayout
    speedup: float
    source: str


TITAN_2412 = "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Table 1"
TITAN_ASYNC_TP = "pytorch/torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md"
TITAN_PERF = "pytorch/torchtitan docs/performance.md, Llama 3.1 table"


def fp8_published() -> list[Fp8Run]:
    """Issue 50, item 4 (the rows and their figures are those the `fp8` branch transcribed,
    benchmarks/README.md, issue 50 items 2-4): torchtitan's local batch size is per
    data-parallel rank and step, one micro-batch; its TP shards norms over the sequence."""

    def shape(tp: int, fsdp: int, mbs: int, recompute: str) -> ParallelLayout:
        return ParallelLayout(
            tp=tp, pp=1, dp=fsdp, mbs=mbs, gas=1, zero_stage=3, recompute=recompute,
            sequence_parallel=tp > 1,
        )  # fmt: skip

    return [
        Fp8Run("llama3.1-8b fsdp8", LLAMA31_8B, shape(1, 8, 2, "selective"),
               8532 / 6667, TITAN_2412),
        Fp8Run("llama3-70b fsdp32 tp8", LLAMA3_70B, shape(8, 32, 16, "full"),
               809.8 / 597.3, TITAN_ASYNC_TP),
        Fp8Run("llama3-8b fsdp8 tp8", LLAMA31_8B, shape(8, 8, 12, "selective"),
               5078.1 / 4378, TITAN_ASYNC_TP),
        Fp8Run("llama3.1-405b fsdp16 tp8", LLAMA31_405B, shape(8, 16, 2, "full"),
               177 / 109, TITAN_PERF),
    ]  # fmt: skip


def report_fp8(runs: list[Fp8Run] | None = None) -> dict[str, float]:
    """Issue 50, item 4: the estimate's FP8/BF16 step-time ratio for each published pair
    (the h100-sxm-dgx profile, torch's memory accounting and torchao's cast cost) against
    the measured speed-up, and how many lie within ±10%."""
    runs = fp8_published() if runs is None else runs
    profile = load_profile("h100-sxm-dgx")
    settings = with_machine(EstimateSettings(framework="torch"), profile, H100_GRAND_TETON)
    print("\n### published FP8 / BF16 speed-ups (torchtitan float8 tensorwise, H100)\n")
    print("| run | layout | measured | predicted | predicted / measured | source |")
    print("|---|---|---|---|---|---|")
    ratios = []
    for run in runs:
        bf16 = predict(run.model, run.layout, H100_GRAND_TETON, settings)
        fp8 = predict(run.model, replace(run.layout, precision="fp8"), H100_GRAND_TETON, settings)
        predicted = bf16.step_time_s / fp8.step_time_s
        ratios.append(predicted / run.speedup)
        print(
            f"| {run.label} | {run.layout.short()} | {run.speedup:.2f}x | {predicted:.2f}x | "
            f"{predicted / run.speedup:.2f} | {run.source} |"
        )
    within = sum(abs(r - 1) <= 0.10 for r in ratios)
    print(f"\n{within} of {len(runs)} within ±10%; ratio {min(ratios):.2f}–{max(ratios):.2f}")
    return {"within": within, "rows": len(runs), "ratio_min": min(ratios),
            "ratio_max": max(ratios)}  # fmt: skip


def main() -> None:
    if "--fp8" in sys.argv[1:]:
        report_fp8()
        return
    if "--moe" in sys.argv[1:]:
        report_moe()
        return
    if "--band" in sys.argv[1:]:
        report_band()
        report_band_on_tables()
        return
    if "--cp" in sys.argv[1:]:
        report_cp()
        return
    # Megatron-LM of 2021-22 ran a fused (unflashed) softmax; see the module docstring.
    settings = EstimateSettings(flash_attention=False)
    for name, heads, hidden, layers, _, _, gpus, batch, _, selective_s in KORTHIKANTI_TABLE5:
        model = gpt(name, layers, hidden, heads)
        mfu = flops_per_step(model, batch) / selective_s / gpus / 312e12
        assert abs(mfu - MEGATRON_README_MFU[name]) < 0.003, (name, mfu)
    summaries = {
        "narayanan-table1": report_throughput("narayanan-table1", narayanan_table1(), settings),
        "korthikanti-table5": report_throughput(
            "korthikanti-table5", korthikanti_table5(), settings
        ),
        "narayanan-table2 (check)": report_throughput(
            "narayanan-table2 (check, kept aside)", narayanan_table2(), settings
        ),
    }
    summaries.update(report_sweeps())
    memory = report_memory(settings)
    oom = report_out_of_memory(settings)
    report_structure(settings)
    summaries.update(report_with_profile("a100-80gb-dgx"))
    report_band()
    report_band_on_tables()
    report_cp()
    report_moe()
    report_fp8()
    print("\n### Summary\n")
    print("| set | ratio range | pairwise | Spearman | same best |")
    print("|---|---|---|---|---|")
    for name, s in summaries.items():
        print(
            f"| {name} | {s['ratio_min']:.2f}–{s['ratio_max']:.2f} | {s['pairwise']:.0%} | "
            f"{s['spearman']:.2f} | {'yes' if s['same_best'] else 'no'} |"
        )
    print(
        f"\nmemory / Megatron: SP+selective {memory['sp_selective_min']:.3f}–"
        f"{memory['sp_selective_max']:.3f} (target ±5%); other settings "
        f"{memory['other_min']:.3f}–{memory['other_max']:.3f} (target ±10%)"
    )
    print(
        f"published out-of-memory cases predicted out of memory: {oom['oom_caught']} of "
        f"{len(PUBLISHED_OOM)}; published runs that ran predicted out of memory: "
        f"{oom['ran_predicted_oom']} of {len(PUBLISHED_RAN)}"
    )
    t2 = {
        run.label: predicted_tflops(run, replace(settings, dp_overlap=run.dp_overlap))
        for run in narayanan_table2()
    }
    print(
        f"175B on 384 GPUs: PTD-P {t2['PTD-P 175B 384']:.1f} vs ZeRO-3 "
        f"{t2['ZeRO-3 175B 384']:.1f} TFLOP/s predicted (measured 153 vs 144)"
    )


if __name__ == "__main__":
    main()
