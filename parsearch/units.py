"""Parse and print sizes and rates the way people write them in YAML (``64GiB``, ``25GB/s``)."""

from __future__ import annotations

import re

_BINARY = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_DECIMAL = {"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: object) -> int:
    """``64GiB`` → 68719476736; a bare number is bytes. Raises ValueError with the valid forms."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size such as 64GiB or 80GB, got {value!r}")
    if isinstance(value, int | float):
        if value <= 0:
            raise ValueError(f"a size must be > 0, got {value!r}")
        return int(value)
    match = _PATTERN.match(str(value))
    unit = match.group(2).lower() if match else None
    if not match or (unit not in _BINARY and unit not in _DECIMAL):
        raise ValueError(
            f"expected a size such as 64GiB, 80GB or 512MiB (units B, KiB, MiB, GiB, TiB, "
            f"KB, MB, GB, TB), got {value!r}"
        )
    number = float(match.group(1))
    if number <= 0:
        raise ValueError(f"a size must be > 0, got {value!r}")
    return int(number * (_BINARY.get(unit) or _DECIMAL[unit]))


def parse_rate(value: object) -> float:
    """``25GB/s`` → 2.5e10 bytes per second; a bare number is bytes per second."""
    if isinstance(value, str) and value.strip().lower().endswith("/s"):
        value = value.strip()[:-2]
    try:
        return float(parse_bytes(value))
    except ValueError:
        raise ValueError(f"expected a bandwidth such as 25GB/s or 100GB/s, got {value!r}") from None


def exact_size(value: int) -> str:
    """The largest binary unit that divides ``value`` exactly: ``40MiB``, ``1536KiB``,
    ``1000B`` (what ``{memory_cap}`` passes to a program; :func:`parse_bytes` reads it back)."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value % size == 0:
            return f"{value // size}{unit}"
    return f"{value}B"


def count_of(count: int, noun: str) -> str:
    """``1 node``, ``2 nodes``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def format_bytes(value: float) -> str:
    """Binary units with three significant figures: ``61.2 GiB``."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.0f} B"
