"""The built-in benchmark trainer: a GPT-style model trained for a few steps with torch's own
tensor, pipeline, context (ring attention) and data parallelism, to measure how fast a
layout really is.

``python -m parsearch.trainers.builtin --spec trial.json [--out result.json]`` is one rank;
:func:`run_trial` runs a whole trial on this machine through the node agent. The model, how
each parallelism is applied, the numerics and what a trial reports: docs/guide/trainers.md,
"The built-in trainer".
"""

from __future__ import annotations

from pathlib import Path

from parsearch.launch.placement import NodePlacement
from parsearch.launch.plan import NodePlan
from parsearch.result import TrialResult
from parsearch.trial import TrialSpec


def run_trial(spec: TrialSpec, trial_dir: Path | None = None, prefork: bool = True) -> TrialResult:
    """Run ``spec`` on this machine (all its ranks, via :func:`parsearch.launch.process.run_local`,
    as the built-in trainer kind plans them).

    ``trial_dir`` keeps the spec, result and per-rank logs; without it they live in a
    temporary directory and only the result (with a log tail on failure) remains. With
    ``prefork`` the ranks are forked from a server that has imported torch already
    (:mod:`parsearch.launch.prefork`), else started as new programs.
    """
    from dataclasses import replace

    from parsearch.launch.process import run_local
    from parsearch.trainers.builtin.kind import BuiltinKind

    def plan(placement: NodePlacement) -> NodePlan:
        planned = BuiltinKind().plan(placement)
        return planned if prefork else replace(planned, warm=None)

    return run_local(spec, plan, trial_dir)


__all__ = ["run_trial"]
