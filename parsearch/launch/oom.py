"""Recognise an out-of-memory failure in a rank's log: the one classifier the node agent and
the trainers share.

A layout that does not fit is an answer (``oom``), not a bug (``error``): the optimiser learns
the memory wall from it. The patterns below are the messages the stacks we launch really
print, so an unrelated line that merely mentions memory is not mistaken for one:

* PyTorch's caching allocator, CUDA and ROCm: ``torch.OutOfMemoryError: CUDA out of memory.
  Tried to allocate 2.00 GiB. GPU 0 has a total capacity of ...`` (``HIP out of memory`` on
  ROCm; ``torch.cuda.OutOfMemoryError`` before torch 2.5);
* the runtimes themselves: ``CUDA error: out of memory``, ``hipErrorOutOfMemory``,
  ``cudaErrorMemoryAllocation``, the BLAS libraries' ``*_STATUS_ALLOC_FAILED``;
* host memory: ``RuntimeError: [enforce fail at alloc_cpu.cpp:...] DefaultCPUAllocator:
  can't allocate memory``, any other ``RuntimeError: ... out of memory`` and Python's own
  ``MemoryError``;
* NCCL/RCCL's ``NCCL WARN ... out of memory`` and Slurm's ``oom_kill event`` (the kernel's
  OOM killer took a rank).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

OOM_PATTERN = re.compile(
    "|".join(
        (
            r"\b(?:CUDA|HIP) out of memory\b",
            r"\bOutOfMemoryError\b",
            r"\b(?:CUDA|HIP) error: out of memory\b",
            r"\bhipErrorOutOfMemory\b",
            r"\bcudaErrorMemoryAllocation\b",
            r"\b(?:CUBLAS|HIPBLAS|ROCBLAS|CUSPARSE)_STATUS_ALLOC_FAILED\b",
            r"\bDefaultCPUAllocator: can't allocate memory\b",
            r"\bRuntimeError:.*\bout of memory\b",
            r"^\s*MemoryError\b",
            r"\bNCCL WARN\b.*\bout of memory\b",
            r"\boom[_-]kill\b",
        )
    ),
    re.IGNORECASE,
)


def is_oom_line(line: str) -> bool:
    """Whether one log line reports that a rank ran out of (device or host) memory."""
    return OOM_PATTERN.search(line) is not None


def looks_like_oom(text: str) -> bool:
    """Whether any line of ``text`` (say a log's tail) reports an out-of-memory failure."""
    return first_oom_line(text.splitlines()) is not None


def first_oom_line(lines: Iterable[str]) -> str | None:
    """The first out-of-memory line of a log, stripped, or ``None``."""
    for line in lines:
        if is_oom_line(line):
            return line.strip()
    return None
