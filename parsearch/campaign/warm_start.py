"""Another campaign's measurements read from its store, for ``--warm-start``: the driver's
side of a warm start (:mod:`parsearch.search.warm_start` turns them into what the search
learns, knowing no store).

A store a centre shares often already holds the same model on the same devices at another
node count (a 175B campaign on 32 nodes before one on 64): :func:`store_warm_start_source`
finds it, so a new campaign of the default strategy warm-starts from its own store unless
told otherwise (``--no-auto-warm-start``) or given another source (``--warm-start``). The
same allocation is left out: that campaign answers the new one's question already
(``parsearch best --like``, or resume it)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from parsearch.best_known import Comparable
from parsearch.errors import ParsearchError
from parsearch.result import TrialState
from parsearch.scaling import chosen_campaign
from parsearch.space import SearchSpace, space_from_dict
from parsearch.store import Campaign, Store, is_postgres_url, open_store

if TYPE_CHECKING:
    from parsearch.search.warm_start import WarmStart


def load_warm_start(path: str | Path, name: str | None = None) -> WarmStart:
    """The measurements of campaign ``name`` (default: the newest) of the store at ``path``
    (a SQLite file or a ``postgresql://`` URL)."""
    from parsearch.search.warm_start import WarmStartError, warm_start_from  # numpy

    if not is_postgres_url(path):
        path = Path(path)
        if not path.is_file():
            raise WarmStartError(f"--warm-start: no store at {path}")
    try:
        with open_store(path, readonly=True) as store:
            campaign = chosen_campaign(store, name)
            trials = store.trials(campaign.id, states=[TrialState.OK, TrialState.OOM])
    except ParsearchError as error:
        raise WarmStartError(f"--warm-start {path}: {error}") from None
    return warm_start_from(campaign, trials, str(path))


def store_warm_start_source(store: Store, space: SearchSpace) -> tuple[Campaign, int] | None:
    """The campaign of ``store`` a new campaign of ``space`` should warm-start from, with
    its count of finished (ok or out-of-memory) trials: the same model on the same kind of
    device and node, by the same trainer kind, at another node count; the nearest count
    first (then the most trials). ``None`` when there is none."""
    wanted = Comparable.of(space)
    trainer = space.trainer.get("kind", "builtin")
    found = []
    for campaign in store.list_campaigns():
        try:
            other = space_from_dict(campaign.space, source=campaign.name)
        except ParsearchError:
            continue  # a space an older release stored: nothing to calibrate from
        shape = Comparable.of(other)
        if shape == wanted or not wanted.same_model_and_device(shape):
            continue
        if other.trainer.get("kind", "builtin") != trainer:
            continue
        counts = store.counts(campaign.id)
        finished = counts.get(TrialState.OK, 0) + counts.get(TrialState.OOM, 0)
        if finished:
            found.append((abs(math.log2(shape.nodes / wanted.nodes)), -finished, campaign))
    if not found:
        return None
    _, finished, campaign = min(found, key=lambda item: item[:2])
    return campaign, -finished
