"""Why trials failed, grouped: what ``parsearch status`` and the report's failures section
show, so a user sees "3 trials: ValueError: ..." instead of "error 3".

A trial's stored ``error`` often only says how a rank ended ("rank 0 exited with code 1");
the cause is the exception at the end of its log tail, so :func:`failure_reason` appends
that line. Trials whose reasons differ only in numbers (a rank, a size, a port) form one
group, shown with its first trial's reason.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from parsearch.result import TrialState
from parsearch.sanitize import shown, shown_line
from parsearch.store import TrialRecord

FAILURE_STATES = (TrialState.OOM, TrialState.ERROR, TrialState.TIMEOUT, TrialState.INFEASIBLE)
# "ValueError: ...", "torch.OutOfMemoryError: ...", "RuntimeError", with a launcher's prefix.
_EXCEPTION = re.compile(r"(?:^|\]:?\s*)((?:[\w.]+\.)?\w*(?:Error|Exception|Interrupt)\b.*)$")
# An error that ends by saying how a process ended (no recorded error after it).
_EXIT_ONLY = re.compile(r"(exited with code -?\d+|was killed by [^:]*|did not exit)$")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
REASON_CHARS = 300


@dataclass(frozen=True)
class FailureGroup:
    """Failed trials of one state whose reasons read alike."""

    state: TrialState
    reason: str
    trials: tuple[int, ...]


def last_exception(log_tail: str) -> str | None:
    """The last ``SomethingError: message`` line of a log tail, if any."""
    for line in reversed(log_tail.splitlines()):
        match = _EXCEPTION.search(line.strip())
        if match:
            return match.group(1).strip()
    return None


def failure_reason(error: str | None, log_tail: str) -> str:
    """The stored error, with the log's last exception when the error only says how a
    process ended; on one line, made safe to show (:mod:`parsearch.sanitize`), cut to
    ``REASON_CHARS``."""
    reason = error or "no reason recorded"
    if error is None or _EXIT_ONLY.search(error):
        exception = last_exception(shown(log_tail))  # a colour code must not hide it
        if exception and exception not in reason:
            reason = f"{reason}: {exception}" if error else exception
    reason = shown_line(reason)  # a trainer's text: no escape sequence reaches a terminal
    return reason if len(reason) <= REASON_CHARS else reason[: REASON_CHARS - 1] + "…"


def reason_key(reason: str) -> str:
    """What two failures must share to read alike: the reason with its numbers (a rank, a
    size, a port) left out."""
    return _NUMBER.sub("#", reason)


def group_failures(records: Iterable[TrialRecord]) -> list[FailureGroup]:
    """The failed trials of ``records`` by state and reason, largest group first."""
    groups: dict[tuple[TrialState, str], list[tuple[int, str]]] = {}
    for record in records:
        if record.state not in FAILURE_STATES:
            continue
        reason = failure_reason(record.error, record.log_tail)
        key = (record.state, reason_key(reason))
        groups.setdefault(key, []).append((record.number, reason))
    found = [
        FailureGroup(state, members[0][1], tuple(number for number, _ in members))
        for (state, _), members in groups.items()
    ]
    return sorted(found, key=lambda group: (-len(group.trials), group.trials[0]))


def describe_trials(numbers: tuple[int, ...], shown: int = 6) -> str:
    """``#1, #4, #7`` (and ``+N more``)."""
    text = ", ".join(f"#{number}" for number in numbers[:shown])
    return text + (f" +{len(numbers) - shown} more" if len(numbers) > shown else "")
