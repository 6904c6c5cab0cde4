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
    "results",
]


def __getattr__(name: str) -> Any:
    """``parsearch.results`` (a campaign's trials as a DataFrame) loads pandas on first use."""
    if name == "results":
        from parsearch.query import results

        return results
    raise AttributeError(f"module 'parsearch' has no attribute {name!r}")
