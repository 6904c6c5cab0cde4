"""The ``json`` format: a trainer written for parsearch reports its own summary.

The last output line that is a JSON object with at least ``tokens_per_s`` wins; it may also
carry ``step_time_s``, ``tflops_per_device``, ``mfu``, ``peak_mem_bytes`` and ``status``
(``ok``, ``oom``, ``error``), so a trainer that catches its own OOM can still say so. A
launcher's prefix before the object (``[rank3]:``) is allowed. ``world_size`` and
``global_batch``, in any JSON line, are what the program was launched as, checked against
the layout.
"""

from __future__ import annotations

import json

from parsearch.trainers.command.parsers.base import LogScan

SUMMARY_KEYS = ("tokens_per_s", "step_time_s", "tflops_per_device", "mfu", "peak_mem_bytes")
LAUNCH_KEYS = ("world_size", "global_batch")


class JsonParser:
    """Keeps the last JSON summary line of a log."""

    def feed(self, line: str, scan: LogScan) -> None:
        start = line.find("{")
        text = line[start:].strip() if start >= 0 else ""
        if not text.endswith("}"):
            return
        try:
            data = json.loads(text)
        except ValueError:
            return
        if not isinstance(data, dict):
            return
        for key in LAUNCH_KEYS:
            if _is_number(data.get(key)):
                scan.add_launch(key, float(data[key]))
        if not _is_number(data.get("tokens_per_s")):
            return
        summary = {key: float(data[key]) for key in SUMMARY_KEYS if _is_number(data.get(key))}
        if isinstance(data.get("status"), str):
            summary["status"] = data["status"].lower()
        scan.summary = summary


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
