"""Hugging Face ``transformers.Trainer`` on a tiny, randomly initialised GPT-2, for a CPU
campaign (``hf-trainer-gpt2-cpu.yaml`` beside this file).

Everything is made here: the model from a ``GPT2Config`` (no hub download; run with
``HF_HUB_OFFLINE=1``) and random token ids as the data set. The layout reaches the Trainer
as it would in any user's script: ``--mbs`` is ``per_device_train_batch_size``, ``--gas``
``gradient_accumulation_steps``; under ``torchrun`` the Trainer wraps the model in DDP over
gloo (``--device cuda``: over NCCL, in bf16, as benchmarks/gpu_check.py runs it on a GPU).
The Trainer prints a ``{'loss': ...}`` dictionary every step and, once at the end,
``train_samples_per_second`` -- a figure for the whole run, start-up and first steps
included. So a ``TrainerCallback`` (the Trainer's public hook) prints each optimizer step's
wall time, which the space's patterns read, with the warm-up steps left out by parsearch:

    launch world_size=2 global_batch=8
    step 3 step_time=0.041200
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from torch.utils.data import Dataset
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)


class StepTimes(TrainerCallback):
    """Prints each optimizer step's wall time, and the world size and global batch the
    Trainer runs, on the main process (the Trainer prints neither)."""

    def __init__(self) -> None:
        self.last = time.perf_counter()

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            batch = args.per_device_train_batch_size * args.gradient_accumulation_steps
            print(f"launch world_size={args.world_size} global_batch={batch * args.world_size}")
        self.last = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        if state.is_world_process_zero:
            print(f"step {state.global_step} step_time={now - self.last:.6f}", flush=True)
        self.last = now


class RandomTokens(Dataset):
    """``count`` sequences of random token ids (labels = inputs, as for pre-training)."""

    def __init__(self, count: int, seq_length: int, vocab_size: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab_size, (count, seq_length), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mbs", type=int, required=True, help="micro-batch per rank")
    parser.add_argument("--gas", type=int, required=True, help="gradient accumulation steps")
    parser.add_argument("--steps", type=int, required=True, help="optimizer steps")
    parser.add_argument("--seq-length", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="hf-out", help="the Trainer's output directory")
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="cuda: DDP over NCCL, bf16"
    )
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    config = GPT2Config(
        vocab_size=args.vocab,
        n_positions=args.seq_length,
        n_embd=args.hidden,
        n_layer=args.layers,
        n_head=args.heads,
    )
    model = GPT2LMHeadModel(config)
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    samples = args.mbs * args.gas * max(world, 1) * args.steps * 2
    training = TrainingArguments(
        output_dir=args.out,
        per_device_train_batch_size=args.mbs,
        gradient_accumulation_steps=args.gas,
        max_steps=args.steps,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=args.device == "cpu",
        ddp_backend="gloo" if args.device == "cpu" else "nccl",
        bf16=args.device == "cuda",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=args.seed,
    )
    data = RandomTokens(samples, args.seq_length, args.vocab, args.seed)
    Trainer(model=model, args=training, train_dataset=data, callbacks=[StepTimes()]).train()
    if torch.distributed.is_initialized():
        # Left to interpreter exit, gloo's threads can abort the rank ("terminate called
        # without an active exception") after the run has printed its figures.
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
    # A clean run ends here. Under load, a thread gloo or the Trainer leaves behind can still
    # abort the interpreter's teardown ("terminate called without an active exception",
    # SIGABRT: rank 0 of a fresh-clone run, after its last figures) and torchrun then calls
    # the trial failed; skipping the C++ destructors keeps a finished run's exit status 0,
    # as train_ds.py does. A failure raised in main() still exits as before.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
