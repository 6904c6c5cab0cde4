"""Strategies by name: what ``run --strategy`` and ``run --proxy`` build.

Apart from :mod:`parsearch.search.strategy` because a proxy campaign wraps the named strategy
in :class:`~parsearch.search.proxy_phase.ProxyPhase`, which is built on that module.
"""

from __future__ import annotations

from parsearch.search.proxy_phase import ProxyPhase
from parsearch.search.strategy import (
    SETTLE_SPREADS,
    STRATEGIES,
    GuidedStrategy,
    Strategy,
    StrategyError,
)
from parsearch.search.warm_start import WarmStart
from parsearch.space import SearchSpace


def make_strategy(
    name: str,
    space: SearchSpace,
    *,
    seed: int,
    keep_predicted_oom: bool = False,
    warm_start: WarmStart | None = None,
    settle: bool = False,
    proxy: bool = False,
) -> Strategy:
    """The strategy called ``name`` for ``space``; ``keep_predicted_oom``, ``warm_start``
    (another campaign's measurements, read by
    :func:`parsearch.campaign.warm_start.load_warm_start`, which calibrate the estimate) and
    ``settle`` (end once no untried layout could beat the best, :data:`SETTLE_SPREADS`) apply
    to ``default`` only; ``proxy`` measures its proposals by proxy trials first
    (:class:`~parsearch.search.proxy_phase.ProxyPhase`)."""
    if name not in STRATEGIES:
        raise StrategyError(f"unknown strategy {name!r}; valid: {sorted(STRATEGIES)}")
    if name != GuidedStrategy.name:
        if warm_start is not None:
            raise StrategyError(f"--warm-start needs the default strategy, not {name!r}")
        if settle:
            raise StrategyError(f"--settle needs the default strategy, not {name!r}")
        strategy: Strategy = STRATEGIES[name](space, seed=seed)
    else:
        strategy = GuidedStrategy(
            space,
            seed=seed,
            keep_predicted_oom=keep_predicted_oom,
            warm_start=warm_start,
            settle=SETTLE_SPREADS if settle else None,
        )
    if not proxy:
        return strategy
    return ProxyPhase(strategy)
