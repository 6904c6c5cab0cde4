"""A nanoGPT-style training script (github.com/karpathy/nanoGPT, train.py's shape): module-level
code, settings overridden by ``--key=value``, DDP switched on by torchrun's ``RANK``, and
``gradient_accumulation_steps`` meaning the total over every rank (divided by the world size
inside, as nanoGPT does). A tiny GPT on random tokens, on the CPU over gloo; nothing is
downloaded. It prints what nanoGPT prints (master process only):

    tokens per iteration will be: 4,096
    iter 3: loss 5.5310, time 41.20ms

No ``main()`` to decorate with torch's ``@record``, and no memory figure: parsearch measures
the processes itself.
"""

import os
import sys
import time

import torch
from torch import nn
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel

# settings (nanoGPT's configurator: --key=value on the command line)
batch_size = 2
gradient_accumulation_steps = 1
block_size = 64
n_layer = 2
n_head = 4
n_embd = 64
vocab_size = 256
max_iters = 6
seed = 0
for arg in sys.argv[1:]:
    key, value = arg[2:].split("=", 1)
    assert key in globals(), f"unknown setting {key}"
    globals()[key] = int(value)

ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    init_process_group(backend="gloo")
    ddp_rank = int(os.environ["RANK"])
    ddp_world_size = int(os.environ["WORLD_SIZE"])
    master_process = ddp_rank == 0
    assert gradient_accumulation_steps % ddp_world_size == 0
    gradient_accumulation_steps //= ddp_world_size
else:
    ddp_rank, ddp_world_size, master_process = 0, 1, True
tokens_per_iter = gradient_accumulation_steps * ddp_world_size * batch_size * block_size
if master_process:
    print(f"tokens per iteration will be: {tokens_per_iter:,}")
torch.manual_seed(seed + ddp_rank)
torch.set_num_threads(1)

layer = nn.TransformerEncoderLayer(n_embd, n_head, 4 * n_embd, dropout=0.0, batch_first=True)
model = nn.ModuleDict(
    {
        "wte": nn.Embedding(vocab_size, n_embd),
        "blocks": nn.TransformerEncoder(layer, n_layer),
        "head": nn.Linear(n_embd, vocab_size),
    }
)
mask = torch.triu(torch.full((block_size, block_size), float("-inf")), 1)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
raw_model = model
if ddp:
    model = DistributedDataParallel(model)


def forward(tokens):
    inner = model.module if ddp else model
    hidden = inner["blocks"](inner["wte"](tokens), mask=mask, is_causal=True)
    return inner["head"](hidden)


def get_batch():
    data = torch.randint(0, vocab_size, (batch_size, block_size + 1))
    return data[:, :-1], data[:, 1:]


t0 = time.time()
for iter_num in range(1, max_iters + 1):
    for micro_step in range(gradient_accumulation_steps):
        if ddp:
            model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
        x, y = get_batch()
        logits = forward(x)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
        (loss / gradient_accumulation_steps).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    t1 = time.time()
    dt, t0 = t1 - t0, t1
    if master_process:
        print(f"iter {iter_num}: loss {loss.item():.4f}, time {dt * 1000:.2f}ms", flush=True)
if ddp:
    destroy_process_group()
