"""Log parsers of the command trainer, chosen by the space's ``trainer.parser``.

Each reads a log line by line into a :class:`~parsearch.trainers.command.parsers.base.LogScan`;
:func:`make_parser` builds a fresh one per log (the regex parser counts its matches).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from parsearch.trainers.command.parsers.base import LineParser, LogScan, Step, strip_ansi
from parsearch.trainers.command.parsers.jsonl import JsonParser
from parsearch.trainers.command.parsers.megatron import MegatronParser
from parsearch.trainers.command.parsers.regex import RegexParser
from parsearch.trainers.command.parsers.torchtitan import TorchtitanParser

PARSERS: tuple[str, ...] = ("json", "megatron", "megatron-deepspeed", "torchtitan", "regex")


def make_parser(
    name: str,
    patterns: Mapping[str, str] | None = None,
    scale: Mapping[str, float] | None = None,
) -> LineParser:
    """A new parser for one log. ``patterns``/``scale`` are the regex parser's settings."""
    if name == "json":
        return JsonParser()
    if name == "megatron":
        return MegatronParser()
    if name == "megatron-deepspeed":
        return MegatronParser(deepspeed=True)
    if name == "torchtitan":
        return TorchtitanParser()
    if name == "regex":
        return RegexParser(patterns or {}, scale)
    raise ValueError(f"unknown parser {name!r}; valid: {', '.join(PARSERS)}")


def parse_lines(lines: Iterable[str], parser: LineParser) -> LogScan:
    """Run ``parser`` over ``lines`` (ANSI colour codes removed first)."""
    scan = LogScan()
    for line in lines:
        parser.feed(strip_ansi(line), scan)
    return scan


__all__ = ["PARSERS", "LineParser", "LogScan", "Step", "make_parser", "parse_lines"]
