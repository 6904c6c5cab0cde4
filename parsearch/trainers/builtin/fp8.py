"""FP8 linear layers for the built-in trainer (``precision: fp8``) through torchao's float8
training (``torchao.float8.convert_to_float8_training``: tensorwise dynamic scaling), the
library torchtitan's float8 converter uses. torchao is an optional extra (``pip install
parsearch[fp8]``), imported only when a layout asks for FP8. FP8 matmuls (``torch._scaled_mm``)
need a CUDA device of compute capability 8.9 or above (Ada, Hopper); elsewhere the trial is
infeasible, not an error: the layout cannot run on this machine, the trainer is fine."""

from __future__ import annotations

import importlib.util

import torch
from torch import nn

# torch._scaled_mm's FP8 kernels: sm_89 (Ada) and above.
FP8_CAPABILITY = (8, 9)


def fp8_unsupported(device: torch.device) -> str:
    """Why this rank cannot train in FP8 ("" where it can)."""
    if device.type != "cuda":
        return (
            f"precision fp8 needs a CUDA GPU with FP8 tensor cores (compute capability >= "
            f"{FP8_CAPABILITY[0]}.{FP8_CAPABILITY[1]}, e.g. H100); this trial runs on {device.type}"
        )
    capability = torch.cuda.get_device_capability(device)
    if capability < FP8_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        return (
            f"precision fp8 needs compute capability >= 8.9; {name} has "
            f"{capability[0]}.{capability[1]}"
        )
    if importlib.util.find_spec("torchao") is None:
        return "precision fp8 needs torchao (pip install 'parsearch[fp8]')"
    return ""


def to_float8(module: nn.Module) -> None:
    """Swap ``module``'s linear layers for torchao's Float8Linear, in place, before it is
    parallelised (as torchtitan converts); the output layer stays in 16 bits, as the estimate
    and torchtitan's ``filter_fqns = ["output"]`` keep it."""
    from torchao.float8 import convert_to_float8_training

    convert_to_float8_training(module, module_filter_fn=lambda _, fqn: "output" not in fqn)
