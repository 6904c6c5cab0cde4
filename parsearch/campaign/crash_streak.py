"""Stop spending the budget on a trainer that cannot run at all.

A wrong path in a command template, a missing module or a typo in a flag makes every trial
crash with the same error, whatever its layout: a campaign would spend its whole budget (and
its node-hours) proving it. :class:`CrashStreak` watches the trials as they finish; once
``limit`` crashes in a row read alike (:func:`~parsearch.failures.reason_key`) and no trial has
succeeded, the driver stops starting trials and says why. A layout-specific crash is not
stopped for: any trial that ran (``ok``), or ran out of memory or time, proves the trainer
works and ends the watch. A ``resume`` starts a fresh streak, so a fixed trainer gets its
trials.
"""

from __future__ import annotations

from parsearch.failures import describe_trials, failure_reason, reason_key
from parsearch.result import TrialState
from parsearch.store import TrialRecord

DEFAULT_CRASH_LIMIT = 4


class CrashStreak:
    """Consecutive alike crashes (``error`` trials) before any trial has run."""

    def __init__(self, limit: int = DEFAULT_CRASH_LIMIT):
        if limit < 0:
            raise ValueError(f"the crash limit must be >= 0 (0: never stop), got {limit}")
        self.limit = limit
        self._trainer_works = False
        self._key: str | None = None
        self._reason = ""
        self._trials: list[int] = []

    def add(self, record: TrialRecord) -> None:
        """Count a finished trial (in the order the driver records them)."""
        if self._trainer_works or not record.state.finished:
            return
        if record.state is not TrialState.ERROR:
            # It ran far enough to succeed or to meet a limit of its layout (memory, time);
            # an infeasible layout was refused before it started and says nothing.
            self._trainer_works = record.state is not TrialState.INFEASIBLE
            return
        reason = failure_reason(record.error, record.log_tail)
        key = reason_key(reason)
        if key != self._key:
            self._key, self._reason, self._trials = key, reason, []
        self._trials.append(record.number)

    @property
    def verdict(self) -> str | None:
        """Why the campaign should stop starting trials, or None while it should go on."""
        if self.limit == 0 or self._trainer_works or len(self._trials) < self.limit:
            return None
        trials = describe_trials(tuple(self._trials))
        return (
            f"{len(self._trials)} trials in a row ({trials}) crashed the same way and none has "
            f"run: {self._reason}. Fix the trainer (`parsearch show` gives a trial's log) "
            "and continue with `parsearch resume`; --crash-limit 0 never stops for this"
        )
