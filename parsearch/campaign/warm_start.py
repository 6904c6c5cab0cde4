"""Another campaign's measurements read from its store, for ``--warm-start``: the driver's
side of a warm start (:mod:`parsearch.search.warm_start` turns them into what the search
learns, knowing no store)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from parsearch.errors import ParsearchError
from parsearch.result import TrialState
from parsearch.scaling import chosen_campaign
from parsearch.store import open_store

if TYPE_CHECKING:
    from parsearch.search.warm_start import WarmStart


def load_warm_start(path: str | Path, name: str | None = None) -> WarmStart:
    """The measurements of campaign ``name`` (default: the newest) of the store at ``path``."""
    from parsearch.search.warm_start import WarmStartError, warm_start_from  # numpy

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
