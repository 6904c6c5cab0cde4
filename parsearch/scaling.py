"""A scaling study's values, and how they are read back from a store.

A study of campaign ``C`` is one child campaign per allocation size, named
``C-scaling-<mode>-<nodes>n``, each with one trial: the parent's best layout at that size.
Efficiency is throughput per device relative to the smallest size measured (1.0: perfect
scaling), as the reference study reports it. Pure: the store is passed in.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from parsearch.config import ParallelLayout
from parsearch.result import TrialState
from parsearch.store import Campaign, Store, TrialRecord

MODES = ("weak", "strong")
STUDY_MARK = "-scaling-"
_CHILD = re.compile(r"^(?P<parent>.+)-scaling-(?P<mode>weak|strong)-(?P<nodes>\d+)n$")


def child_name(parent: str, mode: str, nodes: int) -> str:
    return f"{parent}{STUDY_MARK}{mode}-{nodes}n"


def chosen_campaign(store: Store, name: str | None) -> Campaign:
    """Campaign ``name`` of ``store``, or without a name the newest search: a study's sizes
    are children of a search, so they are never what a command that reads, continues or
    scales "the" campaign means by default."""
    if name is not None:
        return store.get_campaign(name)
    searches = [c for c in store.list_campaigns() if STUDY_MARK not in c.name]
    if not searches:
        return store.get_campaign(None)  # its error names the store
    return max(searches, key=lambda c: (c.created_at, c.id))


@dataclass(frozen=True)
class StudyPoint:
    """What one size measured (``tokens_per_s`` None until its trial succeeds)."""

    nodes: int
    devices: int
    layout: ParallelLayout
    campaign: str
    state: str
    tokens_per_s: float | None
    trial: int | None
    efficiency: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes,
            "devices": self.devices,
            "layout": self.layout.short(),
            "dp": self.layout.dp,
            "global_batch": self.layout.global_batch,
            "campaign": self.campaign,
            "state": self.state,
            "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_per_device": None
            if self.tokens_per_s is None
            else self.tokens_per_s / self.devices,
            "efficiency": self.efficiency,
            "trial": self.trial,
        }


@dataclass(frozen=True)
class ScalingStudy:
    parent: str
    mode: str
    points: list[StudyPoint]
    complete: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "parent": self.parent,
            "mode": self.mode,
            "complete": self.complete,
            "points": [point.to_dict() for point in self.points],
        }


def read_studies(store: Store, parent: str) -> list[ScalingStudy]:
    """Every study of campaign ``parent`` in ``store`` (weak first), sizes that have a
    trial only."""
    points: dict[str, list[StudyPoint]] = {}
    for campaign in store.list_campaigns():
        match = _CHILD.match(campaign.name)
        if match is None or match["parent"] != parent:
            continue
        record = last_finished(store, campaign) or next(iter(store.trials(campaign.id)), None)
        if record is not None:
            points.setdefault(match["mode"], []).append(
                study_point(int(match["nodes"]), record.layout, campaign.name, record)
            )
    return [
        ScalingStudy(parent, mode, with_efficiency(sorted(found, key=lambda p: p.nodes)), True)
        for mode, found in sorted(points.items(), key=lambda item: MODES.index(item[0]))
    ]


def last_finished(store: Store, campaign: Campaign | None) -> TrialRecord | None:
    if campaign is None:
        return None
    finished = [r for r in store.trials(campaign.id) if r.state.finished]
    return finished[-1] if finished else None


def study_point(
    nodes: int, layout: ParallelLayout, campaign: str, record: TrialRecord | None
) -> StudyPoint:
    ok = record is not None and record.state is TrialState.OK
    return StudyPoint(
        nodes=nodes,
        devices=layout.world_size,
        layout=layout,
        campaign=campaign,
        state="not run" if record is None else record.state.value,
        tokens_per_s=record.tokens_per_s if ok and record is not None else None,
        trial=None if record is None else record.number,
    )


def with_efficiency(points: Sequence[StudyPoint]) -> list[StudyPoint]:
    """Throughput per device over the smallest measured size's (1.0: perfect scaling)."""
    measured = [p for p in points if p.tokens_per_s]
    if not measured:
        return list(points)
    reference = min(measured, key=lambda p: p.devices)
    assert reference.tokens_per_s is not None
    per_device = reference.tokens_per_s / reference.devices
    return [
        replace(p, efficiency=p.tokens_per_s / p.devices / per_device) if p.tokens_per_s else p
        for p in points
    ]
