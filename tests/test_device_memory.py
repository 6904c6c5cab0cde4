"""The node agent's view of device memory (parsearch.launch.device_memory, NVML): nothing on a
machine without NVIDIA's driver; on one with a GPU, what a rank holds on its device, whatever
the program prints (the GPU test runs only where torch sees CUDA)."""

from __future__ import annotations

import sys

import pytest

from parsearch.config import AllocationSpec, ModelSpec, ParallelLayout
from parsearch.launch.device_memory import DeviceMemory, device_use
from parsearch.launch.placement import NodePlacement
from parsearch.launch.process import free_port
from parsearch.trainers.command.trainer import run_node, validate_section
from parsearch.trial import TrialSpec

GIB = 2**30


def test_without_nvml_nothing_is_measured_and_nothing_fails():
    devices = DeviceMemory()
    if devices.available:
        pytest.skip("this machine has NVML")
    assert devices.by_process() == {}
    assert device_use({1: [1, 2]}) == {}


def test_a_rank_holding_device_memory_is_measured_without_printing_it(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or not DeviceMemory().available:
        pytest.skip("needs an NVIDIA GPU and its driver's NVML")
    program = tmp_path / "hold.py"
    program.write_text(
        "import json, time, torch\n"
        "block = torch.empty(2 * 2**30, dtype=torch.uint8, device='cuda')\n"
        "time.sleep(2)\n"
        "print(json.dumps({'tokens_per_s': 1000.0}))\n"
    )
    trainer = validate_section(
        {"kind": "command", "command": [sys.executable, str(program)], "parser": "json",
         "steps": 2, "warmup_steps": 1, "launch": "single"},
        "test",
    )  # fmt: skip
    model = ModelSpec(num_layers=2, hidden_size=64, num_heads=4, vocab_size=128, seq_length=16)
    allocation = AllocationSpec(1, 1, 80 * GIB, 1e15, device="cuda")
    layout = ParallelLayout(tp=1, pp=1, dp=1, mbs=1, gas=1)
    spec = TrialSpec("t1", model, layout, allocation, trainer, timeout_s=120, memory_cap_bytes=GIB)
    placement = NodePlacement(spec, 0, 1, "127.0.0.1", free_port("127.0.0.1"), tmp_path / "t")
    result = run_node(placement)
    measured = result.metrics["measured_peak_device_bytes"]
    assert 2 * GIB <= measured < 4 * GIB  # the block, plus the CUDA context
    assert result.status.value == "oom" and "exceeds memory_cap 1 GiB" in result.error
