"""Why trials failed, grouped: what ``parsearch status`` and the report's failures section
show, so a user sees "3 trials: ValueError: ..." instead of "error 3".

A trial's stored ``error`` often only says how a rank ended ("rank 0 exited with code 1");
the cause is the rank's own last line of failure in its log tail, so :func:`failure_reason`
appends that line. Trials whose reasons differ only in numbers (a rank, a size, a port) form
one group, shown with its first trial's reason.

What counts as the rank's own line was read off real GPU output (tests/fixtures/logs): an
exception line (``torch.OutOfMemoryError: ...``, also after a prefix such as pytest's
``FAILED ... - torch.distributed.DistBackendError: ...``), or, where a rank died without
one, NCCL's watchdog timeout, a fatal signal (``Signal 11 (SIGSEGV) received by PID``,
``Fatal Python error: Segmentation fault``, torchrun's ``failed (exitcode: -11)``) or the
driver's ``fallen off the bus`` / ``Xid``, ROCm's ``Memory access fault by GPU node-N ...``
(a GPU page fault, followed only by ``Aborted``) or c10d's ``recvValue failed on SocketImpl(...):
Connection reset by peer`` (the TCPStore's host went away). NCCL's generic text for its error
code (``ncclSystemError: System call ...``) is not the cause either: the ``NCCL error in: ...``
line above it is, with the ``Last error:`` detail below it (``socketStartConnect: Connect to
... failed : No route to host``). Lines that only follow a failure are not causes:
C++ ``Exception raised from ...`` stack headers, the watchdog's ``Exception (either an error
or timeout) detected``, and torchrun's own ``ChildFailedError`` (used only when nothing else
is there).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from parsearch.launch.oom import first_oom_line
from parsearch.launch.rank_errors import LAUNCHER_ERRORS, shortened
from parsearch.result import TrialState
from parsearch.sanitize import shown, shown_line
from parsearch.store import TrialRecord

FAILURE_STATES = (TrialState.OOM, TrialState.ERROR, TrialState.TIMEOUT, TrialState.INFEASIBLE)
# "ValueError: ...", "torch.OutOfMemoryError: ...", "KeyboardInterrupt", with a launcher's
# prefix; a qualified name ("torch.distributed.DistBackendError: ...") after any text. The
# name is followed by ": " or ends the line, so "Exception (either ..." and "Exception raised
# from ..." (what follows a failure, not its cause) are not exception lines.
_EXCEPTION = re.compile(
    r"(?:(?:^|\]:?\s*)((?:[\w.]+\.)?\w*(?:Error|Exception|Interrupt))"
    r"|\s((?:[A-Za-z_]\w*\.)+\w*(?:Error|Exception)))(:\s.*|:?)$"
)
# A rank that died without an exception line says so in one of these.
_FATAL = re.compile(
    r"(?:\[Rank \d+\] )?Watchdog caught collective operation timeout: .*"
    r"|Signal \d+ \(SIG\w+\) received by PID \d+"
    r"|Fatal Python error: .*"
    r"|failed \(exitcode: -\d+\) local_rank: \d+.*"
    r"|NVRM: Xid .*|NVRM: fallen off the bus.*"
    r"|Memory access fault by GPU node-\d+ .*"
    r"|recv\w* failed on SocketImpl\(.*"
)
# NCCL's fixed text for an error code (ncclSystemError, ncclInternalError, ...), printed on
# the line after the exception's; its "Last error:" line is followed by what went wrong.
_NCCL_CODE = re.compile(r"nccl\w+Error")
_NCCL_DETAIL = "Last error:"
_NCCL_DETAIL_LINES = 4
# Addresses and handles (0x55e92f082620) differ between trials that failed alike.
_HEX = re.compile(r"0x[0-9a-fA-F]+")
# An error that ends by saying how a process ended (no recorded error after it).
_EXIT_ONLY = re.compile(
    r"(exited with code -?\d+|was killed by [^:]*|did not exit|ran out of memory)$"
)
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
REASON_CHARS = 300


@dataclass(frozen=True)
class FailureGroup:
    """Failed trials of one state whose reasons read alike."""

    state: TrialState
    reason: str
    trials: tuple[int, ...]


def last_exception(log_tail: str) -> str | None:
    """The rank's own last line of failure in a log tail (see the module's docstring), if
    any: an exception line, else a fatal line; a launcher's ``ChildFailedError`` only when
    the tail has nothing else."""
    launcher = None
    lines = log_tail.splitlines()
    for index in range(len(lines) - 1, -1, -1):
        text = lines[index].strip()
        match = _EXCEPTION.search(text)
        if match:
            name = match.group(1) or match.group(2)
            if _NCCL_CODE.fullmatch(name):
                continue
            found = (name + match.group(3)).strip()
            if not name.endswith(LAUNCHER_ERRORS):
                return _with_nccl_detail(found, lines[index + 1 : index + _NCCL_DETAIL_LINES])
            launcher = launcher or found
            continue
        fatal = _FATAL.search(text)
        if fatal:
            return fatal.group(0).strip()
    return launcher


def _with_nccl_detail(found: str, following: list[str]) -> str:
    """An NCCL error line with the detail NCCL printed after ``Last error:``, if any."""
    if "NCCL error" not in found:
        return found
    for index, line in enumerate(following[:-1]):
        if line.strip() == _NCCL_DETAIL and following[index + 1].strip():
            return f"{found}: {following[index + 1].strip()}"
    return found


def failure_reason(error: str | None, log_tail: str) -> str:
    """The stored error, with the log's last exception when the error only says how a
    process ended; on one line, made safe to show (:mod:`parsearch.sanitize`), cut to
    ``REASON_CHARS`` in the middle (the end of a long message says what went wrong)."""
    reason = error or "no reason recorded"
    if error is None or _EXIT_ONLY.search(error):
        cause = _cause(error, shown(log_tail))  # a colour code must not hide it
        if cause and cause not in reason:
            reason = f"{reason}: {cause}" if error else cause
    reason = shown_line(reason)  # a trainer's text: no escape sequence reaches a terminal
    return shortened(reason, REASON_CHARS)


def _cause(error: str | None, log_tail: str) -> str | None:
    """The line that says why: for "ran out of memory" (the node agent's OOM, which names
    no line) the first out-of-memory line, else the rank's own last line of failure, or an
    out-of-memory line that no exception line carries (``RuntimeError('CUDA out of
    memory ...')`` inside a trainer's own message, two ranks' lines joined mid-word)."""
    lines = log_tail.splitlines()
    if error is not None and error.endswith("ran out of memory"):
        return first_oom_line(lines) or last_exception(log_tail)
    return last_exception(log_tail) or first_oom_line(lines)


def reason_key(reason: str) -> str:
    """What two failures must share to read alike: the reason with its numbers (a rank, a
    size, a port, an address) left out."""
    return _NUMBER.sub("#", _HEX.sub("#", reason))


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
