"""The scaling study: a campaign's best layout run at several allocation sizes.

Each size is a child campaign of one trial in the same store, named after the parent, the
mode and the size (``gpt-175b-frontier-scaling-weak-16n``): it runs through the same driver,
on one backend for the whole study, and a study stopped half-way continues where it stopped
when the same command runs again (a finished size is read back, an interrupted one resumed,
nothing is repeated).

Weak scaling keeps the micro-batch and the accumulation, so the global batch grows with
``dp``; strong scaling keeps the parent's global batch, so accumulation shrinks as ``dp``
grows. Efficiency (:mod:`parsearch.scaling`) is throughput per device relative to the
smallest size measured, as the reference study reports it (Dash et al. 2023: 100% weak
scaling for 175B, 89% and 87% strong scaling for 175B and 1T).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from parsearch.backends import create_backend
from parsearch.campaign.progress import Progress
from parsearch.campaign.session import CampaignSettings, start_campaign
from parsearch.campaign.signals import StopRequest
from parsearch.config import ParallelLayout
from parsearch.errors import LayoutError, ParsearchError
from parsearch.scaling import (
    MODES,
    ScalingStudy,
    StudyPoint,
    child_name,
    chosen_campaign,
    last_finished,
    study_point,
    with_efficiency,
)
from parsearch.space import DEFAULT_TRIAL_TIMEOUT_S, DIMENSIONS, SearchSpace, space_from_dict
from parsearch.store import Campaign, CampaignStatus, open_store


class NoBestLayoutError(ParsearchError):
    """The parent campaign has no successful trial to scale."""

    exit_code = 2


@dataclass(frozen=True)
class StudySize:
    """One allocation size of a study: the layout it runs and its child campaign."""

    nodes: int
    layout: ParallelLayout
    campaign: str
    space: SearchSpace


def parse_nodes(text: str) -> list[int]:
    """``16,32,64`` -> [16, 32, 64]; anything else is bad input."""
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise LayoutError(
            f"--nodes must be a comma-separated list of node counts, e.g. 16,32,64; got {text!r}"
        ) from None
    if not sizes:
        raise LayoutError(f"--nodes lists no node count: {text!r}")
    bad = [n for n in sizes if n < 1]
    if bad:
        raise LayoutError(f"--nodes: node counts must be >= 1, got {bad[0]} in {text!r}")
    return sorted(set(sizes))


def plan_study(
    parent: Campaign, best: ParallelLayout, nodes: Sequence[int], mode: str
) -> list[StudySize]:
    """The layout and child space of each size, every size checked before anything runs."""
    if mode not in MODES:
        raise LayoutError(f"scaling mode must be one of {list(MODES)}, got {mode!r}")
    allocation = parent.space["allocation"]
    most, per_node = int(allocation["nodes"]), int(allocation["devices_per_node"])
    model_parallel = best.tp * best.cp * best.pp
    sizes = []
    for n in nodes:
        if n < 1:
            raise LayoutError(f"--nodes: node counts must be >= 1, got {n}")
        if n > most:
            raise LayoutError(
                f"--nodes: {n} nodes is larger than campaign '{parent.name}''s allocation "
                f"({most} nodes); valid: 1..{most}"
            )
        devices = n * per_node
        if devices % model_parallel:
            raise LayoutError(
                f"--nodes: {n} nodes ({devices} devices) do not divide into the best layout's "
                f"tp*cp*pp = {model_parallel} ranks per replica"
            )
        dp = devices // model_parallel
        gas = best.gas
        if mode == "strong":
            per_step = best.mbs * dp
            if best.global_batch % per_step:
                raise LayoutError(
                    f"--nodes: strong scaling keeps the global batch {best.global_batch}, "
                    f"which {n} nodes (dp={dp}, mbs={best.mbs}) do not divide"
                )
            gas = best.global_batch // per_step
        layout = replace(best, dp=dp, gas=gas)
        name = child_name(parent.name, mode, n)
        space = _child_space(parent, layout, n, name, slower=gas / best.gas)
        problems = space.violations(layout)
        if problems:
            raise LayoutError(f"--nodes: at {n} nodes {layout.short()} breaks: {problems[0]}")
        sizes.append(StudySize(n, layout, name, space))
    return sizes


def _child_space(
    parent: Campaign, layout: ParallelLayout, nodes: int, name: str, slower: float
) -> SearchSpace:
    """The parent's space at ``nodes`` nodes with one point: ``layout``. A strong-scaling
    size below the parent's runs ``slower`` times more micro-batches per step: its trial
    timeout grows as much."""
    raw = copy.deepcopy(parent.space)
    if slower > 1:
        trainer = raw.setdefault("trainer", {})
        timeout = float(trainer.get("timeout", DEFAULT_TRIAL_TIMEOUT_S))
        trainer["timeout"] = math.ceil(timeout * slower)
    raw["name"] = name
    raw["allocation"]["nodes"] = nodes
    raw.pop("exclude", None)
    raw["global_batch"] = layout.global_batch
    raw["search"] = {name: [getattr(layout, name)] for name in DIMENSIONS}
    return space_from_dict(raw, source=f"scaling study of campaign '{parent.name}'")


def run_study(
    store_path: str | Path,
    *,
    name: str | None,
    nodes: Sequence[int],
    mode: str,
    overrides: dict[str, Any] | None = None,
    progress: Progress | None = None,
) -> ScalingStudy:
    """Run (or continue) the study; it stops at the first size a signal interrupts. Sizes
    already finished are read back, not run."""
    with open_store(store_path, readonly=True) as store:
        parent = chosen_campaign(store, name)
        best = store.best(parent.id)
        if best is None:
            raise NoBestLayoutError(
                f"campaign '{parent.name}' has no successful trial to scale yet"
            )
        sizes = plan_study(parent, best.layout, nodes, mode)
        existing = {c.name: c for c in store.list_campaigns()}
    settings = replace(
        CampaignSettings.from_dict(parent.settings),
        strategy="random",  # one point: nothing to search, no optimizer to load
        keep_predicted_oom=True,
        warm_start=None,
        warm_start_name=None,
        machine=None,
    )
    overrides = dict(overrides or {})
    if overrides.get("backend", settings.backend) != settings.backend:
        overrides.setdefault("backend_options", {})  # the parent backend's do not apply
    settings = replace(settings, **overrides)
    to_run = [
        size
        for size in sizes
        if size.campaign not in existing
        or existing[size.campaign].status is not CampaignStatus.FINISHED
    ]
    complete = True
    if to_run:
        complete = _run_sizes(store_path, parent, to_run, settings, overrides, progress)
    return ScalingStudy(parent.name, mode, read_study(store_path, parent.name, sizes), complete)


def _run_sizes(
    store_path: str | Path,
    parent: Campaign,
    sizes: Sequence[StudySize],
    settings: CampaignSettings,
    overrides: dict[str, Any],
    progress: Progress | None,
) -> bool:
    """Run each size's child campaign, all on one backend (an MPI job's workers serve one
    backend); whether every size finished."""
    stop = StopRequest()  # shared with each size's campaign: a signal stops the study there
    space = space_from_dict(parent.space, source=f"campaign '{parent.name}'")
    with stop.on_signals():
        backend = create_backend(
            settings.backend, space, slots=settings.slots, options=settings.backend_options
        )
        try:
            for size in sizes:
                if stop.requested:
                    return False
                summary = start_campaign(
                    size.space,
                    store_path,
                    name=size.campaign,
                    budget=1,
                    seed=parent.seed,
                    settings=settings,
                    progress=progress,
                    resume_overrides=overrides,
                    backend=backend,
                    stop=stop,
                )
                if not summary.outcome.complete:
                    return False
        finally:
            backend.close()
    return True


def read_study(store_path: str | Path, parent: str, sizes: Sequence[StudySize]) -> list[StudyPoint]:
    """Each size's measurement from the store (sizes not run yet included), with
    efficiencies against the smallest size that succeeded."""
    with open_store(store_path, readonly=True) as store:
        names = {c.name: c for c in store.list_campaigns()}
        points = [
            study_point(
                size.nodes,
                size.layout,
                size.campaign,
                last_finished(store, names.get(size.campaign)),
            )
            for size in sizes
        ]
    return with_efficiency(points)
