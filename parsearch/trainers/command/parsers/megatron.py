"""Megatron-LM's and Megatron-DeepSpeed's console logs.

Both print, from the last pipeline rank (``print_rank_last``), one line per log interval::

     [2024-04-06 02:55:50] iteration        3/     100 | consumed samples: 384 |
     elapsed time per iteration (ms): 5410.6 | throughput per GPU (TFLOP/s/GPU): 241.4 |
     learning rate: ... | global batch size:   128 | lm loss: 2.003316E+00 | ...

(Megatron-LM's ``training_log`` in megatron/training/training.py; Megatron-DeepSpeed's
adds ``consumed tokens``, ``actual seqlen``, ``samples per second``, ``tokens per gpu per
second (tgs)`` and ``TFLOPs``; forks derived from BigScience's print the time in seconds,
``elapsed time per iteration (s)``.) Both report memory from data-parallel rank 0 of each
pipeline stage with ``report_memory``::

    [Rank 0] (after 20 iterations) memory (MB) | allocated: ... | max allocated: ... |
    reserved: ... | max reserved: ...

where "MB" is MiB (bytes / 1024²). Megatron-DeepSpeed runs also carry DeepSpeed's own
``MaxMemAllocated=19.52GB`` (GiB) in its throughput-timer lines and ``see_memory_usage``'s
``MA 0.02 GB  Max_MA 0.08 GB  CA 0.08 GB  Max_CA 0 GB`` (GiB; ``Max_CA`` is rounded to a
whole GiB, so ``CA`` counts as reserved too); the largest of each is kept.
"""

from __future__ import annotations

import re

from parsearch.trainers.command.parsers.base import LogScan, Step, leading_number, records

_ITERATION = re.compile(r"\biteration\s+(\d+)\s*/\s*\d+\s*\|(.*)")
_MEMORY = re.compile(r"\bmemory \(MB\)\s*((?:\|\s*[^|:]+:\s*[\d.]+\s*)+)")
_DEEPSPEED_MAX_MEM = re.compile(r"\bMaxMemAllocated=([\d.]+)GB")
_SEE_MEMORY = re.compile(r"\bMax_MA ([\d.]+) GB\s+CA ([\d.]+) GB\s+Max_CA ([\d.]+) GB")
# Where a record starts, to read records another rank's output joined on one line apart.
_RECORD = re.compile(r"\biteration\s+\d+\s*/|\[Rank \d+\]")
MIB = 1024**2
GIB = 1024**3


def _fields(text: str) -> dict[str, str]:
    """``| key: value | key: value |`` into ``{key: value}`` (keys lower-cased)."""
    pairs = {}
    for part in text.split("|"):
        key, sep, value = part.rpartition(":")
        if sep and key.strip():
            pairs[key.strip().lower()] = value.strip()
    return pairs


def _number(fields: dict[str, str], *keys: str) -> float | None:
    for key in keys:
        if key in fields:
            return leading_number(fields[key])
    return None


class MegatronParser:
    """Iteration and memory lines of Megatron-LM, Megatron-DeepSpeed and their forks."""

    def __init__(self, *, deepspeed: bool = False) -> None:
        self.deepspeed = deepspeed

    def feed(self, line: str, scan: LogScan) -> None:
        for record in records(line, _RECORD):
            self._feed_record(record, scan)

    def _feed_record(self, line: str, scan: LogScan) -> None:
        if (match := _ITERATION.search(line)) is not None:
            scan.steps.append(self._step(int(match.group(1)), _fields(match.group(2))))
        elif (match := _MEMORY.search(line)) is not None:
            fields = _fields(match.group(1))
            allocated = _number(fields, "max allocated")
            reserved = _number(fields, "max reserved")
            scan.add_memory(
                None if allocated is None else allocated * MIB,
                None if reserved is None else reserved * MIB,
            )
        elif self.deepspeed and (match := _DEEPSPEED_MAX_MEM.search(line)) is not None:
            scan.add_memory(allocated=float(match.group(1)) * GIB)
        elif self.deepspeed and (match := _SEE_MEMORY.search(line)) is not None:
            peak, current, peak_reserved = (float(value) * GIB for value in match.groups())
            scan.add_memory(allocated=peak, reserved=max(current, peak_reserved))

    @staticmethod
    def _step(iteration: int, fields: dict[str, str]) -> Step:
        step_time = _number(fields, "elapsed time per iteration (ms)")
        if step_time is not None:
            step_time /= 1000.0
        else:
            step_time = _number(fields, "elapsed time per iteration (s)")
        batch = _number(fields, "global batch size")
        seq = _number(fields, "actual seqlen")
        return Step(
            index=iteration,
            step_time_s=step_time,
            global_batch=None if batch is None else int(batch),
            seq_length=None if seq is None else int(seq),
            reported_tflops_per_device=_number(
                fields, "throughput per gpu (tflop/s/gpu)", "tflops"
            ),
            loss=_number(fields, "lm loss"),
        )
