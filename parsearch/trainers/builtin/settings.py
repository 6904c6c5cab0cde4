"""The built-in trainer's ``trainer:`` section as a typed value, validated in one place for
both the search space (when it is loaded) and the ranks (when they start). Imports no torch."""

from __future__ import annotations

import difflib
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from parsearch.errors import TrainerError

if TYPE_CHECKING:
    from parsearch.trial import TrialSpec

SCHEDULES = ("1f1b", "gpipe")
DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("auto", "bf16", "fp32")
# What a search space may set (``kind`` and ``timeout`` belong to the driver; the memory cap
# of a rehearsal comes from the allocation, so a space does not set ``memory_cap_bytes``).
SECTION_KEYS = (
    "kind",
    "steps",
    "warmup_steps",
    "timeout",
    "schedule",
    "precision",
    "device",
    "enforce_memory_cap",
    "lr",
    "weight_decay",
)

# Builds the exception for a bad value: (field such as "trainer.steps", message) -> error.
Failure = Callable[[str, str], Exception]


def _positive_int(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= 1


def _positive_number(value: Any) -> bool:
    # NaN and infinity are floats too; either would poison every prediction or wait.
    return not isinstance(value, bool) and isinstance(value, int | float) and 0 < value < math.inf


@dataclass(frozen=True)
class TrainerSettings:
    """The built-in trainer's options (the ``trainer:`` section of a search space).

    ``device``/``precision`` default to ``auto``: CUDA with bf16 autocast and NCCL when a GPU
    is visible, else CPU with fp32 and gloo. ``memory_cap_bytes`` (else the space's
    ``memory_cap``) turns a measured peak above it into an ``oom`` result (the memory wall of
    a CPU rehearsal); ``enforce_memory_cap`` uses ``allocation.device_memory_bytes`` as the
    cap. On CPU the memory of the last
    warm-up step is traced (the first measured step if ``warmup_steps`` is 0, whose time then
    includes the tracer's overhead; under pipelining never the very first step).
    """

    steps: int = 5
    warmup_steps: int = 2
    schedule: str = "1f1b"
    device: str = "auto"
    precision: str = "auto"
    lr: float = 1e-3
    weight_decay: float = 0.1
    memory_cap_bytes: int | None = None
    enforce_memory_cap: bool = False

    @classmethod
    def from_section(cls, section: Mapping[str, Any], fail: Failure) -> TrainerSettings:
        """The settings of ``section``; a bad value raises ``fail(field, message)``. Keys that
        are not settings (``kind``, ``timeout``, unknown ones) are the caller's to judge."""
        known = {f.name for f in fields(cls)}
        values = {key: value for key, value in section.items() if key in known}
        if "steps" in values and not _positive_int(values["steps"]):
            raise fail("trainer.steps", f"must be a positive integer, got {values['steps']!r}")
        warmup = values.get("warmup_steps", 0)
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise fail("trainer.warmup_steps", f"must be an integer >= 0, got {warmup!r}")
        for key, choices in (
            ("schedule", SCHEDULES),
            ("device", DEVICES),
            ("precision", PRECISIONS),
        ):
            if key in values and values[key] not in choices:
                message = f"must be one of {list(choices)}, got {values[key]!r}"
                raise fail(f"trainer.{key}", message)
        if not isinstance(values.get("enforce_memory_cap", False), bool):
            raise fail("trainer.enforce_memory_cap", "must be true or false")
        for key in ("lr", "weight_decay"):
            if key in values:
                if not _positive_number(values[key]):
                    raise fail(
                        f"trainer.{key}", f"must be a positive finite number, got {values[key]!r}"
                    )
                values[key] = float(values[key])
        cap = values.get("memory_cap_bytes")
        if cap is not None and not _positive_int(cap):
            raise fail("trainer.memory_cap_bytes", f"must be a positive integer, got {cap!r}")
        return cls(**values)

    @classmethod
    def from_spec(cls, spec: TrialSpec) -> TrainerSettings:
        """A rank's settings: unknown keys are reported and ignored (the space refused them
        already), a bad value is a :class:`TrainerError`."""
        known = {f.name for f in fields(cls)}
        options = {k: v for k, v in spec.trainer.items() if k not in ("kind", "timeout")}
        unknown = sorted(set(options) - known)
        if unknown:
            print(
                f"parsearch.trainers.builtin: ignoring unknown trainer settings {unknown}; "
                f"known: {sorted(known)}",
                file=sys.stderr,
            )
        return cls.from_section(options, lambda field, message: TrainerError(f"{field} {message}"))

    def memory_cap(self, spec: TrialSpec) -> int | None:
        """The peak above which a trial is out of memory, if any."""
        if self.memory_cap_bytes is not None:
            return int(self.memory_cap_bytes)
        if spec.memory_cap_bytes is not None:  # the space's memory_cap
            return int(spec.memory_cap_bytes)
        return spec.allocation.device_memory_bytes if self.enforce_memory_cap else None


def validate_section(section: Mapping[str, Any], fail: Failure) -> dict[str, Any]:
    """The space's built-in ``trainer`` section with its numbers normalised (the plain dict
    a :class:`TrialSpec` carries to the ranks)."""
    for key in section:
        if key not in SECTION_KEYS:
            close = difflib.get_close_matches(str(key), list(SECTION_KEYS), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            valid = ", ".join(sorted(SECTION_KEYS))
            raise fail(f"trainer.{key}", f"unknown key{hint}; valid keys here: {valid}")
    settings = TrainerSettings.from_section(section, fail)
    data = {**section, "kind": "builtin"}
    if "timeout" in data:
        if not _positive_number(data["timeout"]):
            raise fail(
                "trainer.timeout", f"must be a positive finite number, got {data['timeout']!r}"
            )
        data["timeout"] = float(data["timeout"])
    data.update({key: getattr(settings, key) for key in ("lr", "weight_decay") if key in data})
    return data
