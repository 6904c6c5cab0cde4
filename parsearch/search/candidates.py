"""The layouts a campaign may propose: the space enumerated once, best predicted first.

Every space we ship has at most a few thousand points, so enumerating them (``space.plan()``)
is cheap and turns the space's rules and the memory estimate into an explicit list. Searching
that list, rather than filtering samples of the raw product space, is what keeps the optimiser
from ever proposing a layout that cannot divide or is predicted not to fit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from parsearch.config import ParallelLayout
from parsearch.estimate import Prediction
from parsearch.space import SearchSpace


@dataclass(frozen=True)
class Candidate:
    """One proposable layout with the estimate's prediction for it."""

    layout: ParallelLayout
    prediction: Prediction

    @cached_property
    def key(self) -> str:
        """``layout.key()``, computed once: strategies compare thousands per trial."""
        return self.layout.key()


def point_of(space: SearchSpace, layout: ParallelLayout) -> dict[str, Any]:
    """The values of the space's searched dimensions in ``layout`` (what the optimiser sees)."""
    return {name: getattr(layout, name) for name in space.searched}


def raw_layout(space: SearchSpace, point: Mapping[str, Any]) -> ParallelLayout:
    """The layout a point of the raw space stands for, even when it cannot run.

    Where the derivation of ``dp`` (or of ``gas`` from the global batch) does not divide, it is
    rounded down, which makes ``space.violations`` name the broken rule; the searched fields
    are kept as given, so distinct points keep distinct keys. Strategies that search the raw
    space (``cbo-raw``, ``random``) record such points as infeasible trials.
    """
    layout = space.layout_from_point(point)
    if layout is not None:
        return layout
    values = {name: candidates[0] for name, candidates in space.dimensions.items()}
    values.update({name: point[name] for name in space.searched})
    mbs = int(values["mbs"])
    dp = space.world_size // (int(values["tp"]) * int(values["cp"]) * int(values["pp"]))
    values["dp"] = dp
    if "gas" not in space.dimensions:
        assert space.global_batch is not None  # guaranteed by the loader
        values["gas"] = space.global_batch // (mbs * dp) if dp else 0
    return ParallelLayout.from_dict(values)


def layout_problems(space: SearchSpace, layout: ParallelLayout) -> list[str]:
    """Why ``layout`` cannot run in ``space`` (empty: it can), derivation failures first.

    For a :func:`raw_layout` whose ``dp`` or ``gas`` could not be derived, that is the reason
    worth reporting, not the rounded-down value it left behind.
    """
    if layout.tp < 1 or layout.cp < 1 or layout.pp < 1:
        return space.violations(layout)
    model_ranks = layout.tp * layout.cp * layout.pp
    if space.world_size % model_ranks:
        return [f"tp*cp*pp = {model_ranks} does not divide the world size {space.world_size}"]
    if "gas" not in space.dimensions and space.global_batch is not None:
        share = layout.mbs * layout.dp
        if space.global_batch % share:
            return [
                f"mbs*dp = {layout.mbs}*{layout.dp} does not divide the global batch "
                f"{space.global_batch}"
            ]
    return space.violations(layout)
