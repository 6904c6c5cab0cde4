"""A tiny GPT-style language model trained with PyTorch Lightning's ``Trainer`` (DDP over
gloo on CPU), started by torchrun: what search_spaces/examples/lightning/ tunes.

Written against Lightning's public API only (``LightningModule``, ``Callback``,
``Trainer(strategy="ddp", accumulate_grad_batches=...)``); the data are random token ids made
here, so nothing is downloaded. Rank 0 prints, for parsearch's regex parser:

    launch world_size=2 global_batch=8
    step 3 step_time=0.0412 loss=5.5310
    peak_rss_bytes=412345678

``--fail-on-rank R`` makes rank R raise a RuntimeError in its first training step (the
others then wait in the gradient all-reduce until torchrun stops them): the test of a
crash's reason. Module-level code, no ``main()`` decorated with torch's ``@record``.
"""

import argparse
import os
import sys
import time

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
for name, default in (("mbs", 2), ("gas", 1), ("steps", 6), ("seq-length", 64), ("layers", 2),
                      ("hidden", 64), ("heads", 4), ("vocab", 256), ("seed", 0),
                      ("fail-on-rank", -1)):  # fmt: skip
    parser.add_argument(f"--{name}", type=int, default=default)
parser.add_argument("--root-dir", default=".", help="Lightning's default_root_dir")
args = parser.parse_args()
torch.manual_seed(args.seed)
torch.set_num_threads(1)


class RandomTokens(Dataset):
    """``size`` sequences of random token ids (inputs and next-token targets), each made
    when asked for (from its index), so a long run holds none of them."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(args.seed * 1_000_003 + index)
        row = torch.randint(0, args.vocab, (args.seq_length + 1,), generator=generator)
        return row[:-1], row[1:]


class TinyGPT(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(args.vocab, args.hidden)
        self.position = nn.Parameter(torch.zeros(args.seq_length, args.hidden))
        layer = nn.TransformerEncoderLayer(
            args.hidden, args.heads, 4 * args.hidden, dropout=0.0, batch_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, args.layers)
        self.head = nn.Linear(args.hidden, args.vocab)
        mask = torch.triu(torch.full((args.seq_length, args.seq_length), float("-inf")), 1)
        self.register_buffer("mask", mask)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _index: int):
        if self.global_rank == args.fail_on_rank:
            raise RuntimeError(f"rank {self.global_rank}: loss is NaN at step {self.global_step}")
        tokens, targets = batch
        hidden = self.blocks(self.embed(tokens) + self.position, mask=self.mask, is_causal=True)
        logits = self.head(hidden)
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class StepTimes(L.Callback):
    """Prints each optimizer step's wall time on rank 0 (Lightning prints none)."""

    def __init__(self) -> None:
        self.last = time.perf_counter()
        self.step = 0

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            world = trainer.world_size
            print(f"launch world_size={world} global_batch={args.mbs * args.gas * world}")
        self.last = time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, index) -> None:
        if trainer.global_step == self.step:  # a micro-batch of gradient accumulation
            return
        self.step = trainer.global_step
        now = time.perf_counter()
        if trainer.is_global_zero:
            loss = float(outputs["loss"])
            print(f"step {self.step} step_time={now - self.last:.6f} loss={loss:.4f}", flush=True)
        self.last = now


world = int(os.environ.get("WORLD_SIZE", "1"))
samples = args.mbs * args.gas * world * (args.steps + 1)
trainer = L.Trainer(
    accelerator="cpu",
    devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
    num_nodes=int(os.environ.get("GROUP_WORLD_SIZE", "1")),
    strategy="ddp" if world > 1 else "auto",
    max_steps=args.steps,
    accumulate_grad_batches=args.gas,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    callbacks=[StepTimes()],
    default_root_dir=args.root_dir,
)
loader = DataLoader(RandomTokens(samples), batch_size=args.mbs, shuffle=False)
trainer.fit(TinyGPT(), loader)
if trainer.is_global_zero:
    with open("/proc/self/status") as status:
        kib = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
    print(f"peak_rss_bytes={int(kib) * 1024}", flush=True)
# A clean run ends here. Under load, a thread gloo leaves behind can abort the interpreter's
# teardown ("terminate called without an active exception", SIGABRT, seen with the Hugging
# Face example in a fresh-clone run) after every figure was printed, and torchrun then calls
# the trial failed; skipping the C++ destructors keeps a finished run's exit status 0.
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
