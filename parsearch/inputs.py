"""Bounds on the values people type: campaign names, counts and durations.

Every value here ends somewhere that breaks on nonsense: a budget in an SQLite integer (64
bits), a seed in numpy's generator (32 bits), seconds in ``threading`` waits (finite), a name
in file names, terminal output and job scripts. Each check returns the value or raises a
:class:`ValueError` whose message says what would be valid; :func:`option` turns one into an
``argparse`` type, so the command line refuses it with exit 2 before anything starts.
"""

from __future__ import annotations

import argparse
import unicodedata
from collections.abc import Callable
from typing import TypeVar

MAX_BUDGET = 1_000_000
MAX_SEED = 2**32 - 1
MAX_SLOTS = 100_000
MAX_SECONDS = 365 * 86400.0
MAX_NAME_LENGTH = 100

T = TypeVar("T")


def _integer(text: str, what: str, low: int, high: int) -> int:
    text = text.strip()
    if not text.lstrip("+-").isdigit() or len(text) > 40:
        raise ValueError(f"expected {what}, an integer in [{low}, {high}], got {text[:50]!r}")
    value = int(text)
    if not low <= value <= high:
        raise ValueError(f"expected {what}, an integer in [{low}, {high}], got {value}")
    return value


def budget(text: str) -> int:
    return _integer(text, "a number of trials", 1, MAX_BUDGET)


def seed(text: str) -> int:
    return _integer(text, "a random seed", 0, MAX_SEED)


def slots(text: str) -> int:
    return _integer(text, "a number of trials at once", 1, MAX_SLOTS)


def crash_limit(text: str) -> int:
    return _integer(text, "a number of trials (0: never stop)", 0, MAX_BUDGET)


def seconds(value: float | str, *, allow_zero: bool = False) -> float:
    """A finite duration in (0, a year], or [0, a year] with ``allow_zero``."""
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"expected a number of seconds, got {value!r}") from None
    low_ok = number >= 0 if allow_zero else number > 0
    if not (low_ok and number <= MAX_SECONDS):  # False for NaN
        bound = "[0" if allow_zero else "(0"
        raise ValueError(f"expected seconds in {bound}, {MAX_SECONDS:g}], got {value!r}")
    return number


def grace_seconds(text: str) -> float:
    return seconds(text, allow_zero=True)


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a campaign, or ``None``.

    A name becomes part of directory names, log lines and the commands parsearch prints for
    the user to copy, so it must be printable on one line, free of path separators, and read
    the same on every terminal (no bidirectional-override or other format characters).
    """
    if not name.strip():
        return "it is empty"
    if len(name) > MAX_NAME_LENGTH:
        return f"it has {len(name)} characters, more than {MAX_NAME_LENGTH}"
    for char in name:
        if not char.isprintable() or unicodedata.category(char) in ("Cf", "Zl", "Zp"):
            return f"it holds the non-printable character U+{ord(char):04X}"
        if char in "/\\":
            return f"it holds the path separator {char!r}"
    if name.startswith(".") or name != name.strip():
        return "it starts with a dot or starts or ends with a space"
    return None


def campaign_name(text: str) -> str:
    problem = name_problem(text)
    if problem:
        raise ValueError(
            f"campaign name {text[:60]!r} is refused: {problem}; use letters, digits, spaces "
            "and punctuation other than / and \\, not starting with a dot, at most "
            f"{MAX_NAME_LENGTH} characters"
        )
    return text


def option(check: Callable[[str], T]) -> Callable[[str], T]:
    """``check`` as an argparse ``type``: its message becomes the usage error (exit 2)."""

    def parse(text: str) -> T:
        try:
            return check(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    parse.__name__ = check.__name__  # argparse names the type in some messages
    return parse
