"""A tiny GPT-style language model trained with Hugging Face Accelerate (``Accelerator``,
``accumulate``, ``prepare``), data-parallel over gloo on CPU processes started by torchrun:
what search_spaces/examples/accelerate/ tunes. Random token ids made here; nothing is
downloaded. The main process prints, for parsearch's regex parser:

    launch world_size=2 global_batch=8
    step 3 step_time=0.041200 loss=5.5310
    peak_rss_bytes=412345678

``world_size`` is Accelerate's own ``num_processes``: started by ``accelerate launch --cpu``
it is 1 whatever ``--num_processes`` says, and parsearch refuses the trial of a 2-rank layout.
"""

import argparse
import os
import sys
import time

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
for name, default in (("mbs", 2), ("gas", 1), ("steps", 6), ("seq-length", 64), ("layers", 2),
                      ("hidden", 64), ("heads", 4), ("vocab", 256), ("seed", 0)):  # fmt: skip
    parser.add_argument(f"--{name}", type=int, default=default)
args = parser.parse_args()
torch.manual_seed(args.seed)
torch.set_num_threads(1)
accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.gas)


class RandomTokens(Dataset):
    """Random token ids, each sequence made from its index when asked for."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(args.seed * 1_000_003 + index)
        row = torch.randint(0, args.vocab, (args.seq_length + 1,), generator=generator)
        return row[:-1], row[1:]


class TinyGPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(args.vocab, args.hidden)
        layer = nn.TransformerEncoderLayer(
            args.hidden, args.heads, 4 * args.hidden, dropout=0.0, batch_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, args.layers)
        self.head = nn.Linear(args.hidden, args.vocab)
        mask = torch.triu(torch.full((args.seq_length, args.seq_length), float("-inf")), 1)
        self.register_buffer("mask", mask)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens), mask=self.mask, is_causal=True))


world = accelerator.num_processes
if accelerator.is_main_process:
    print(f"launch world_size={world} global_batch={args.mbs * args.gas * world}", flush=True)
data = RandomTokens(args.mbs * args.gas * world * args.steps)
model = TinyGPT()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
loader = DataLoader(data, batch_size=args.mbs, shuffle=False)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
step, last = 0, time.perf_counter()
for tokens, targets in loader:
    with accelerator.accumulate(model):
        logits = model(tokens)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    if accelerator.sync_gradients:  # an optimizer step ended
        step += 1
        now = time.perf_counter()
        if accelerator.is_main_process:
            print(f"step {step} step_time={now - last:.6f} loss={loss.item():.4f}", flush=True)
        last = now
accelerator.wait_for_everyone()
if accelerator.is_main_process:
    with open("/proc/self/status") as status:
        kib = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
    print(f"peak_rss_bytes={int(kib) * 1024}", flush=True)
accelerator.end_training()
# A clean run ends here. Under load, a thread gloo leaves behind can abort the interpreter's
# teardown ("terminate called without an active exception", SIGABRT, seen with the Hugging
# Face example in a fresh-clone run) after every figure was printed, and torchrun then calls
# the trial failed; skipping the C++ destructors keeps a finished run's exit status 0.
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
