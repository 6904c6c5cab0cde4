"""Parse and print sizes and rates the way people write them in YAML (``64GiB``, ``25GB/s``)."""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "B": 1,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
    "kB": 10**3,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
}
_BY_LOWER = {unit.lower(): unit for unit in _UNITS}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")
# 57-bit addresses (5-level paging) bound what any device or host can address.
MAX_BYTES = 2**57
_FORMS = (
    "64GiB, 80GB or 512 MiB (units B, KiB, MiB, GiB, TiB: powers of 1024; KB, MB, GB, TB: "
    "powers of 1000)"
)


def _checked(number: float, value: object) -> int:
    if not 0 < number <= MAX_BYTES:  # False for NaN
        raise ValueError(f"a size must be > 0 and at most 2^57 bytes (128 PiB), got {value!r}")
    return int(number)


def parse_bytes(value: object) -> int:
    """``64GiB`` → 68719476736; a bare number is bytes. Raises ValueError with the valid forms.

    Units are case-sensitive, the same everywhere: ``GiB`` is 2^30 bytes and ``GB`` 10^9,
    so ``64gib`` or ``64gb``, which could mean either, is refused with both readings. A space
    between the number and the unit is allowed.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a size such as {_FORMS}, got {value!r}")
    if isinstance(value, int | float):
        return _checked(float(value), value)
    match = _PATTERN.match(str(value)[:100])
    if not match:
        raise ValueError(f"expected a size such as {_FORMS}, got {value!r}")
    number, unit = float(match.group(1)), match.group(2)
    if unit not in _UNITS:
        lower = unit.lower()
        if lower not in _BY_LOWER:
            raise ValueError(f"unknown unit {unit!r} in {value!r}; expected a size like {_FORMS}")
        if lower == "b":
            raise ValueError(f"write bytes as B (b reads as bits), got {value!r}")
        binary, decimal = f"{lower[0].upper()}iB", f"{lower[0].upper()}B"
        raise ValueError(
            f"unit {unit!r} in {value!r} is ambiguous: write {binary} for powers of 1024 "
            f"({_UNITS[binary]} bytes) or {decimal} for powers of 1000 ({_UNITS[decimal]} bytes)"
        )
    return _checked(number * _UNITS[unit], value)


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
    """Binary units with three significant figures: ``61.2 GiB``, ``1000 MiB`` (never in
    exponent form: ``:.3g`` alone prints 1000 as ``1e+03``)."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= size:
            return f"{_three_figures(value / size)} {unit}"
    return f"{value:.0f} B"


def _three_figures(number: float) -> str:
    text = f"{number:.3g}"
    return f"{number:.0f}" if "e" in text else text
