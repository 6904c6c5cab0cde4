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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from parsearch.errors import ParsearchError
from parsearch.result import TrialState
from parsearch.search.calibration import CalibratedEstimate, step_parts
from parsearch.space import space_from_dict

if TYPE_CHECKING:
    from parsearch.store import Campaign, TrialRecord

TRANSFERRED_WEIGHT = 3.0


class WarmStartError(ParsearchError):
    """The store or campaign to warm-start from cannot be used."""

    exit_code = 2


@dataclass(frozen=True)
class WarmStart:
    """Another campaign's measurements, each against what its own estimate predicted."""

    source: str
    peaks: list[tuple[float, float]]
    ooms: list[tuple[float, float]]
    steps: list[tuple[np.ndarray, float]]

    def apply(self, estimate: CalibratedEstimate) -> None:
        """Feed the measurements to ``estimate``'s calibrations, down-weighted."""
        if self.peaks:
            weight = min(0.5, TRANSFERRED_WEIGHT / len(self.peaks))
            for predicted, measured in self.peaks:
                estimate.memory.add_peak(predicted, measured, weight)
        for predicted, limit in self.ooms:
            estimate.memory.add_oom(predicted, limit)
        if self.steps:
            weight = min(0.5, TRANSFERRED_WEIGHT / len(self.steps))
            for parts, measured in self.steps:
                estimate.step.add(parts, measured, weight)


def warm_start_from(campaign: Campaign, trials: Sequence[TrialRecord], where: str) -> WarmStart:
    """What ``campaign``'s ok and out-of-memory ``trials`` (read from the store at ``where``
    by :func:`parsearch.query.load_warm_start`) teach about the estimate."""
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
    return WarmStart(source, peaks, ooms, steps)
