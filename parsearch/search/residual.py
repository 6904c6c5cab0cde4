"""What the calibrated estimate still gets wrong, learnt as a smooth field over layouts.

The step-time calibration re-weights the estimate's parts, so it can only correct errors
the estimate's *form* can express. A machine whose throughput departs from that form
(a GEMM shape that runs slow, a topology the estimate does not model) leaves a residual,
``log(measured / calibrated)``, that varies from layout to layout. :class:`ResidualField`
learns it with scikit-learn's Gaussian process (the one DeepHyper's own GP surrogate is
built on) over the layout's declared dimensions (log2 steps of the degrees and counts:
tp, cp, pp, dp, mbs, gas, vpp; ZeRO stage, recompute and sequence parallelism as
categories), zero mean: the calibrated estimate is the prior mean of the search, not a
cage. Its posterior mean re-ranks the untried layouts near measured ones; its posterior
spread says where nothing is known, which :class:`Plateau` turns into exploration once
the search stops improving.

:class:`~parsearch.search.surrogate.EstimateSurrogate` makes the same model DeepHyper's
surrogate: CBO is told the log objective of every trial, and its surrogate predicts the
log calibrated estimate plus the field's posterior, so that DeepHyper's acquisition
scores its proposals in the estimate's frame and what it learns is what the estimate gets
wrong.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from parsearch.config import LAYOUT_DIMENSIONS, Dimension, ParallelLayout

if TYPE_CHECKING:
    from sklearn.gaussian_process import GaussianProcessRegressor

CATEGORY_DISTANCE = 2.0


class ResidualField:
    """A Gaussian process on ``log(measured / calibrated objective)`` over fixed layouts.

    ``amplitude`` is the prior spread of the residual (0.2: the estimate is trusted to about
    20% before any trial), ``length`` the correlation length in log2 steps, ``noise`` the
    trials' own relative noise, ``category_distance`` how far apart (in lengths) two layouts
    that differ in one category are. The hyperparameters are fixed, not fitted: a dozen
    measurements cannot tell a length from a noise, and the benchmark chose these
    (``benchmarks/search_efficiency.py``, variants ``residual-*``).
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
        features_ = np.array([features(layout) for layout in layouts])
        features_[:, :NUMERIC] /= length
        self.category_distance = category_distance
        self.amplitude, self.noise, self.length = amplitude, noise, length
        self._items: list[int] = []
        self._objectives: list[float] = []
        self.features = features_

    @property
    def features(self) -> np.ndarray:
        """Each layout's coordinates: numeric columns in lengths, then category codes."""
        return self._features

    @features.setter
    def features(self, value: np.ndarray) -> None:
        self._features = np.asarray(value, dtype=float)
        self._inputs = gp_inputs(self._features, self.category_distance)
        self._fitted: tuple[int, GaussianProcessRegressor] | None = None
        self._cross: np.ndarray | None = None
        self._spread: np.ndarray | None = None

    def empty(self) -> ResidualField:
        """A field over the same layouts and coordinates with no measurement."""
        field = object.__new__(ResidualField)
        field.category_distance = self.category_distance
        field.amplitude, field.noise, field.length = self.amplitude, self.noise, self.length
        field._items, field._objectives = [], []
        field._features, field._inputs = self._features, self._inputs
        field._fitted = field._cross = field._spread = None
        return field

    def add(self, item: int, objective: float) -> None:
        """Item ``item`` measured ``objective`` (a repeat measurement is ignored)."""
        if objective <= 0 or item in self._items:
            return
        self._items.append(item)
        self._objectives.append(float(objective))

    @property
    def measurements(self) -> int:
        return len(self._items)

    def posterior(
        self, calibrated: np.ndarray, at: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation of the log residual of every item (or of the items
        ``at``), given the calibrated objectives of every item now."""
        inputs = self._inputs if at is None else self._inputs[at]
        if not self._items:
            return np.zeros(len(inputs)), np.full(len(inputs), self.amplitude)
        from scipy.linalg import cho_solve

        residual = np.log(np.array(self._objectives) / calibrated[self._items])
        model = self._model()
        weights = cho_solve((model.L_, True), residual)
        if at is None:  # every item, after every trial: the cross-covariance is kept
            if self._cross is None:
                self._cross = model.kernel_(inputs, model.X_train_)
                self._spread = model.predict(inputs, return_std=True)[1]
            return self._cross @ weights, np.maximum(self._spread, 1e-6)
        cross = model.kernel_(inputs, model.X_train_)
        spread = model.predict(inputs, return_std=True)[1]
        return cross @ weights, np.maximum(spread, 1e-6)

    def _model(self) -> GaussianProcessRegressor:
        """The process conditioned on the measured layouts (its factor depends on where
        they are, not on what they measured: the residuals change with the calibration)."""
        if self._fitted is None or self._fitted[0] != len(self._items):
            from sklearn.gaussian_process import GaussianProcessRegressor
            from sklearn.gaussian_process.kernels import RBF, ConstantKernel

            kernel = ConstantKernel(self.amplitude**2, "fixed") * RBF(1.0, "fixed")
            model = GaussianProcessRegressor(kernel, alpha=self.noise**2, optimizer=None)
            model.fit(self._inputs[self._items], np.zeros(len(self._items)))
            self._fitted = (len(self._items), model)
            self._cross = self._spread = None
        return self._fitted[1]


def gp_inputs(coordinates: np.ndarray, category_distance: float) -> np.ndarray:
    """The Gaussian process's inputs: the numeric columns as they are, each category one-hot
    and scaled so that two layouts differing in it are ``category_distance`` apart (a
    squared-exponential kernel then gives ``exp(-distance²/2)`` per differing category)."""
    numeric = coordinates[:, :NUMERIC]
    columns = [numeric]
    for column in range(NUMERIC, coordinates.shape[1]):
        values = coordinates[:, column]
        levels = np.unique(values)
        columns.append((values[:, None] == levels[None, :]) * (category_distance / math.sqrt(2)))
    return np.hstack(columns)


class EstimateFrame:
    """What :class:`~parsearch.search.surrogate.EstimateSurrogate` needs of the strategy
    that hands it to DeepHyper: the calibrated objective of every item now, a field with
    no measurement, and which item a point of the searched dimensions is (``item_of``:
    ``None`` for a point outside the items). ``items_of``, which item each row of
    DeepHyper's own encoding is, is set by the optimizer that knows that encoding.

    DeepHyper clones its surrogate (deep-copying its parameters) at every fit; the copy
    keeps this very frame, not a copy of the strategy behind it.
    """

    def __init__(
        self,
        calibrated: Callable[[], np.ndarray],
        field: Callable[[], ResidualField],
        item_of: Callable[[dict], int | None],
    ):
        self.calibrated = calibrated
        self.field = field
        self.item_of = item_of
        self.items_of: Callable[[np.ndarray], np.ndarray] = _no_items

    def __deepcopy__(self, memo: dict) -> EstimateFrame:
        return self


def _no_items(rows: np.ndarray) -> np.ndarray:
    raise RuntimeError("EstimateFrame.items_of is set by the optimizer that uses the frame")


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

    def gains(self, objective: float | None) -> bool:
        """Whether ``objective`` would raise the best by more than the tolerance."""
        return objective is not None and objective > self.best * (1 + self.tolerance)

    def add(self, objective: float | None) -> None:
        if self.gains(objective):
            self.best = objective
            self.since = 0
        else:
            self.since += 1

    @property
    def stuck(self) -> bool:
        return self.since >= self.patience


# The fields' coordinates, from the declared layout dimensions: degrees and counts (integers
# from 1) on a log2 scale, the rest (ZeRO stage, recompute, flags) as categories.
NUMERIC_DIMENSIONS = tuple(d for d in LAYOUT_DIMENSIONS if d.kind == "int" and d.minimum >= 1)
CATEGORY_DIMENSIONS = tuple(d for d in LAYOUT_DIMENSIONS if d not in NUMERIC_DIMENSIONS)
NUMERIC = len(NUMERIC_DIMENSIONS)


def features(layout: ParallelLayout, **instead: float) -> list[float]:
    """log2 of the numeric dimensions (a value in ``instead`` replaces the layout's), then
    the categorical ones."""
    numeric = [instead.get(d.name, getattr(layout, d.name)) for d in NUMERIC_DIMENSIONS]
    categories = [_category(d, getattr(layout, d.name)) for d in CATEGORY_DIMENSIONS]
    return [*np.log2(numeric).tolist(), *categories]


def _category(dimension: Dimension, value: object) -> float:
    return float(dimension.choices.index(value) if dimension.kind == "choice" else value)


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
