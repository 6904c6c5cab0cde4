"""Who else hears of each finished trial: the driver's observer interface.

The driver records a trial in the store first, then tells each observer (an experiment
tracker such as MLflow, a notifier). An observer that fails cannot cost the campaign
anything: the trial is already stored, so the failure is reported once on stderr and the
search goes on. Observers never see the optimiser, the backend or the store's writer.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Protocol, TextIO

from parsearch.store import Campaign, TrialRecord


class TrialObserver(Protocol):
    """Told of every trial that finishes (ok or failed) in a session, in finish order."""

    name: str

    def trial_finished(self, campaign: Campaign, record: TrialRecord) -> None: ...

    def close(self) -> None: ...


class Observers:
    """The session's observers, each told in turn; failures become one warning each."""

    def __init__(self, observers: Sequence[TrialObserver] = (), stream: TextIO | None = None):
        self.observers = list(observers)
        self.stream = stream
        self.failures: dict[str, int] = {}

    def trial_finished(self, campaign: Campaign, record: TrialRecord) -> None:
        for observer in self.observers:
            try:
                observer.trial_finished(campaign, record)
            except Exception as error:  # the trial is stored; keep searching
                self._warn(observer.name, f"trial #{record.number}: {error}")

    def close(self) -> None:
        for observer in self.observers:
            try:
                observer.close()
            except Exception as error:
                self._warn(observer.name, f"closing: {error}")

    def _warn(self, name: str, text: str) -> None:
        seen = self.failures.get(name, 0)
        self.failures[name] = seen + 1
        if not seen:  # a tracker that is down would otherwise print once per trial
            print(
                f"warning: {name} could not record {text} (the store has it; further "
                f"{name} failures are counted silently)",
                file=self.stream or sys.stderr,
                flush=True,
            )
