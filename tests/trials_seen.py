"""What a test saw of its trials, for the message of a failing assertion: one line a trial
with its number, layout, state, hosts and error (or the tail of its log).

``trials_seen(trials)`` formats what a test holds (store records, ``status``/``serve`` JSON
rows, a scaling study's points); ``stores_seen(paths)`` reads every SQLite store under the
given paths, which the tiers' conftest hook attaches to every failing test's report, so an
assertion written without a message still says which trial ended how and why."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

# An error a line: enough to tell an OOM from a timeout from a crash, short enough to read.
ERROR_CHARS = 400
MAX_STORES = 8
MAX_TRIALS = 200


def _layout(trial: Any) -> str | None:
    if isinstance(trial, Mapping):
        layout = trial.get("layout", trial.get("config"))
        if isinstance(layout, Mapping):
            return " ".join(f"{k}{v}" for k, v in layout.items())
        return None if layout is None else str(layout)
    if not hasattr(type(trial), "layout") and not hasattr(trial, "config"):
        return None  # a trial's result (TrialResult): no layout of its own
    try:
        return trial.layout.short()
    except Exception as error:  # a damaged record still gets its line
        return f"<layout unreadable: {error}>"


def _field(trial: Any, name: str) -> Any:
    return trial.get(name) if isinstance(trial, Mapping) else getattr(trial, name, None)


def _one_line(text: Any) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 3] + "..."


def trial_line(trial: Any) -> str:
    """``#3 tp2 pp1 dp2 mbs4 gas2 state=error hosts=[n1] error=...``; a trial's result
    (``status``, no number or layout) gets what it has."""
    number = _field(trial, "number")
    if number is None:
        number = _field(trial, "trial")
    state = _field(trial, "state")
    if state is None:
        state = _field(trial, "status")
    state = getattr(state, "value", state)
    parts = [] if number is None else [f"#{number}"]
    layout = _layout(trial)
    if layout is not None:
        parts.append(layout)
    parts.append(f"state={state}")
    hosts = _field(trial, "hosts")
    if hosts:
        parts.append(f"hosts={list(hosts)}")
    error = _field(trial, "error")
    if error:
        parts.append(f"error={_one_line(error)}")
    elif state not in ("ok", "queued", "running", None):
        tail = _field(trial, "log_tail")
        if tail:
            parts.append(f"log_tail={_one_line(str(tail)[-ERROR_CHARS:])}")
    return " ".join(parts)


def trials_seen(trials: Iterable[Any]) -> str:
    """Every trial of ``trials`` as a line (an empty list says so)."""
    lines = [trial_line(t) for t in trials]
    return "\n".join(lines) if lines else "(no trials)"


def stores_seen(paths: Iterable[Path]) -> str:
    """The trials of every campaign of every SQLite store (``*.db``) under ``paths``, read
    read-only; a store that cannot be read says why instead."""
    from parsearch.store import open_store

    stores: list[Path] = []
    for path in paths:
        if path.is_file() and path.suffix == ".db":
            stores.append(path)
        elif path.is_dir():
            stores.extend(sorted(path.rglob("*.db")))
    sections = []
    for store in stores[:MAX_STORES]:
        try:
            with open_store(store, readonly=True) as db:
                for campaign in db.list_campaigns():
                    trials = db.trials(campaign.id)
                    head = f"{store}: campaign {campaign.name!r} ({campaign.status.value})"
                    sections.append(f"{head}\n{trials_seen(trials[:MAX_TRIALS])}")
        except Exception as error:  # the report must never hide the test's own failure
            sections.append(f"{store}: not readable ({type(error).__name__}: {error})")
    return "\n\n".join(sections)
