"""Trainer kinds a space names by ``trainer.kind``, in one registry (:data:`TRAINER_KINDS`):
the built-in trainer (:mod:`.builtin`) and the command trainer (:mod:`.command`), each
implementing :class:`~parsearch.trainers.base.TrainerKind`. The space validates a trainer
section with its kind; what a trial runs (these and the machine probe) is dispatched by
:mod:`parsearch.trial_kinds`.
Importing this package starts nothing and imports no torch.
"""

from __future__ import annotations

from parsearch.trainers.base import TrainerKind
from parsearch.trainers.builtin.kind import BuiltinKind
from parsearch.trainers.command.kind import CommandKind

TRAINER_KINDS: dict[str, TrainerKind] = {kind.name: kind for kind in (BuiltinKind(), CommandKind())}

__all__ = ["TRAINER_KINDS"]
