"""The built-in benchmark trainer: a GPT-style model trained with torch's own tensor,
pipeline and data parallelism (DTensor, ``torch.distributed.pipelining``, FSDP2).

One trial is a short training run whose ranks the node agent starts as subprocesses
(``python -m parsearch.bench``). Importing this package is light: torch is imported by the
rank processes.
"""

from __future__ import annotations

from pathlib import Path

from parsearch.result import TrialResult
from parsearch.trial import TrialSpec


def run_trial(spec: TrialSpec, trial_dir: Path | None = None) -> TrialResult:
    """Run ``spec`` on this machine (all its ranks, via :func:`parsearch.agent.run_local`).

    ``trial_dir`` keeps the spec, result and per-rank logs; without it they live in a
    temporary directory and only the result (with a log tail on failure) remains.
    """
    from parsearch.agent import run_local

    return run_local(spec, trial_dir)


__all__ = ["run_trial"]
