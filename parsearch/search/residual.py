"""What the calibrated estimate still gets wrong, learnt as a smooth field over layouts.

The step-time calibration re-weights the estimate's parts, so it can only correct errors
the estimate's *form* can express. A machine whose throughput departs from that form
(a GEMM shape that runs slow, a topology the estimate does not model) leaves a residual,
``log(measured / calibrated)``, that varies from layout to layout. :class:`ResidualField`
learns it with a Gaussian process over the layout's dimensions (log2 steps of tp, pp, dp,
mbs, gas and vpp; ZeRO stage, recompute and sequence parallelism as categories), zero mean:
the calibrated estimate is the prior mean of the search, not a cage. Its posterior mean
re-ranks the untried layouts near measured ones; its posterior spread says where nothing
is known, which :class:`Plateau` turns into exploration once the search stops improving.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from parsearch.config import RECOMPUTE_CHOICES, ParallelLayout

CATEGORY_DISTANCE = 2.0


class ResidualField:
    """A Gaussian process on ``log(measured / calibrated objective)`` over fixed layouts.

    ``amplitude`` is the prior spread of the residual (0.2: the estimate is trusted to about
    20% before any trial), ``length`` the correlation length in log2 steps, ``noise`` the
    trials' own relative noise, ``category_distance`` how far apart (in lengths) two layouts
    that differ in one category are.
    """

    def __init__(
        self,
        layouts: Sequence[ParallelLayout],
        *,
        amplitude: float = 0.2,
        length: float = 1.0,
        noise: float = 0.05,
        category_distance: float = CATEGORY_DISTANCE,
    ):
        self.features = np.array([features(layout) for layout in layouts])
        self.features[:, :NUMERIC] /= length
        self.category_distance = category_distance
        self.amplitude, self.noise = amplitude, noise
        self._items: list[int] = []
        self._objectives: list[float] = []
        # Kept up to date one measurement at a time, so a posterior costs O(items x
        # measurements), not O(items x measurements²): the Cholesky factor of the
        # measurements' covariance, L⁻¹ times their covariance with every item, and the
        # posterior variance of every item.
        self._factor = np.zeros((0, 0))
        self._rows = np.zeros((0, len(layouts)))  # the first len(_items) rows are used
        self._variance = np.full(len(layouts), amplitude**2)

    def add(self, item: int, objective: float) -> None:
        """Item ``item`` measured ``objective`` (a repeat measurement is ignored)."""
        if objective <= 0 or item in self._items:
            return
        prior = self.amplitude**2
        covariance = (
            prior * kernel(self.features[item : item + 1], self.features, self.category_distance)[0]
        )
        row = self._projection[:, item]  # L⁻¹ k(measured, item)
        pivot = np.sqrt(max(prior + self.noise**2 - row @ row, 1e-12))
        size = len(self._items)
        factor = np.zeros((size + 1, size + 1))
        factor[:size, :size] = self._factor
        factor[size, :size] = row
        factor[size, size] = pivot
        new = (covariance - row @ self._projection) / pivot
        self._factor = factor
        if size == len(self._rows):  # grow the buffer by doubling, not a copy per trial
            rows = np.zeros((max(16, 2 * size), len(new)))
            rows[:size] = self._rows
            self._rows = rows
        self._rows[size] = new
        self._variance = np.maximum(self._variance - new * new, 1e-12)
        self._items.append(item)
        self._objectives.append(float(objective))

    @property
    def measurements(self) -> int:
        return len(self._items)

    @property
    def _projection(self) -> np.ndarray:
        return self._rows[: len(self._items)]

    def posterior(self, calibrated: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation of the log residual of every item, given the
        calibrated objectives of every item now."""
        if not self._items:
            return np.zeros(len(self.features)), np.sqrt(self._variance)
        residual = np.log(np.array(self._objectives) / calibrated[self._items])
        whitened = _forward(self._factor, residual)
        return whitened @ self._projection, np.sqrt(self._variance)


def _forward(lower: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``lower⁻¹ b`` for a lower-triangular ``lower`` (LAPACK: a Python loop of forward
    substitution cost more at a few hundred measurements)."""
    return np.linalg.solve(lower, b) if len(b) else np.zeros_like(b)


def log_expected_improvement(
    log_mean: np.ndarray, spread: np.ndarray, log_best: float
) -> np.ndarray:
    """``log E[max(0, f - best)]`` in log-objective units, for ``f ~ N(log_mean, spread²)``.

    A layout the field expects just below the best measured, and knows well (a sibling of
    the incumbent), can hardly beat it; one expected a little lower but never checked can:
    ranking by expected improvement rather than by the mean stops the search from spending
    trial after trial on variants of its incumbent. Computed in logs (an asymptotic form
    far below the best) so that layouts with a vanishing improvement still rank by it.
    """
    spread = np.maximum(spread, 1e-9)
    z = (log_mean - log_best) / spread
    out = np.empty_like(z)
    near = z > -6.0
    zn = z[near]
    cdf = 0.5 * (1.0 + np.array([math.erf(v / math.sqrt(2.0)) for v in zn]))
    pdf = np.exp(-0.5 * zn * zn) / math.sqrt(2.0 * math.pi)
    out[near] = np.log(spread[near]) + np.log(np.maximum(zn * cdf + pdf, 1e-300))
    zf = z[~near]  # z·Φ(z) + φ(z) ≈ φ(z)·(1 - 3/z²) / z² for z → -∞
    out[~near] = (
        np.log(spread[~near])
        - 0.5 * zf * zf
        - 0.5 * math.log(2.0 * math.pi)
        - 2.0 * np.log(-zf)
        + np.log1p(-3.0 / (zf * zf))
    )
    return out


class Plateau:
    """Counts trials since the best objective last rose by more than ``tolerance``."""

    def __init__(self, patience: int = 6, tolerance: float = 0.01):
        self.patience, self.tolerance = patience, tolerance
        self.best = 0.0
        self.since = 0

    def add(self, objective: float | None) -> None:
        if objective is not None and objective > self.best * (1 + self.tolerance):
            self.best = objective
            self.since = 0
        else:
            self.since += 1

    @property
    def stuck(self) -> bool:
        return self.since >= self.patience


NUMERIC = 6


def features(layout: ParallelLayout) -> list[float]:
    """log2 of the numeric dimensions, then the categorical ones."""
    numeric = [layout.tp, layout.pp, layout.dp, layout.mbs, layout.gas, layout.vpp]
    return [
        *np.log2(numeric).tolist(),
        float(layout.zero_stage),
        float(RECOMPUTE_CHOICES.index(layout.recompute)),
        float(layout.sequence_parallel),
    ]


def kernel(
    a: np.ndarray, b: np.ndarray, category_distance: float = CATEGORY_DISTANCE
) -> np.ndarray:
    """Squared-exponential in the numeric columns; ``category_distance`` squared per
    differing category."""
    x, y = a[:, :NUMERIC], b[:, :NUMERIC]
    squared = (x * x).sum(axis=1)[:, None] + (y * y).sum(axis=1)[None, :] - 2 * x @ y.T
    for column in range(NUMERIC, a.shape[1]):
        squared += category_distance**2 * (a[:, None, column] != b[None, :, column])
    return np.exp(-0.5 * np.maximum(squared, 0.0))
