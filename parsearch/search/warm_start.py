"""Warm start: calibrate a new campaign's estimate from another campaign's measurements.

The study tuned GPT-175B with DeepHyper and carried the recipe to 1T on the same machine.
What carries over is not the best layout (the model and the allocation differ) but how the
machine departs from the estimate: how much more memory than predicted a rank really takes,
and which parts of the predicted step time (compute, small GEMMs, tensor-parallel, pipeline,
data-parallel communication) run slower or faster. Every finished trial of the other
campaign is re-predicted under *its own* space, so its measured/predicted ratios are
per-part and per-byte, which is what :mod:`parsearch.search.calibration` fits; the new
campaign's first proposals are then ranked and pruned by a calibrated estimate.

DeepHyper's ``fit_surrogate`` is not used: its surrogate maps layouts to the other model's
throughput, on other dimensions, which says little about a model of another size.

The other campaign's measurements count for at most :data:`TRANSFERRED_WEIGHT` trials of
the new one in all, so the new campaign's own trials take over after a few.

How far the memory fit carries depends on how far the source is from the target
(:func:`distance`: model size, device memory, allocation size, device speed, precision,
framework): a 175B fit says less about 1T than about another 175B allocation. Its
uncertainty, :func:`transfer_margin`, grows with that distance, and until the new campaign
measures memory itself, a layout is pruned only when the transferred fit puts it out of
memory by more than that (a transferred 1% safety margin once pruned a 1T optimum that
needed 99.2% of the device: pruning is final, an out-of-memory trial is one trial).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from parsearch.errors import ParsearchError
from parsearch.estimate.flops import param_count
from parsearch.result import TrialState
from parsearch.search.calibration import CalibratedEstimate, step_parts
from parsearch.search.local_memory import MAX_MARGIN
from parsearch.space import SearchSpace, space_from_dict

if TYPE_CHECKING:
    from parsearch.store import Campaign, TrialRecord

TRANSFERRED_WEIGHT = 3.0
# The transferred memory fit's uncertainty: 1% from a campaign of the same shape, one per
# cent more per unit of :func:`distance` (a doubling of model size, of device memory...).
SAME_SHAPE_MARGIN = 0.01
MARGIN_PER_STEP = 0.01


def distance(source: SearchSpace, target: SearchSpace) -> float:
    """How far ``source``'s measurements are from ``target``'s machine and model, in
    doublings: |log2| of the ratios of parameter count, device memory, devices in the
    allocation and peak FLOP/s per device, plus one for a different precision and one for
    a different framework (what the estimate's memory terms depend on). Zero for the
    same shape; symmetric."""

    def doublings(a: float, b: float) -> float:
        return abs(float(np.log2(a / b)))

    a, b = source.allocation, target.allocation
    return (
        doublings(param_count(source.model), param_count(target.model))
        + doublings(a.device_memory_bytes, b.device_memory_bytes)
        + doublings(a.world_size, b.world_size)
        + doublings(a.peak_flops_per_device, b.peak_flops_per_device)
        + float(source.estimate.precision != target.estimate.precision)
        + float(source.estimate.framework != target.estimate.framework)
    )


def transfer_margin(steps: float) -> float:
    """The relative uncertainty of a memory fit transferred across ``steps`` of
    :func:`distance`: :data:`SAME_SHAPE_MARGIN`, growing by :data:`MARGIN_PER_STEP` a
    step, at most :data:`~parsearch.search.local_memory.MAX_MARGIN`."""
    return min(SAME_SHAPE_MARGIN + MARGIN_PER_STEP * steps, MAX_MARGIN)


class WarmStartError(ParsearchError):
    """The store or campaign to warm-start from cannot be used."""

    exit_code = 2


@dataclass(frozen=True)
class WarmStart:
    """Another campaign's measurements, each against what its own estimate predicted."""

    source: str
    space: SearchSpace
    peaks: list[tuple[float, float]]
    ooms: list[tuple[float, float]]
    steps: list[tuple[np.ndarray, float]]

    def apply(self, estimate: CalibratedEstimate) -> None:
        """Feed the measurements to ``estimate``'s calibrations, down-weighted, with the
        memory fit's uncertainty for a target this far away."""
        if self.peaks:
            weight = min(0.5, TRANSFERRED_WEIGHT / len(self.peaks))
            for predicted, measured in self.peaks:
                estimate.memory.add_peak(predicted, measured, weight, transferred=True)
        for predicted, limit in self.ooms:
            estimate.memory.add_oom(predicted, limit, transferred=True)
        estimate.memory.transferred(transfer_margin(distance(self.space, estimate.space)))
        if self.steps:
            weight = min(0.5, TRANSFERRED_WEIGHT / len(self.steps))
            for parts, measured in self.steps:
                estimate.step.add(parts, measured, weight)


def warm_start_from(campaign: Campaign, trials: Sequence[TrialRecord], where: str) -> WarmStart:
    """What ``campaign``'s ok and out-of-memory ``trials`` (read from the store at ``where``
    by :func:`parsearch.campaign.warm_start.load_warm_start`) teach about the estimate."""
    source = f"campaign '{campaign.name}' in {where}"
    try:
        space = space_from_dict(campaign.space, source=source)
    except ParsearchError as error:
        raise WarmStartError(f"--warm-start {where}: {error}") from None
    metric = campaign.objective_metric
    peaks, ooms, steps = [], [], []
    for trial in trials:
        layout = trial.layout
        if space.violations(layout):
            continue
        prediction = space.predict(layout)
        predicted_mem = prediction.memory.total
        if trial.state is TrialState.OOM:
            ooms.append((predicted_mem, float(space.memory_limit_bytes)))
            continue
        if trial.peak_mem_bytes:
            peaks.append((predicted_mem, float(trial.peak_mem_bytes)))
        if trial.objective:
            measured_step = prediction.step_time_s * getattr(prediction, metric) / trial.objective
            steps.append((step_parts(space, layout, prediction), measured_step))
    if not (peaks or ooms or steps):
        raise WarmStartError(
            f"--warm-start: {source} has no finished trial that measured anything "
            f"(ok or out of memory) to calibrate from"
        )
    return WarmStart(source, space, peaks, ooms, steps)
