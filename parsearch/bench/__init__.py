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


def run_trial(spec: TrialSpec, trial_dir: Path | None = None, prefork: bool = True) -> TrialResult:
    """Run ``spec`` on this machine (all its ranks, via :func:`parsearch.agent.run_local`).

    ``trial_dir`` keeps the spec, result and per-rank logs; without it they live in a
    temporary directory and only the result (with a log tail on failure) remains. With
    ``prefork`` the ranks are forked from a server that has imported torch already
    (:mod:`parsearch.bench.prefork`), else started as new programs.
    """
    from parsearch.agent import run_local

    return run_local(spec, trial_dir, prefork=prefork)


__all__ = ["run_trial"]
