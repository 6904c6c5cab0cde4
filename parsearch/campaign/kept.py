"""Finished results a driver could not write to its store, kept in a file until ``resume``.

A driver that gives up on an unreachable store (:mod:`parsearch.campaign.outage`) still
holds results of trials that ran to the end: losing them would run those layouts again. It
appends each, one JSON object a line, to ``parsearch-unwritten-<campaign>.jsonl`` in the
campaign's launch directory, which the store itself records (``resume`` finds it from any
working directory) and which lies on another filesystem than the store more often than
not. The next session of the campaign records every line that names its store, its
campaign and a trial the store still holds unfinished, before it re-queues anything, and
removes the lines it has dealt with; a line for a trial the store has meanwhile finished (a
write whose commit reached the server but whose answer did not) is dropped, not recorded
twice.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from parsearch.result import TrialResult, TrialState
from parsearch.store import Campaign, Store, TrialRecord


@dataclass(frozen=True)
class KeptResult:
    """A trial's result that its store has not recorded yet."""

    record: TrialRecord
    result: TrialResult
    objective: float | None


def kept_path(campaign: Campaign) -> Path:
    """Where ``campaign``'s unwritten results are kept."""
    folder = campaign.settings.get("launch_dir") or os.getcwd()
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", campaign.name)
    return Path(folder) / f"parsearch-unwritten-{slug}.jsonl"


def keep(store: Store, campaign: Campaign, results: list[KeptResult]) -> Path:
    """Append ``results`` to the campaign's file (fsynced: the store is no safer now)."""
    path = kept_path(campaign)
    lines = [
        json.dumps(
            {
                "store": str(store.path),
                "campaign": campaign.name,
                "trial_id": kept.record.id,
                "number": kept.record.number,
                "key": kept.record.key,
                "result": kept.result.to_dict(),
                "objective": kept.objective,
                "kept_at": time.time(),
            }
        )
        for kept in results
    ]
    with open(path, "a", encoding="utf-8") as file:
        file.write("".join(f"{line}\n" for line in lines))
        file.flush()
        os.fsync(file.fileno())
    return path


def record_kept(store: Store, campaign: Campaign) -> tuple[int, Path | None]:
    """Record the results an earlier session of ``campaign`` kept; (how many, the file).

    Lines of other stores or campaigns stay in the file; it is removed once empty.
    """
    path = kept_path(campaign)
    if not path.is_file():
        return 0, None
    others, recorded = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            others.append(line)  # cut short (a full disk): left for a person to look at
            continue
        if item.get("store") != str(store.path) or item.get("campaign") != campaign.name:
            others.append(line)
            continue
        trial = store.get_trial(int(item["trial_id"]))
        if trial.campaign_id != campaign.id or (trial.number, trial.key) != (
            item["number"],
            item["key"],
        ):
            others.append(line)  # not this campaign's trial: leave it for a person to look at
            continue
        if trial.state.finished:
            continue  # recorded after all (its answer was lost, not its commit)
        if trial.state is TrialState.INTERRUPTED:
            store.requeue(trial.id)
        store.finish_trial(trial.id, TrialResult.from_dict(item["result"]), item["objective"])
        recorded += 1
    if others:
        path.write_text("".join(f"{line}\n" for line in others), encoding="utf-8")
    else:
        path.unlink()
    return recorded, path
