"""The error a failed rank recorded itself, read from torch's elastic *error files*.

A program started by a launcher (``torchrun``, ``deepspeed``) fails, to the node agent, as the
launcher's exit code, and its log ends with the launcher's ``ChildFailedError``. The rank's
own reason is in torch's error files, which parsearch has every rank write
(:mod:`parsearch.launch.rank_site`, as torch's ``@record`` would):

* each process the agent starts gets ``TORCHELASTIC_ERROR_FILE=<trial>/errors/rank<N>.json``
  (N: its rank; with a launcher, the node's rank, where torchrun copies its first failed
  worker's file and the ``deepspeed`` launcher's workers write the first failure);
* torchrun gets ``PET_LOG_DIR=<trial>/torchrun/node<N>`` (torchrun reads ``PET_*`` variables
  as its options), so each of its workers writes ``<run>/attempt_<k>/<local_rank>/error.json``
  there, read here directly: it names the worker's rank.

The first file written (by modification time) is the first failure; a launcher's own
``ChildFailedError`` only counts when no worker recorded anything.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ERROR_FILE_VAR = "TORCHELASTIC_ERROR_FILE"
TORCHRUN_LOG_DIR_VAR = "PET_LOG_DIR"
ERRORS_DIR = "errors"
TORCHRUN_DIR = "torchrun"
LAUNCHER_ERRORS = ("ChildFailedError",)
MESSAGE_CHARS = 500


@dataclass(frozen=True)
class RankError:
    """One error file: the failed rank (``None`` when unknown), its message and stack."""

    rank: int | None
    message: str
    callstack: str
    written_ns: int

    @property
    def from_launcher(self) -> bool:
        return self.message.split(":", 1)[0].strip().endswith(LAUNCHER_ERRORS)

    def describe(self, with_rank: bool = True) -> str:
        """``rank 1: RuntimeError: boom``; a message longer than :data:`MESSAGE_CHARS`
        keeps its head and its tail, the middle cut."""
        text = shortened(" ".join(self.message.split()), MESSAGE_CHARS)
        return text if self.rank is None or not with_rank else f"rank {self.rank}: {text}"


def shortened(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters: two thirds from its head (an exception's type
    and what it says first: "Tried to allocate 2.00 GiB") and the rest from its tail, joined by
    `` … ``. The tail matters when a message carries another process's traceback
    (``ProcessRaisedException: -- Process 1 terminated with the following error: Traceback
    ...``, a ``RemoteTraceback``): it ends with the error that caused it."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    return f"{text[:head]} … {text[len(text) - (limit - head - 3) :]}"


def error_file(trial_dir: Path, rank: int) -> Path:
    """Where the process of ``rank`` (a launcher: of its node) writes its error."""
    return trial_dir / ERRORS_DIR / f"rank{rank}.json"


def torchrun_log_dir(trial_dir: Path, node_rank: int) -> Path:
    """torchrun's ``--log-dir`` for one node of a trial."""
    return trial_dir / TORCHRUN_DIR / f"node{node_rank}"


def read_error(path: Path, rank: int | None = None) -> RankError | None:
    """One error file in torch's format (``None`` if absent or unreadable). A rank recorded
    in the file (``extraInfo.rank``, written by parsearch's hook) wins over ``rank``."""
    try:
        data = json.loads(path.read_text(errors="replace"))
        written = path.stat().st_mtime_ns
    except (OSError, ValueError):
        return None
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, str):  # torch allows a plain string
        return RankError(rank, message, "", written)
    if not isinstance(message, dict):
        return None
    info = message.get("extraInfo") if isinstance(message.get("extraInfo"), dict) else {}
    recorded = str(info.get("rank", "")).strip()
    if recorded.isdigit():
        rank = int(recorded)
    return RankError(
        rank, str(message.get("message", "")), str(info.get("py_callstack", "")), written
    )


def node_files(trial_dir: Path, ranks: Iterable[int], node_rank: int) -> list[Path]:
    """Every error file or folder one node's processes may write (removed before they
    start, so a retry in the same trial directory never reads an earlier attempt's)."""
    files = [error_file(trial_dir, rank) for rank in ranks]
    return [*files, torchrun_log_dir(trial_dir, node_rank)]


def first_error(
    trial_dir: Path, ranks: Iterable[int], launcher: tuple[int, int] | None = None
) -> RankError | None:
    """The first error recorded on one node: by the processes of ``ranks`` (the agent's
    processes, by rank; one per node when they are launchers), or, when ``launcher`` is
    ``(node_rank, rank of the node's first worker)``, by torchrun's workers."""
    found: list[RankError] = []
    for rank in ranks:
        own = read_error(error_file(trial_dir, rank), None if launcher else rank)
        if own is not None:
            found.append(own)
    if launcher is not None:
        node, first = launcher
        for path in sorted(torchrun_log_dir(trial_dir, node).glob("*/attempt_*/*/error.json")):
            local = path.parent.name
            worker = first + int(local) if local.isdigit() else None
            if (error := read_error(path, worker)) is not None:
                found.append(error)
    if not found:
        return None
    own_errors = [error for error in found if not error.from_launcher] or found
    return min(own_errors, key=lambda error: error.written_ns)
