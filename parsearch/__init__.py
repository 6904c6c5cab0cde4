"""parsearch: search the parallel layout (TP x PP x DP x micro-batch) that trains a model fastest.

Importing the package stays light: torch, DeepHyper, mpi4py and Ray are imported by the
modules that need them, when they are needed.
"""

from typing import Any

from parsearch.config import AllocationSpec, ModelSpec, ParallelLayout
from parsearch.errors import ParsearchError
from parsearch.version import __version__

__all__ = [
    "AllocationSpec",
    "ModelSpec",
    "ParallelLayout",
    "ParsearchError",
    "__version__",
    "load_space",
    "results",
    "run_campaign",
]


def __getattr__(name: str) -> Any:
    """``results`` (a campaign's trials as a DataFrame), ``run_campaign`` (a campaign on a
    backend object) and ``load_space`` load what they need on first use."""
    if name == "results":
        from parsearch.query import results

        return results
    if name == "run_campaign":
        from parsearch.campaign.api import run_campaign

        return run_campaign
    if name == "load_space":
        from parsearch.space import load_space

        return load_space
    raise AttributeError(f"module 'parsearch' has no attribute {name!r}")
