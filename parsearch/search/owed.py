"""Layouts a campaign owes a trial: those it first believed best, unless a twin rules them out.

A search that believes a layout is among the best few and fits, and never tries it, has let
its calibration or its proposals wander away from its own beliefs (issue 39: on a Frontier
landscape the optimum, 7th of 477 by the estimate and predicted to fit with room, was never
run in 60 trials: the calibrated ranking had moved it down and DeepHyper never proposed it).
The rule kept here: each of the :data:`OWED_TOP` layouts the search believes best before its
first trial is tried within the budget, unless the measurement of a close twin rules it out.
What it believes then is the uncalibrated estimate, or the estimate a warm start calibrated:
a layout is believed to run when both expect it to fit and its steps are expected to finish
within the trial timeout. The debt is at most half the budget (:func:`owed_count`): a
six-trial campaign owes its three best, and keeps the rest for the search's own picks.
(A first version owed the uncalibrated top ten whatever the budget and whatever the warm
start knew: a warm-started 1T campaign of six trials ran three layouts its warm start had
seen run out of memory, and a four-trial campaign whose ten best layouts all time out
measured nothing.)

**Twin.** A measured layout that differs from it in exactly one searched dimension, by one
step of that dimension's candidates (mbs 2 for mbs 1 or 4, gas 32 for 64, pp 2 for 3 in
``[1, 2, 3, 4]``; a tp or pp step changes the derived dp with it), everything else equal.

**Rules out.** A twin rules a layout out when either

* it ran out of memory (or timed out) and the layout is predicted to need at least as much
  memory per rank as the twin (the estimate's memory is monotone along one step far more
  reliably than it is right in absolute terms): it would fail the same way;
* it ran, and its measured objective scaled by the estimate's ratio between the two (the
  layout's predicted objective over the twin's) is below :data:`SLOWER_SHARE` of the best
  objective measured so far: even if the estimate is right about the step between them,
  the layout cannot get close to the best.

Nothing else rules a layout out: not the calibrated memory's verdict nor the calibrated
ranking, which are inference, not measurement.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from parsearch.config import ParallelLayout
from parsearch.estimate import Prediction
from parsearch.result import TrialState
from parsearch.space import SearchSpace

# How many of the layouts believed best before the first trial a campaign owes a trial.
OWED_TOP = 10
# A twin that ran rules a layout out when its measurement, carried over by the estimate's
# ratio, reaches less than this share of the best measured objective.
SLOWER_SHARE = 0.9


def owed_count(budget: int) -> int:
    """How many of the believed best layouts a campaign of ``budget`` trials owes a trial."""
    return max(0, min(OWED_TOP, budget // 2))


@dataclass(frozen=True)
class Measured:
    """What a finished trial says of its layout: its state, and its objective if it ran."""

    layout: ParallelLayout
    state: TrialState
    objective: float | None = None


def step_apart(space: SearchSpace, a: ParallelLayout, b: ParallelLayout) -> bool:
    """Whether ``a`` and ``b`` differ in exactly one searched dimension, by one step of its
    candidates, and in nothing else but what that dimension derives (dp, or gas when the
    global batch is fixed)."""
    if a.key() == b.key():
        return False
    first, second = a.to_dict(), b.to_dict()
    differing = [name for name in space.searched if first.get(name) != second.get(name)]
    if len(differing) != 1:
        return False
    name = differing[0]
    values = list(space.searched[name])
    try:
        step = abs(values.index(first[name]) - values.index(second[name]))
    except ValueError:
        return False
    if step != 1:
        return False
    derived = {"dp"} | ({"gas"} if "gas" not in space.dimensions else set())
    others = set(first) - derived - {name}
    return all(first[other] == second[other] for other in others)


def ruled_out_by(
    space: SearchSpace,
    layout: ParallelLayout,
    prediction: Prediction,
    twin: Measured,
    twin_prediction: Prediction,
    best: float,
) -> bool:
    """Whether the measurement of ``twin`` (a layout one step from ``layout``) rules
    ``layout`` out, given the best objective measured so far (see the module's rule)."""
    if not step_apart(space, layout, twin.layout):
        return False
    if twin.state in (TrialState.OOM, TrialState.TIMEOUT):
        return prediction.peak_mem_bytes >= twin_prediction.peak_mem_bytes
    if twin.state is not TrialState.OK or twin.objective is None or best <= 0:
        return False
    predicted = float(getattr(prediction, space.objective))
    twin_predicted = float(getattr(twin_prediction, space.objective))
    if twin_predicted <= 0:
        return False
    return twin.objective * predicted / twin_predicted < SLOWER_SHARE * best


def owed(
    space: SearchSpace,
    top: Sequence[tuple[ParallelLayout, Prediction]],
    measured: Sequence[Measured],
    predictions: Mapping[str, Prediction],
    tried: set[str],
) -> list[tuple[int, ParallelLayout]]:
    """The layouts of ``top`` (those believed best before the first trial, best first)
    still owed a trial, with their rank (1 = best): not in ``tried`` (layout keys) and
    ruled out by no twin in ``measured``; ``predictions`` holds the twins' predictions by
    key (a twin without one rules nothing out)."""
    ok = [m.objective for m in measured if m.state is TrialState.OK and m.objective is not None]
    best = max(ok, default=0.0)
    result = []
    for rank, (layout, prediction) in enumerate(top, start=1):
        if layout.key() in tried:
            continue
        if any(
            m.layout.key() in predictions
            and ruled_out_by(space, layout, prediction, m, predictions[m.layout.key()], best)
            for m in measured
        ):
            continue
        result.append((rank, layout))
    return result
