"""Analytic estimate: parameters, FLOPs, memory per rank and step time of a layout.

Used to prune layouts that cannot fit before anything runs, to seed the search with the most
promising ones, and by the ``simulate`` backend. Pure Python, no torch.
"""

from parsearch.estimate.flops import flops_breakdown, flops_per_step, param_count
from parsearch.estimate.memory import (
    EstimateSettings,
    MemoryEstimate,
    activation_bytes_per_layer,
    memory_by_stage,
    memory_per_rank,
)
from parsearch.estimate.timing import Prediction, predict

__all__ = [
    "EstimateSettings",
    "MemoryEstimate",
    "Prediction",
    "activation_bytes_per_layer",
    "flops_breakdown",
    "flops_per_step",
    "memory_by_stage",
    "memory_per_rank",
    "param_count",
    "predict",
]
