"""Peak memory of a rank, measured the best way each device allows.

* CUDA/ROCm: the caching allocator's ``max_memory_allocated`` over the training steps.
* CPU: torch keeps no allocator statistics, so one training step runs under
  :class:`~torch.distributed._tools.mem_tracker.MemTracker`, which follows every tensor
  storage created or registered (weights, gradients, optimizer states, activations,
  temporaries, communication buffers); its peak is the tensor-level figure the estimate
  predicts. The process's peak resident set (``VmHWM``, reset by writing 5 to
  ``/proc/self/clear_refs``) is reported beside it: it also counts the Python and torch
  runtime (a few hundred MiB) and allocator slack.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn


def reset_peak_rss() -> None:
    """Start a new peak-RSS window (Linux; silently a no-op elsewhere)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def peak_rss_bytes() -> int | None:
    """Peak resident set since the last :func:`reset_peak_rss` (``None`` off Linux)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class TensorPeak:
    """Tensor-level peak bytes of a step run inside :meth:`track` (CPU), or of everything
    since :meth:`reset` (CUDA)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peak_bytes: int | None = None
        self.breakdown: dict[str, int] = {}

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    @contextlib.contextmanager
    def track(self, modules: list[nn.Module], optimizer: torch.optim.Optimizer) -> Iterator[None]:
        """Trace the memory of the code run inside (CPU only; free on CUDA)."""
        if self.device.type == "cuda":
            yield
            return
        tracker = _step_tracker(modules)
        tracker.track_external(*modules, optimizer)
        with tracker:
            yield
        snapshot = tracker.get_tracker_snapshot("peak").get(self.device, {})
        self.breakdown = {getattr(k, "value", str(k)): int(v) for k, v in snapshot.items()}
        self.peak_bytes = int(snapshot.get("Total", 0))

    def finish(self) -> int | None:
        """The peak: the traced step's on CPU, the allocator's since reset on CUDA."""
        if self.device.type == "cuda":
            self.peak_bytes = int(torch.cuda.max_memory_allocated(self.device))
        return self.peak_bytes


def _step_tracker(roots: list[nn.Module]):
    """A ``MemTracker`` that accepts its root modules being called once per micro-batch.

    MemTracker refuses a second forward of a root module (it assumes that means a second
    iteration); with gradient accumulation or a pipeline schedule that is one step. Forgetting
    the root's per-module statistics before each forward keeps the global peak, which is all
    we read.
    """
    from torch.distributed._tools.mem_tracker import MemTracker

    class StepMemTracker(MemTracker):
        def _pre_fw_hook(self, module: nn.Module, inputs: object) -> None:
            if any(module is root for root in roots):
                self.memory_tracking.pop(module, None)
            super()._pre_fw_hook(module, inputs)

    return StepMemTracker()
