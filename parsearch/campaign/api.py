"""Run a campaign from Python with a backend object: the library's way in.

``parsearch run`` names its backend (``--backend simulate``) and builds it from options. A
benchmark, a notebook or another tool often holds a backend already (a simulated machine
of its own, a scheduler's allocation), and a strategy it built itself; :func:`run_campaign`
takes both as objects and does the same wiring as the command (store, campaign record,
lease, strategy seeded with nothing, driver), so nobody has to copy it.

    import parsearch
    from parsearch.backends.simulate import SimulateBackend, SimulateSettings

    space = parsearch.load_space("search_spaces/gpt-22b-frontier.yaml")
    backend = SimulateBackend(space, SimulateSettings(seed=0), slots=1)
    summary = parsearch.run_campaign(space, "campaigns.db", backend=backend, budget=20)
"""

from __future__ import annotations

from pathlib import Path

from parsearch.backends import Backend
from parsearch.campaign import DEFAULT_BUDGET
from parsearch.campaign.observers import Observers
from parsearch.campaign.progress import Progress
from parsearch.campaign.session import CampaignSettings, SessionSummary, _Parts, start_campaign
from parsearch.search.factory import make_strategy
from parsearch.search.proxy_phase import ProxyPhase
from parsearch.search.strategy import Strategy
from parsearch.space import SearchSpace, load_space


def run_campaign(
    space: SearchSpace | str | Path,
    store: str | Path,
    *,
    backend: Backend,
    strategy: str | Strategy = "default",
    budget: int = DEFAULT_BUDGET,
    seed: int = 0,
    name: str | None = None,
    timeout_s: float | None = None,
    progress: bool = False,
    observers: Observers | None = None,
    proxy: bool = False,
    settle: bool = False,
) -> SessionSummary:
    """Create campaign ``name`` (default: the space's name) in the store file ``store`` and
    run it on ``backend`` until ``budget`` trials have finished.

    ``strategy`` is a strategy name (``default``, ``cbo-raw``, ``random``) or a
    :class:`~parsearch.search.strategy.Strategy` built for ``space``. The campaign owns
    both from then on: they are closed when it ends, whatever happens. It is recorded like
    one started by ``parsearch run``, so ``parsearch status/top/report`` read it; ``resume``
    rebuilds its backend by name (``backend.name``) with default options. ``proxy``
    explores by proxy trials on fewer nodes and confirms the best at full scale, as
    ``parsearch run --proxy`` (:mod:`parsearch.search.proxy_phase`); ``settle`` ends it
    once no untried layout is expected to beat the best, as ``parsearch run --settle``.
    """
    try:
        if not isinstance(space, SearchSpace):
            space = load_space(space)
        if isinstance(strategy, str):
            strategy = make_strategy(strategy, space, seed=seed, settle=settle, proxy=proxy)
        elif proxy:
            strategy = ProxyPhase(strategy)
    except BaseException:
        backend.close()
        if isinstance(strategy, Strategy):
            strategy.close()
        raise
    settings = CampaignSettings(
        backend=backend.name, timeout_s=timeout_s, **strategy.campaign_settings()
    )
    return start_campaign(
        space,
        store,
        name=name,
        budget=budget,
        seed=seed,
        settings=settings,
        progress=Progress(enabled=progress),
        observers=observers,
        parts=_Parts(strategy, backend),
    )
