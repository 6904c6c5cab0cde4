"""Simulated machines on which a proxy (the same layout at fewer data-parallel replicas)
misleads in ways no single correction learnt from confirmations can fix.

On the truths of :mod:`truths` a proxy's full-scale prediction
(:func:`~parsearch.estimate.proxy.full_scale_figures`) misses only by the measurements'
noise: none of them makes the data-parallel (DP) reduction cost what the estimate says
*differently by layout*, and their memory at full scale is never above a proxy's. Real
machines do both: the DP ring of a wide layout crosses more switch groups than the proxy's
and hides behind less backward compute at a small micro-batch, and communicator and bucket
buffers grow with the group. Two truths, each on the throughput of the random-field truth
(:class:`truths.RandomField`: the estimate's best is not the optimum, so a plain campaign
needs several trials), with a second seeded smooth field over the layout's searched values
(not dp, which the proxy changes):

* :class:`DPSkew` (``dp-skew``): the step at ``dp`` replicas is longer than the field
  truth's by ``skew(layout) * s(dp)``, with ``s(dp) = log(dp) / log(world)`` (0 on one
  replica, 1 on every device) and ``skew`` from 0 to :attr:`DPSkew.SKEW` of the step. A
  proxy at a small ``dp'`` sees little of it; its full-scale prediction is high by
  ``skew * (s(dp) - s(dp'))``, which differs by layout, so one global correction cannot
  fix it and the learnt spread must.
* :class:`DPWall` (``dp-wall``): memory as the estimate's, plus buffers per DP peer:
  ``wall(layout) * (dp - 1) / (D - 1)`` of the device, ``D`` the layout's replicas at full
  scale (``wall`` from 0 to :attr:`DPWall.WALL`): a proxy at a few replicas holds a small
  part of them and fits where its full-scale layout runs out of memory, which no proxy can
  show; only a full-scale trial does. The :attr:`DPWall.RAISED` fastest layouts (by the
  field's noiseless throughput) whose smallest proxy would still fit get a wall that takes
  them 2% over the device at full scale: the proxies a campaign most wants to confirm.

Both are deterministic per seed, with the throughput noise of :mod:`truths`.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from truths import Answer, RandomField

from parsearch.config import ParallelLayout
from parsearch.estimate.proxy import choose_proxy, predict_run
from parsearch.space import SearchSpace


class _Field:
    """A smooth seeded field over the index of each searched value (not dp), in [0, 1]: the
    random Fourier features of :class:`truths.RandomField`, squashed by tanh."""

    FEATURES = 96

    def __init__(self, space: SearchSpace, seed: int):
        self.names = [name for name in space.searched if name != "dp"]
        self.index = {n: {v: i for i, v in enumerate(space.searched[n])} for n in self.names}
        rng = np.random.default_rng(seed)
        lengths = rng.uniform(1.0, 2.0, size=len(self.names))
        self._omega = rng.normal(size=(self.FEATURES, len(self.names))) / lengths
        self._phase = rng.uniform(0, 2 * np.pi, size=self.FEATURES)

    def __call__(self, layout: ParallelLayout) -> float:
        x = np.array([self.index[n][getattr(layout, n)] for n in self.names], dtype=float)
        f = math.sqrt(2.0 / self.FEATURES) * np.cos(self._omega @ x + self._phase).sum()
        return 0.5 + 0.5 * math.tanh(f)


def dp_share(space: SearchSpace, layout: ParallelLayout) -> float:
    """``log(dp) / log(world)``: how much of the DP reduction's full reach a run at
    ``layout.dp`` replicas has (0 with one replica, 1 with every device)."""
    return math.log(layout.dp) / math.log(max(space.world_size, 2))


class DPSkew(RandomField):
    """The field truth with a DP reduction that costs more than the estimate says, by
    layout, and more the more replicas share it (see the module docstring)."""

    name = "dp-skew"
    SKEW = 0.5  # of the step, at most, on every device

    def __init__(self, space: SearchSpace, seed: int, mem_factor: float = 1.0):
        super().__init__(space, seed, mem_factor)
        self.skew = _Field(space, seed + 7919)

    def answer(self, layout: ParallelLayout) -> Answer:
        answer = super().answer(layout)
        extra = self.SKEW * self.skew(layout) * dp_share(self.space, layout)
        return Answer(answer.step_s * (1 + extra), answer.peak_bytes)


class DPWall(RandomField):
    """The field truth with memory that grows with the DP group beyond the estimate, by
    layout: full scale runs out of memory where its proxy fits (see the module
    docstring)."""

    name = "dp-wall"
    WALL = 0.3  # of the device, at most, at full scale
    RAISED = 5  # fastest layouts taken over the device at full scale, their proxy fitting

    def __init__(self, space: SearchSpace, seed: int, mem_factor: float = 1.0):
        super().__init__(space, seed, mem_factor)
        field = _Field(space, seed + 104729)
        limit = space.memory_limit_bytes
        self.walls: dict[str, float] = {}  # key -> share of the device at full scale
        fastest = sorted(
            space.plan().feasible, key=lambda item: -self._factor(item[0]) / item[1].step_time_s
        )
        raised = 0
        for layout, prediction in fastest:
            wall = self.WALL * field(layout)
            if raised < self.RAISED:
                needed = 1.02 - prediction.memory.total / limit
                plan = choose_proxy(space.model, layout, space.allocation, space.estimate)
                if plan is not None and needed > wall:
                    proxy = predict_run(
                        space.model, plan.proxy_layout, space.allocation, space.estimate
                    )
                    share = _peers(space, plan.proxy_layout)
                    if proxy.memory.total + needed * share * limit <= limit:
                        wall = needed
                        raised += 1
            self.walls[layout.key()] = wall
        self._field = field

    def answer(self, layout: ParallelLayout) -> Answer:
        answer = super().answer(layout)
        full = dataclasses.replace(layout, dp=self.space.world_size // (layout.tp * layout.pp))
        wall = self.walls.get(full.key())
        if wall is None:
            wall = self.WALL * self._field(layout)
        extra = wall * _peers(self.space, layout) * self.space.memory_limit_bytes
        return Answer(answer.step_s, answer.peak_bytes + extra)


def _peers(space: SearchSpace, layout: ParallelLayout) -> float:
    """``(dp - 1) / (D - 1)``, ``D`` the layout's replicas at full scale: the share of its
    full-scale DP peers a run at ``layout.dp`` replicas has."""
    full_dp = space.world_size // (layout.tp * layout.pp)
    return (layout.dp - 1) / max(full_dp - 1, 1)


PROXY_TRUTHS = {DPSkew.name: DPSkew, DPWall.name: DPWall}
