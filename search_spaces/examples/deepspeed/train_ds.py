"""A tiny GPT trained by DeepSpeed on its CPU accelerator over gloo, for a CPU campaign
(``deepspeed-zero-cpu.yaml`` beside this file); ``--device cuda`` runs it on GPUs over NCCL
(DeepSpeed then picks its CUDA accelerator), as benchmarks/gpu_check.py does.

The model (token and position embeddings, pre-norm transformer layers with a causal mask,
a language-model head) and its data (random token ids) are made here. Everything about the
batch and ZeRO reaches DeepSpeed through the ``ds_config.json`` the space writes into the
trial directory (``trainer.files``): batch sizes, gradient accumulation and the ZeRO stage,
the same keys ``parsearch best --format deepspeed`` prints. The pipeline size is not a
DeepSpeed config key (it is ``PipelineModule``'s ``num_stages``), so it comes as ``--pp``:

* ``--pp 1``: the model is one module under DeepSpeed's engine, which prints its
  throughput line every step (``steps_per_print: 1``; an INFO message, so the log level is
  set to info) from global step 3 on::

    epoch=0/micro_step=8/global_step=4, RunningAvgSamplesPerSec=51.2, CurrSamplesPerSec=55.0,
    MemAllocated=0.41GB, MaxMemAllocated=0.42GB

* ``--pp 2`` (or more): the same layers cut into stages by DeepSpeed's ``PipelineModule``
  and trained by its ``PipelineEngine`` (``train_batch``), which prints from global step 1
  (``deepspeed/runtime/pipe/engine.py``, ``train_batch``; no memory figure)::

    steps: 4 loss: 5.8456 iter time (s): 0.117 samples/sec: 34.170

  The pipeline engine refuses ZeRO stages 2 and 3 (``engine.py``: "ZeRO-2 and ZeRO-3 are
  incompatible with pipeline parallelism"); the space excludes those layouts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator

import deepspeed
import torch
from deepspeed.pipe import PipelineModule
from deepspeed.utils.logging import set_log_level_from_string
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record


class Embedding(nn.Module):
    """Token plus position embeddings: the first layer, fed the token ids."""

    def __init__(self, vocab: int, seq_length: int, hidden: int):
        super().__init__()
        self.tokens = nn.Embedding(vocab, hidden)
        self.positions = nn.Embedding(seq_length, hidden)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.tokens(ids) + self.positions(positions)


class Block(nn.Module):
    """One pre-norm transformer layer with a causal mask (its own, so a stage needs nothing
    from another stage but the activations)."""

    def __init__(self, seq_length: int, hidden: int, heads: int):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(
            hidden, heads, 4 * hidden, dropout=0.0, batch_first=True, norm_first=True
        )
        mask = torch.triu(torch.full((seq_length, seq_length), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x, src_mask=self.mask, is_causal=True)


def gpt_layers(args: argparse.Namespace) -> list[nn.Module]:
    """The model as a flat list of layers, which both engines take."""
    return [
        Embedding(args.vocab, args.seq_length, args.hidden),
        *(Block(args.seq_length, args.hidden, args.heads) for _ in range(args.layers)),
        nn.Linear(args.hidden, args.vocab, bias=False),
    ]


def next_token_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)
    )


class TinyGPT(nn.Module):
    """The layers in one module whose forward returns the loss (DeepSpeed's plain engine)."""

    def __init__(self, layers: list[nn.Module]):
        super().__init__()
        self.layers = nn.Sequential(*layers)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return next_token_loss(self.layers(ids), ids)


def token_batches(args: argparse.Namespace, micro: int, seed: int) -> Iterator[tuple]:
    """Random token ids, as (inputs, labels) pairs: the pipeline's first stage reads the
    inputs and its last stage the labels, each from its own copy of this iterator, so every
    stage of one pipeline must be given the same ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    while True:
        ids = torch.randint(0, args.vocab, (micro, args.seq_length), generator=generator)
        yield ids, ids


@record  # torchrun's summary then carries the traceback of a rank --local-ranks-filter hides
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deepspeed-config", default="ds_config.json")
    parser.add_argument("--steps", type=int, required=True, help="optimizer steps")
    parser.add_argument("--pp", type=int, default=1, help="pipeline stages")
    parser.add_argument("--seq-length", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="cuda: DeepSpeed over NCCL"
    )
    args = parser.parse_args()

    set_log_level_from_string("info")  # the plain engine's throughput line is INFO
    deepspeed.init_distributed(dist_backend="gloo" if args.device == "cpu" else "nccl")
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    with open(args.deepspeed_config) as handle:
        config = json.load(handle)
    layers = gpt_layers(args)
    if args.pp > 1:
        model = PipelineModule(
            layers=layers,
            num_stages=args.pp,
            loss_fn=next_token_loss,
            partition_method="uniform",
        )
    else:
        model = TinyGPT(layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    micro = engine.train_micro_batch_size_per_gpu()
    if args.pp > 1:
        batches = token_batches(args, micro, args.seed + engine.grid.get_data_parallel_rank())
        for _ in range(args.steps):
            loss = engine.train_batch(batches)
    else:
        batches = token_batches(args, micro, args.seed + engine.global_rank)
        for _ in range(args.steps * engine.gradient_accumulation_steps()):
            ids, _ = next(batches)
            loss = engine(ids.to(engine.device))  # the pipeline engine moves its own
            engine.backward(loss)
            engine.step()
    if engine.global_rank == 0:
        print(f"final loss {loss.item():.4f} after {engine.global_steps} steps", flush=True)
    if torch.distributed.is_initialized():
        # Left to interpreter exit, gloo's threads can abort a rank after its figures printed.
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
    # A clean run ends here. Under load, a thread DeepSpeed's ZeRO-3 leaves behind can still
    # abort the interpreter's teardown ("terminate called without an active exception",
    # SIGABRT) after every figure was printed; skipping the C++ destructors keeps a finished
    # run's exit status 0. A failure raised in main() still exits as before.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
