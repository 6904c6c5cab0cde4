"""The analytic estimate, corrected online by what finished trials measured.

The estimate is good at ranking layouts and at telling which cannot fit, but a real machine
is never exactly its hardware description: the runtime and allocator take more (or less)
memory than modelled, small matrix multiplies run slower, the network is slower than its
data sheet. The best layouts sit right at the memory wall, so an estimate 10-20% off in
memory either prunes the true optimum (too pessimistic) or launches trial after trial that
runs out of memory (too optimistic). Two small models fix that from the trials themselves:

* :class:`MemoryCalibration`: measured peak ≈ ``a·predicted + b`` (a robust fit; a ratio
  while the measurements span too narrow a range to separate ``a`` from ``b``); an
  out-of-memory trial at ``predicted = q`` says the true peak at ``q`` exceeds the wall, a
  lower bound; :class:`~parsearch.search.local_memory.LocalMemory` corrects the fit
  where the machine is not affine in the estimate, from the nearest measured layouts.
* :class:`StepTimeCalibration`: the predicted step time is a sum of parts (ideal compute,
  the small-GEMM penalty, tensor-parallel all-reduces, pipeline transfers, exposed
  data-parallel reduction; the bubble shared out among the first three); a measured step
  time re-weights the parts, ``t ≈ Σ w_k·part_k``, fitted in log space with a prior that
  keeps each weight near 1 until measurements say otherwise.

:class:`CalibratedEstimate` applies both to every layout that divides, so that a campaign
can re-rank and re-prune its candidates after each trial.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from parsearch.config import ParallelLayout
from parsearch.estimate import Prediction
from parsearch.estimate.timing import gemm_efficiency
from parsearch.search.candidates import Candidate
from parsearch.search.local_memory import MAX_MARGIN, MIN_SPREAD, PRIOR_SPREAD, LocalMemory
from parsearch.space import SearchSpace

STEP_PARTS: tuple[str, ...] = ("compute", "small_gemm", "tp_comm", "p2p", "dp_comm")


@dataclass(frozen=True)
class MemoryFit:
    """``calibrated(p) = lift·(slope·p + offset)``, usable up to ``limit·(1 - margin)``
    (a negative margin: beyond the limit, within a transferred fit's uncertainty)."""

    slope: float = 1.0
    offset_bytes: float = 0.0
    lift: float = 1.0
    margin: float = 0.0

    def peak(self, predicted: np.ndarray | float) -> np.ndarray | float:
        return self.lift * (self.slope * predicted + self.offset_bytes)


class MemoryCalibration:
    """Measured peak memory against the estimate's, fitted as measurements come in.

    Fit rules, each for a reason:

    * no measurement: the estimate as it is (slope 1, no margin), so an uncalibrated
      campaign prunes exactly what the space's estimate prunes;
    * measurements spanning less than ``affine_span`` of their largest prediction: a ratio
      (weighted median of measured/predicted); two points close together would make an
      affine fit's slope anything;
    * otherwise an affine fit by iteratively re-weighted least squares with Huber weights,
      so one odd measurement (a trainer that logged another rank's peak) barely moves it;
      a slope outside ``[0.25, 4]`` is not believed and the ratio is used instead;
    * every out-of-memory trial at prediction ``q`` needs more than the largest measured
      peak that fitted (the wall is at least there; where exactly, below the declared
      limit, is not assumed); when the fit says otherwise it is lifted by the smallest
      factor that makes it so; and nothing calibrated to need as much as ``q`` (within
      the margin) is expected to fit;
    * the margin: the fit's robust relative spread (2.5 sigma), and at least
      ``first_margin / (weight of measurements)``, a caution that fades as measurements
      agree with each other: the best layouts sit within a per cent or two of the wall.
      It never exceeds :data:`~parsearch.search.local_memory.MAX_MARGIN`: a fit that
      spreads more is the wrong shape, which local evidence corrects, not a margin;
    * measurements transferred from another campaign (a warm start) and none of this
      campaign's own yet: the margin is ``-transfer_margin``, the transferred fit's own
      uncertainty (:func:`~parsearch.search.warm_start.transfer_margin`, growing with how
      far the source is from this campaign). A layout is then pruned only when it is out
      of memory even at the optimistic end of that uncertainty: pruning is final, while
      an out-of-memory trial is one trial that teaches the calibration this campaign's own
      wall (the first own measurement ends the transferred band).
    """

    def __init__(
        self,
        limit_bytes: float,
        *,
        affine_span: float = 0.2,
        first_margin: float = 0.03,
    ):
        self.limit_bytes = float(limit_bytes)
        self.affine_span = affine_span
        self.first_margin = first_margin
        self._peaks: list[tuple[float, float, float]] = []
        self._ooms: list[tuple[float, float]] = []
        self._own = 0  # this campaign's own measurements (peaks and out-of-memory trials)
        self.transfer_margin = 0.0
        self._fit: MemoryFit | None = MemoryFit()

    def add_peak(
        self, predicted: float, measured: float, weight: float = 1.0, *, transferred: bool = False
    ) -> None:
        """A trial predicted to need ``predicted`` bytes peaked at ``measured`` (in another
        campaign: ``transferred``)."""
        if predicted > 0 and measured > 0 and weight > 0:
            self._peaks.append((float(predicted), float(measured), float(weight)))
            self._own += not transferred
            self._fit = None

    def add_oom(
        self, predicted: float, limit_bytes: float | None = None, *, transferred: bool = False
    ) -> None:
        """A trial predicted to need ``predicted`` bytes ran out of ``limit_bytes``."""
        if predicted > 0:
            limit = self.limit_bytes if limit_bytes is None else float(limit_bytes)
            self._ooms.append((float(predicted), limit))
            self._own += not transferred
            self._fit = None

    def transferred(self, margin: float) -> None:
        """The measurements added so far come from another campaign, whose fit is this
        uncertain here (a relative ``margin``); see the class docstring."""
        self.transfer_margin = float(margin)
        self._fit = None

    @property
    def measurements(self) -> int:
        return len(self._peaks)

    @property
    def fit(self) -> MemoryFit:
        if self._fit is None:
            self._fit = self._refit()
        return self._fit

    def peak(self, predicted: np.ndarray | float) -> np.ndarray | float:
        """Calibrated peak bytes for the estimate's ``predicted`` bytes."""
        return self.fit.peak(predicted)

    def fits(self, predicted: np.ndarray) -> np.ndarray:
        """Which predictions the calibration expects to fit, margin included: below the
        limit, and below every out-of-memory trial's calibrated peak."""
        fit = self.fit
        peak = fit.peak(predicted)
        fits = peak <= self.limit_bytes * (1.0 - fit.margin)
        if self._ooms:
            failed = min(predicted for predicted, _ in self._ooms)
            fits &= peak < fit.peak(failed) * (1.0 - fit.margin)
        return fits

    def _refit(self) -> MemoryFit:
        if not self._peaks:
            return self._lifted(MemoryFit())
        p, m, w = (np.array(column) for column in zip(*self._peaks, strict=True))
        slope, offset = _ratio(p, m, w), 0.0
        if p.max() - p.min() >= self.affine_span * p.max():
            affine = _huber_line(p, m, w)
            if 0.25 <= affine[0] <= 4.0:
                slope, offset = affine
        relative = (m - (slope * p + offset)) / m
        spread = 2.5 * 1.4826 * _weighted_median(np.abs(relative), w)
        margin = min(max(spread, self.first_margin / w.sum()), MAX_MARGIN)
        if self._own == 0 and self.transfer_margin > 0:
            margin = -self.transfer_margin
        return self._lifted(MemoryFit(slope, offset, 1.0, margin))

    def _lifted(self, fit: MemoryFit) -> MemoryFit:
        """Lift the fit so each out-of-memory trial needs more than the largest peak that
        fitted: the wall lies at least that high. Where between that and the declared
        limit it lies (what the runtime keeps for itself) is not assumed."""
        if not self._peaks:
            return fit
        fitted = max(measured for _, measured, _ in self._peaks)
        lift = 1.0
        for predicted, limit in self._ooms:
            expected = fit.slope * predicted + fit.offset_bytes
            if expected > 0:
                lift = max(lift, min(fitted, limit) * 1.001 / expected)
        return MemoryFit(fit.slope, fit.offset_bytes, lift, fit.margin)


def _weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    order = np.argsort(values)
    cumulative = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cumulative, 0.5 * cumulative[-1])])


def _ratio(predicted: np.ndarray, measured: np.ndarray, weights: np.ndarray) -> float:
    return _weighted_median(measured / predicted, weights)


def _huber_line(
    x: np.ndarray, y: np.ndarray, weights: np.ndarray, iterations: int = 20
) -> tuple[float, float]:
    """``y ≈ a·x + b`` by IRLS with Huber weights (threshold 1.345 robust sigmas)."""
    design = np.column_stack([x, np.ones_like(x)])
    robust = np.ones_like(x)
    coef = np.zeros(2)
    for _ in range(iterations):
        sw = np.sqrt(weights * robust)
        coef = np.linalg.lstsq(design * sw[:, None], y * sw, rcond=None)[0]
        residual = y - design @ coef
        scale = 1.4826 * _weighted_median(np.abs(residual), weights)
        if scale <= 1e-9 * np.abs(y).max():
            break
        threshold = 1.345 * scale
        new = np.minimum(1.0, threshold / np.maximum(np.abs(residual), 1e-300))
        if np.allclose(new, robust):
            break
        robust = new
    return float(coef[0]), float(coef[1])


def step_parts(space: SearchSpace, layout: ParallelLayout, prediction: Prediction) -> np.ndarray:
    """The predicted step time split into :data:`STEP_PARTS` (they sum to it).

    The pipeline bubble idles a stage for whole slots of compute and tensor-parallel
    communication, so it is shared out between those parts rather than kept apart: a slower
    compute then also means a longer bubble, as on a real machine.
    """
    # The ring attention's exposed K/V exchange sits in every slot like the tensor-parallel
    # collectives, on the same model-parallel links: one part with them (zero at cp 1).
    model_comm = prediction.tp_comm_s + prediction.cp_comm_s
    busy = prediction.compute_s + model_comm
    stretch = 1.0 + (prediction.bubble_s / busy if busy > 0 else 0.0)
    ideal_share = gemm_efficiency(space.model, layout, space.estimate) / (
        space.estimate.compute_efficiency
    )
    compute = prediction.compute_s * stretch
    return np.array(
        [
            compute * ideal_share,
            compute * (1.0 - ideal_share),
            model_comm * stretch,
            prediction.p2p_s,
            prediction.dp_comm_s,
        ]
    )


class StepTimeCalibration:
    """Weights of the step-time parts, fitted to measured step times.

    ``log t_i ≈ log Σ_k w_k·part_ik`` with Gaussian noise ``noise`` (relative) and a prior
    ``log w_k ~ N(0, prior²)``: with few measurements the weights stay near 1 and move
    together (a uniformly slower machine changes no ranking), and a part is re-weighted
    only once layouts that differ in it have been measured. A trial that timed out is a
    censored measurement (its step took *at least* so long): it pulls the fit up only
    while the fit predicts it faster than that, so one unlucky trial near the timeout does
    not condemn every layout about as slow.
    """

    def __init__(self, *, noise: float = 0.05, prior: float = 0.7):
        self.noise = noise
        self.prior = prior
        self._parts: list[np.ndarray] = []
        self._times: list[float] = []
        self._weights: list[float] = []
        self._censored: list[bool] = []
        self._fitted: np.ndarray | None = np.ones(len(STEP_PARTS))

    def add(
        self, parts: np.ndarray, step_s: float, weight: float = 1.0, *, at_least: bool = False
    ) -> None:
        """A layout with these parts measured ``step_s`` per step (or more: ``at_least``)."""
        if step_s > 0 and weight > 0 and parts.sum() > 0:
            self._parts.append(np.asarray(parts, dtype=float))
            self._times.append(float(step_s))
            self._weights.append(float(weight))
            self._censored.append(at_least)
            self._fitted = None

    @property
    def weights(self) -> np.ndarray:
        if self._fitted is None:
            self._fitted = self._refit()
        return self._fitted

    def step_time(self, parts: np.ndarray) -> np.ndarray:
        """Calibrated step times of rows of parts."""
        return parts @ self.weights

    def _refit(self, iterations: int = 30) -> np.ndarray:
        """Levenberg-Marquardt on ``theta = log w`` (five unknowns: closed-form steps)."""
        parts = np.array(self._parts)
        target = np.log(np.array(self._times))
        sw = np.sqrt(np.array(self._weights)) / self.noise
        censored = np.array(self._censored)
        theta = np.zeros(parts.shape[1])
        damping = 1e-3

        def data_residuals(theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            error = np.log(parts @ np.exp(theta)) - target
            active = ~censored | (error < 0)  # a lower bound binds only when violated
            return sw * np.where(active, error, 0.0), active

        def residuals(theta: np.ndarray) -> np.ndarray:
            return np.concatenate([data_residuals(theta)[0], theta / self.prior])

        current = residuals(theta)
        for _ in range(iterations):
            active = data_residuals(theta)[1]
            scaled = parts * np.exp(theta)
            jacobian = np.vstack(
                [
                    (sw * active)[:, None] * scaled / scaled.sum(axis=1, keepdims=True),
                    np.eye(len(theta)) / self.prior,
                ]
            )
            normal = jacobian.T @ jacobian
            gradient = jacobian.T @ current
            step = np.linalg.solve(normal + damping * np.diag(np.diag(normal)), -gradient)
            trial = residuals(theta + step)
            if trial @ trial < current @ current:
                theta, current = theta + step, trial
                damping = max(damping / 3, 1e-9)
                if np.abs(step).max() < 1e-6:
                    break
            else:
                damping *= 10
        return np.exp(theta)


class CalibratedEstimate:
    """Every layout that divides, with the estimate's prediction corrected by measurements.

    ``fits()``, ``in_time()`` and ``objective()`` are arrays over :attr:`items`, recomputed
    from the current calibrations; the ``measured_*`` methods, :meth:`out_of_memory` and
    :meth:`timed_out` feed them. A layout outside :attr:`items` (a repeat told on resume
    from an older space) is ignored.
    """

    def __init__(self, space: SearchSpace, items: Sequence[Candidate]):
        self.space = space
        self.items = list(items)
        self.index = {c.layout.key(): i for i, c in enumerate(self.items)}
        self.predicted_mem = np.array([c.prediction.memory.total for c in self.items])
        self.predicted_objective = np.array(
            [getattr(c.prediction, space.objective) for c in self.items]
        )
        self.parts = np.array([step_parts(space, c.layout, c.prediction) for c in self.items])
        self.predicted_step = np.array([c.prediction.step_time_s for c in self.items])
        self.memory = MemoryCalibration(space.memory_limit_bytes)
        self.local = LocalMemory([c.layout for c in self.items], self.predicted_mem)
        self.step = StepTimeCalibration()
        self.timeout_s, self.timed_steps = space.trial_timeout_s, space.timed_steps

    def fits(self) -> np.ndarray:
        """Which items the calibrated memory estimate expects to fit: the global fit,
        corrected by the measurements nearest each item and overruled by its twins'
        (:class:`~parsearch.search.local_memory.LocalMemory`)."""
        peak, margin = self.local.calibrated(self.memory.peak(self.predicted_mem))
        # The global fit's margin counts transferred measurements (a warm start) too.
        margin = self.memory.fit.margin if margin is None else min(margin, self.memory.fit.margin)
        return self.local.fits(peak, self.memory.limit_bytes, margin)

    def fit_probability(self) -> np.ndarray:
        """How likely each item is to fit (:meth:`LocalMemory.fit_probability`): the
        calibrated peak's error is the margin's sigma (a margin is 2.5 of them), at least
        :data:`~parsearch.search.local_memory.MIN_SPREAD`; before any peak is measured,
        the estimate's own :data:`~parsearch.search.local_memory.PRIOR_SPREAD`."""
        peak, margin = self.local.calibrated(self.memory.peak(self.predicted_mem))
        if margin is None:
            spread = PRIOR_SPREAD
        else:
            spread = max(min(margin, self.memory.fit.margin) / 2.5, MIN_SPREAD)
        return self.local.fit_probability(peak, self.memory.limit_bytes, spread)

    def in_time(self) -> np.ndarray:
        """Which items' calibrated steps finish within the trial timeout."""
        return self.step.step_time(self.parts) * self.timed_steps <= self.timeout_s

    def objective(self) -> np.ndarray:
        """The predicted objective scaled by predicted over calibrated step time (tokens/s,
        TFLOP/s and MFU are all inversely proportional to the step time of a layout)."""
        return self.predicted_objective * self.predicted_step / self.step.step_time(self.parts)

    def measured_objective(self, layout: ParallelLayout, objective: float) -> None:
        """A trial of ``layout`` reached ``objective``: it fitted in memory, and ran at a
        measured step time, relative to the predicted one."""
        i = self.index.get(layout.key())
        if i is not None and objective > 0:
            self.local.add_ran(i)
            step = self.predicted_step[i] * self.predicted_objective[i] / objective
            self.step.add(self.parts[i], step)

    def measured_peak(self, layout: ParallelLayout, peak_bytes: float) -> None:
        i = self.index.get(layout.key())
        if i is not None:
            self.memory.add_peak(self.predicted_mem[i], peak_bytes)
            self.local.add_peak(i, peak_bytes)

    def out_of_memory(self, layout: ParallelLayout) -> None:
        i = self.index.get(layout.key())
        if i is not None:
            self.memory.add_oom(self.predicted_mem[i])
            self.local.add_oom(i)

    def timed_out(self, layout: ParallelLayout) -> None:
        """A trial of ``layout`` ran out of time: its steps took at least the timeout."""
        i = self.index.get(layout.key())
        if i is not None:
            self.step.add(self.parts[i], self.timeout_s / self.timed_steps, at_least=True)
