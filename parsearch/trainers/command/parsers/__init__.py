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
# The line each format reads its timings from, named in the error of a log without one: a
# log of another format (a DeepSpeed flops profile, Hugging Face's loss dicts) then says
# which line was looked for instead of only that none was found.
_ITERATION_LINE = "Megatron's 'iteration N/ M | ... | elapsed time per iteration (ms): T |' line"
EXPECTED_LINES: dict[str, str] = {
    "json": "a JSON object line with a number for 'tokens_per_s'",
    "megatron": _ITERATION_LINE,
    "megatron-deepspeed": _ITERATION_LINE,
    "torchtitan": "torchtitan's 'step: N  loss: ...  tps: T' line",
    "regex": "a line that one of the space's timing patterns matches",
}


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


def no_metric_lines(name: str, logs: str) -> str:
    """Why ``logs`` gave no metrics to parser ``name``, naming the line it expected."""
    return f"no {name} metric lines in {logs}: expected {EXPECTED_LINES[name]}"


def parse_lines(lines: Iterable[str], parser: LineParser) -> LogScan:
    """Run ``parser`` over ``lines`` (ANSI colour codes removed first)."""
    scan = LogScan()
    for line in lines:
        parser.feed(strip_ansi(line), scan)
    return scan


__all__ = [
    "EXPECTED_LINES",
    "PARSERS",
    "LineParser",
    "LogScan",
    "Step",
    "make_parser",
    "no_metric_lines",
    "parse_lines",
]
