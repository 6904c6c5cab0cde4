"""Memory feasibility from the trials nearest a layout, not only from one global fit.

A global fit of measured against predicted peak (:class:`~parsearch.search.calibration.
MemoryCalibration`) assumes the machine's memory is an affine function of the estimate's.
When it is not (an allocator that fragments activations but not optimiser state, buffers per
communicator), the fit's slope and spread absorb the mismatch, its margin grows, and the
layouts at the memory wall, where the optimum lives, are pruned although their closest
relatives were measured and fitted. Three kinds of local evidence correct that:

* **twins**: layouts that differ in one dimension only and are predicted to need the same
  memory (gas beyond pp under 1F1B, selective recompute under flash attention: the
  estimate says that dimension does not change memory there); and layouts that differ
  only in gradient accumulation, within which predicted memory only grows with gas. A
  measured fit says every twin (every gas sibling predicted to need no more) fits too, an
  out-of-memory trial that every twin (every sibling predicted to need as much or more)
  does not; this overrides any fit;
* **nearest measured**: the global fit's error at each measured layout (measured over
  calibrated peak), carried to the layouts around it by a kernel over the layout's
  dimensions (:func:`~parsearch.search.residual.kernel`: log2 steps of tp, cp, pp, dp,
  mbs, micro-batches in flight and vpp; ZeRO stage, recompute and sequence parallelism
  as categories), shrunk towards no correction where
  no measurement is near. The calibration is then per region, not affine;
* **out of memory as a lower bound**: a layout that ran out of memory needs more than the
  device offers; how much the runtime keeps for itself is unknown, so it is not assumed
  to have failed exactly at the declared size. Every layout expected to need at least as
  much as it (within the margin) is pruned, wherever the wall is.

A trial that ran is evidence for its twins whether or not its trainer reported a peak
(a command trainer's log may print none; the published sweeps replayed in
``benchmarks/replay/`` have none).

The margin is the local model's own leave-one-out spread, and never more than
:data:`MAX_MARGIN` of the device: a wide margin prunes exactly the layouts near the wall.

What the margin prunes is a verdict of inference, not of a measurement: a layout whose
neighbours ran out of memory may still fit (the optimum often sits just under the wall
they hit). :meth:`LocalMemory.fit_probability` says how likely each layout is to fit
instead, so that a strategy can weigh a pruned layout's chance against what it could gain.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from parsearch.config import LAYOUT_DIMENSIONS, ParallelLayout
from parsearch.search.residual import features, kernel

MAX_MARGIN = 0.08
# The relative error of the estimate's memory before any peak is measured (one sigma, in
# logs): out-of-memory trials alone then say how far the machine is above it.
PRIOR_SPREAD = 0.1
# The least relative error of a calibrated peak (one sigma): a fit that agrees with its
# measurements to 0.1% still extrapolates to layouts of another shape.
MIN_SPREAD = 0.015


class LocalMemory:
    """Twins, neighbours and out-of-memory bounds over a fixed list of layouts."""

    def __init__(
        self,
        layouts: Sequence[ParallelLayout],
        predicted: np.ndarray,
        *,
        length: float = 1.0,
        first_margin: float = 0.03,
    ):
        self.predicted = np.asarray(predicted, dtype=float)
        families: dict[tuple, int] = {}
        self.family = np.array(
            [families.setdefault(_family(layout), len(families)) for layout in layouts]
        )
        self.features = np.array([_features(layout) for layout in layouts]) / length
        self.first_margin = first_margin
        self._peaks: dict[int, tuple[float, float]] = {}  # item -> (measured, weight)
        self._ran: set[int] = set()  # items that ran to the end, peak reported or not
        self._ooms: set[int] = set()
        # Column k: the kernel from the k-th measured item to every item, computed once.
        self._near = np.zeros((len(layouts), 16))
        # Layouts that differ in one dimension only, by (dimension, the other values).
        self._fields = [_fields(layout) for layout in layouts]
        self._one_apart: dict[tuple, list[int]] = {}
        for item, fields in enumerate(self._fields):
            for d in range(len(fields)):
                self._one_apart.setdefault((d, fields[:d] + fields[d + 1 :]), []).append(item)
        self._proven = np.zeros(len(layouts), dtype=bool)
        self._refuted = np.zeros(len(layouts), dtype=bool)

    def add_peak(self, item: int, measured: float, weight: float = 1.0) -> None:
        """Item ``item`` ran and peaked at ``measured`` bytes."""
        if measured > 0 and weight > 0:
            self._peaks[item] = (float(measured), float(weight))
            self.add_ran(item)
            column = list(self._peaks).index(item)
            if column == self._near.shape[1]:
                self._near = np.hstack([self._near, np.zeros_like(self._near)])
            self._near[:, column] = kernel(self.features[item : item + 1], self.features)[0]

    def add_ran(self, item: int) -> None:
        """Item ``item`` ran to the end: what it needed fitted, whether or not its trainer
        reported a peak."""
        self._ran.add(item)
        self._proven[self._same_memory(item)] = True

    def add_oom(self, item: int) -> None:
        """Item ``item`` ran out of memory."""
        self._ooms.add(item)
        self._refuted[self._same_memory(item)] = True

    def _same_memory(self, item: int) -> list[int]:
        """Layouts that differ from ``item`` in one dimension and are predicted to need the
        same memory: the estimate says that dimension does not change memory there."""
        fields, predicted = self._fields[item], self.predicted[item]
        twins = {item}
        for d in range(len(fields)):
            for other in self._one_apart[(d, fields[:d] + fields[d + 1 :])]:
                if abs(self.predicted[other] - predicted) <= 1e-3 * predicted:
                    twins.add(other)
        return sorted(twins)

    def calibrated(self, global_peak: np.ndarray) -> tuple[np.ndarray, float | None]:
        """Every item's peak: the global fit's times the nearest measurements' correction,
        and the margin the corrections leave (``None`` before any measurement)."""
        if not self._peaks:
            return global_peak, None
        items = np.fromiter(self._peaks, dtype=int)
        measured = np.array([self._peaks[i][0] for i in items])
        weights = np.array([self._peaks[i][1] for i in items])
        error = np.log(measured / global_peak[items])
        near = self._near[:, : len(items)]
        correction = (near @ (weights * error)) / (1.0 + near @ weights)
        # Leave-one-out: how far each measurement is from what the others predict of it.
        among = near[items] * weights
        np.fill_diagonal(among, 0.0)
        loo = (among @ error) / (1.0 + among.sum(axis=1))
        spread = 2.5 * 1.4826 * float(np.median(np.abs(error - loo))) if len(items) > 2 else 0.0
        margin = min(max(spread, self.first_margin / weights.sum()), MAX_MARGIN)
        return global_peak * np.exp(correction), margin

    def fits(self, peak: np.ndarray, limit: float, margin: float) -> np.ndarray:
        """Which items fit, given their calibrated ``peak`` and the ``margin``."""
        fits = peak <= limit * (1.0 - min(margin, MAX_MARGIN))
        if self._ooms:
            ooms = np.fromiter(self._ooms, dtype=int)
            fits &= peak < peak[ooms].min() * (1.0 - margin)
        known_fit, known_oom = self._twins()
        return (fits | known_fit) & ~known_oom

    def fit_probability(self, peak: np.ndarray, limit: float, spread: float) -> np.ndarray:
        """How likely each item is to fit, given its calibrated ``peak`` with a relative
        error of ``spread`` (one sigma, in logs), the out-of-memory trials and the twins.

        The error is taken as shared by every layout (what the calibration has not learnt
        is mostly a scale): an out-of-memory trial then says it exceeds that layout's
        headroom ``log(limit / peak)``, and a layout with more headroom fits with the
        probability that the error lies between the two (none for one with less). A twin
        that ran or ran out of memory decides (probability 1 or 0), as in :meth:`fits`.
        """
        headroom = np.log(limit / np.asarray(peak, dtype=float))
        probability = _normal_cdf(headroom / spread)
        if self._ooms:
            ooms = np.fromiter(self._ooms, dtype=int)
            bound = float(headroom[ooms].max())  # the failed layout that needed least
            below = _normal_cdf(np.array([bound / spread]))[0]
            truncated = (probability - below) / max(1.0 - below, 1e-12)
            probability = np.where(headroom > bound, truncated, 0.0)
        known_fit, known_oom = self._twins()
        probability[known_fit] = 1.0
        probability[known_oom] = 0.0
        return np.clip(probability, 0.0, 1.0)

    @property
    def measured_oom(self) -> bool:
        """Whether any trial ran out of memory."""
        return bool(self._ooms)

    def _twins(self) -> tuple[np.ndarray, np.ndarray]:
        """Items a twin that ran proves to fit, and items an out-of-memory twin rules out."""
        size = self.family.max() + 1
        fitted = np.full(size, -np.inf)
        for item in self._ran:
            family = self.family[item]
            fitted[family] = max(fitted[family], self.predicted[item])
        failed = np.full(size, np.inf)
        for item in self._ooms:
            family = self.family[item]
            failed[family] = min(failed[family], self.predicted[item])
        tolerance = 1e-9 * self.predicted
        known_fit = (self.predicted <= fitted[self.family] + tolerance) | self._proven
        known_oom = (self.predicted >= failed[self.family] - tolerance) | self._refuted
        return known_fit & ~known_oom, known_oom


def _normal_cdf(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.array([math.erf(v / math.sqrt(2.0)) for v in np.ravel(z)]))


def _fields(layout: ParallelLayout) -> tuple:
    return tuple(getattr(layout, d.name) for d in LAYOUT_DIMENSIONS)


def _family(layout: ParallelLayout) -> tuple:
    """What a layout's memory depends on besides gradient accumulation."""
    return tuple(getattr(layout, d.name) for d in LAYOUT_DIMENSIONS if d.name != "gas")


def _features(layout: ParallelLayout) -> list[float]:
    """The residual field's coordinates, with micro-batches in flight in place of gas."""
    return features(layout, gas=min(layout.gas, layout.pp))
