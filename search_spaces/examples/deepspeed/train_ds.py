"""A tiny GPT trained by DeepSpeed on its CPU accelerator over gloo, for a CPU campaign
(``deepspeed-zero-cpu.yaml`` beside this file).

The model (token and position embeddings, pre-norm transformer layers with a causal mask,
a language-model head) and its data (random token ids) are made here. Everything about the
layout reaches DeepSpeed through the ``ds_config.json`` the space writes into the trial
directory (``trainer.files``): batch sizes, gradient accumulation and the ZeRO stage, the
same keys ``parsearch best --format deepspeed`` prints. DeepSpeed prints its own throughput
line every step (``steps_per_print: 1``; an INFO message, so the log level is set to info),
which the space's regex patterns read::

    epoch=0/micro_step=8/global_step=4, RunningAvgSamplesPerSec=51.2, CurrSamplesPerSec=55.0,
    MemAllocated=0.41GB, MaxMemAllocated=0.42GB
"""

from __future__ import annotations

import argparse
import json

import deepspeed
import torch
from deepspeed.utils.logging import set_log_level_from_string
from torch import nn


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, seq_length: int, hidden: int, heads: int, layers: int):
        super().__init__()
        self.tokens = nn.Embedding(vocab, hidden)
        self.positions = nn.Embedding(seq_length, hidden)
        layer = nn.TransformerEncoderLayer(
            hidden, heads, 4 * hidden, dropout=0.0, batch_first=True, norm_first=True
        )
        self.layers = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(hidden, vocab, bias=False)
        mask = torch.triu(torch.full((seq_length, seq_length), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.tokens(ids) + self.positions(positions)
        x = self.layers(x, mask=self.mask, is_causal=True)
        logits = self.head(x)
        return nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deepspeed-config", default="ds_config.json")
    parser.add_argument("--steps", type=int, required=True, help="optimizer steps")
    parser.add_argument("--seq-length", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    set_log_level_from_string("info")  # the throughput line is an INFO message
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(args.seed)
    with open(args.deepspeed_config) as handle:
        config = json.load(handle)
    model = TinyGPT(args.vocab, args.seq_length, args.hidden, args.heads, args.layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    generator = torch.Generator().manual_seed(args.seed + engine.global_rank)
    micro = engine.train_micro_batch_size_per_gpu()
    for _ in range(args.steps * engine.gradient_accumulation_steps()):
        ids = torch.randint(0, args.vocab, (micro, args.seq_length), generator=generator)
        loss = engine(ids)
        engine.backward(loss)
        engine.step()
    if engine.global_rank == 0:
        print(f"final loss {loss.item():.4f} after {engine.global_steps} steps", flush=True)
    if torch.distributed.is_initialized():
        # Left to interpreter exit, gloo's threads can abort a rank after its figures printed.
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
