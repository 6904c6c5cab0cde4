"""parsearch: search the parallel layout (TP x PP x DP x micro-batch) that trains a model fastest.

Importing the package stays light: torch, DeepHyper, mpi4py and Ray are imported by the
modules that need them, when they are needed.
"""

from parsearch.config import AllocationSpec, ModelSpec, ParallelLayout
from parsearch.errors import ParsearchError

__all__ = ["AllocationSpec", "ModelSpec", "ParallelLayout", "ParsearchError"]
__version__ = "0.1.0"
