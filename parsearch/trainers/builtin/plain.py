"""The yardstick: the same model, batch and optimizer (fused AdamW, as the trainer) trained by
a plain single-process loop (no process group, no wrappers, the whole global batch in one
forward).

Tests compare every layout's losses with it, and the benchmark compares the built-in
trainer's step time with it.
"""

from __future__ import annotations

import time

import torch

from parsearch.trainers.builtin.model import Transformer, loss_fn, materialize
from parsearch.trainers.builtin.trainer import TrainerSettings, synthetic_batch
from parsearch.trial import TrialSpec


def plain_training(spec: TrialSpec, steps: int) -> tuple[list[float], list[float]]:
    """Per-step losses and wall times (seconds) of ``steps`` optimizer steps on the CPU."""
    settings = TrainerSettings.from_spec(spec)
    with torch.device("meta"):
        model = Transformer(spec.model)
    materialize(model, torch.device("cpu"), spec.seed)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay, fused=True
    )
    tokens = synthetic_batch(spec)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    losses, times = [], []
    for _ in range(steps):
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    return losses, times
