"""torchtitan's console log.

``MetricsProcessor.log`` (torchtitan/components/metrics.py, v0.2.x and main) prints, every
``metrics.log_freq`` steps, on every rank (``torchrun --local-ranks-filter`` picks which reach
the console)::

    [rank0]:[titan] 2026-05-18 16:04:47,456 - root - INFO - step: 15  loss:  3.10680
    grad_norm:  0.8587  memory:  9.46GiB(64.99%)  tps: 7,334  tflops: 0.53  mfu: 0.17%

``tps`` is tokens per second per device (local tokens / time / the non-data-parallel size),
so the whole trial's rate is ``tps × world size``; ``memory`` is the peak reserved by the
caching allocator; ``mfu`` is in percent, or ``N/A`` under FP8/MX quantisation. Validation
lines (``validate step:``) are not training steps and are skipped.
"""

from __future__ import annotations

import re

from parsearch.trainers.command.parsers.base import LogScan, Step, leading_number, records

_PAIR = re.compile(r"\b(step|loss|memory|tps|tflops|mfu):\s*(\S+)")
_RECORD = re.compile(r"\b(?:validate )?step:")  # a step line's (or a validation line's) start
GIB = 1024**3


class TorchtitanParser:
    """Step lines of torchtitan's trainer."""

    def feed(self, line: str, scan: LogScan) -> None:
        for record in records(line, _RECORD):
            self._feed_record(record, scan)

    def _feed_record(self, line: str, scan: LogScan) -> None:
        if "step:" not in line or "validate step:" in line:
            return
        values = dict(_PAIR.findall(line))
        if "step" not in values or "tps" not in values:
            return
        step = leading_number(values["step"])
        if step is None:
            return
        mfu = leading_number(values["mfu"]) if "mfu" in values else None
        scan.steps.append(
            Step(
                index=int(step),
                tokens_per_s_per_device=leading_number(values["tps"]),
                reported_tflops_per_device=leading_number(values.get("tflops", "")),
                reported_mfu=None if mfu is None else mfu / 100.0,
                loss=leading_number(values.get("loss", "")),
            )
        )
        if "memory" in values and values["memory"].find("GiB") > 0:
            reserved = leading_number(values["memory"])
            if reserved is not None:
                scan.add_memory(reserved=reserved * GIB)
