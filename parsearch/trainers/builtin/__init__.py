"""The built-in benchmark trainer: a GPT-style model trained for a few steps with torch's own
tensor, pipeline and data parallelism, to measure how fast a layout really is.

Entry points
    ``python -m parsearch.trainers.builtin --spec trial.json [--out result.json]`` is one
    rank; the rank's place comes from torchrun-style variables (the node agent's), Open MPI,
    MPICH/PMI or Slurm. :func:`run_trial` runs a whole trial on this machine through the node
    agent (:mod:`parsearch.launch.process`), which forks the ranks from a server that has
    already imported
    torch (:mod:`parsearch.launch.prefork`).

Model (:mod:`~parsearch.trainers.builtin.model`)
    Pre-norm decoder, attention through ``scaled_dot_product_attention`` (causal). ``gpt``:
    learned positions, LayerNorm, biases, GELU, tied embeddings. ``llama``: RMSNorm, no
    biases, SwiGLU, rotary positions, grouped-query attention, untied. Synthetic tokens from
    the seed; the same global batch every step, so the loss falls.

Parallelism (:mod:`~parsearch.trainers.builtin.parallelize`), on a ``(dp, pp, tp)`` device mesh
    * TP: DTensor plans, column-parallel Q/K/V and FFN-in, row-parallel projections out,
      vocabulary-parallel embedding and output with a vocabulary-parallel cross-entropy (the
      logits are never gathered). ``sequence_parallel``: norms and residual stream sharded
      over the sequence (``SequenceParallel``).
    * PP: ``torch.distributed.pipelining``, ``gas`` micro-batches; ``trainer.schedule``
      ``1f1b`` (default) or ``gpipe``; ``ScheduleInterleaved1F1B`` whenever ``vpp > 1``
      (rank ``r`` holds stages ``r, r + pp, ...``). A tied embedding's two copies (first and
      last stage) have their gradients summed, as Megatron's embedding group does.
    * DP, ``zero_stage`` 0: DDP for plain data parallelism (bucketed, overlapped with
      backward); with TP or PP a bucketed all-reduce after backward (DDP takes no DTensors and
      trips over pipeline schedules). ``zero_stage`` >= 1: FSDP2 ``fully_shard`` per layer
      and per stage. FSDP2 always shards weights, gradients and optimizer states between
      steps; the stages map onto its settings as closely as it allows: 3 =
      ``reshard_after_forward=True`` (weights gathered again for backward); 2 =
      ``reshard_after_forward=False`` (gathered once per micro-batch, gradients
      reduce-scattered every micro-batch); 1 = as 2 but gradients reduce-scattered after the
      last micro-batch only (full gradients accumulate, as ZeRO-1). Under a pipeline
      schedule the schedule itself defers reduction to the last micro-batch. In bf16, FSDP2
      gathers bf16 weights and reduces in fp32.
    * recompute ``full``: each layer checkpointed (non-reentrant ``checkpoint_wrapper``; it
      stops re-running a layer once backward has what it needs, so the FFN down-projection
      is not recomputed). ``selective``: only the attention core (softmax(QKᵀ)V); with fused
      attention (always on CPU) that saves little, since the kernel keeps only its output
      and log-sum-exp.

Numerics
    Every layout computes what one process would: weights are initialised per parameter
    from the seed and the parameter's global name (any split gets identical values), data
    is split by rows of the same global batch, each micro-batch's mean loss is divided by
    ``gas`` (the pipeline schedules scale gradients the same way) and gradients are averaged
    over data-parallel ranks. AdamW (fused) with a fixed learning rate.

Precision and devices
    ``trainer.device``/``trainer.precision`` ``auto``: bf16 autocast with NCCL on CUDA (when
    the allocation is a GPU one and a GPU is visible), fp32 with gloo on CPU.

What a trial reports (``TrialResult.metrics``)
    ``step_time_s`` (median of the measured steps, each the slowest rank's, after a barrier
    and a device synchronisation), ``step_time_spread_s`` (max - min), ``step_times_s`` (all
    steps, warm-up first), ``tokens_per_step``, ``tokens_per_s``, ``model_flops_per_step``
    (:func:`parsearch.estimate.flops_per_step`, no recompute), ``tflops_per_device``,
    ``mfu`` (against ``allocation.peak_flops_per_device``), ``losses`` (every step),
    ``peak_mem_bytes`` (max over ranks) and ``peak_mem_bytes_per_rank``: on CUDA
    ``max_memory_allocated``; on CPU the tensor-level peak of one step traced by
    ``MemTracker`` (``peak_mem_breakdown_rank0`` by category), beside ``peak_rss_bytes``
    (``VmHWM``, runtime included), ``phases_s`` (where rank 0's time went), ``layout``,
    ``world_size``, ``device``, ``precision``, ``schedule``, ``warmup_steps``, ``steps``,
    ``memory_cap_bytes``. A CUDA out-of-memory error ends the trial as ``oom``; so does a
    traced peak above ``trainer.memory_cap_bytes`` (or ``allocation.device_memory_bytes``
    with ``trainer.enforce_memory_cap``), which makes the memory wall real on a CPU.
    :func:`parsearch.estimate.memory_per_rank` with ``EstimateSettings(framework="torch")``
    predicts this trainer's peak.
"""

from __future__ import annotations

from pathlib import Path

from parsearch.result import TrialResult
from parsearch.trial import TrialSpec


def run_trial(spec: TrialSpec, trial_dir: Path | None = None, prefork: bool = True) -> TrialResult:
    """Run ``spec`` on this machine (all its ranks, via :func:`parsearch.launch.process.run_local`).

    ``trial_dir`` keeps the spec, result and per-rank logs; without it they live in a
    temporary directory and only the result (with a log tail on failure) remains. With
    ``prefork`` the ranks are forked from a server that has imported torch already
    (:mod:`parsearch.launch.prefork`), else started as new programs.
    """
    from parsearch.launch.process import run_local

    return run_local(spec, trial_dir, prefork=prefork)


__all__ = ["run_trial"]
