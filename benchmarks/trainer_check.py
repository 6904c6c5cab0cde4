"""The command trainers users run, on this machine's device: a short campaign each of the
Hugging Face Trainer and DeepSpeed examples (``search_spaces/examples/``), one layout that
fits and one that must run out of memory (issue 36, item 3).

This is what a GPU has to show that published logs cannot: what those programs print on
this device goes through the regex parsers, the agent's memory measurement (NVML on an
NVIDIA GPU, the resident set on CPU) and the failure classes, and each case must end in the
state a person would give it (``ok`` / ``oom``). On a GPU the model is GPT-2 small's shape
(Radford et al. 2019: 12 layers, hidden 768, 12 heads, 1024 tokens) and the layout out of
memory is the smallest micro-batch the estimate puts above twice the device memory, so the
out-of-memory line is the device's own (``torch.OutOfMemoryError`` inside torchrun's
``ChildFailedError``). On CPU (``--tiny``, the test) the examples' own tiny GPT runs on one
process and the out-of-memory case is a CPU rehearsal's memory wall (``memory_cap`` below
what one process holds), which exercises the same path up to the classifier.

Used by ``benchmarks/gpu_check.py``; each case is one ``parsearch run`` of budget 1.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from parsearch.space import load_space
from parsearch.store import open_store

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "search_spaces" / "examples"
TRAINER_EXAMPLES = {
    "hf-trainer": "hf-trainer/hf-trainer-gpt2-cpu.yaml",
    "deepspeed": "deepspeed/deepspeed-zero-cpu.yaml",
}
GPT2_SMALL = {
    "num_layers": 12,
    "hidden_size": 768,
    "num_heads": 12,
    "vocab_size": 50304,
    "seq_length": 1024,
}
FITS_MBS_GPU = 4
OOM_MBS_CANDIDATES = (64, 128, 256, 512, 1024, 2048, 4096)
# Stored figures a case reports: the parsed ones and the agent's own memory measures.
FIGURES = (
    "step_time_s",
    "tokens_per_s",
    "tflops_per_device",
    "mfu",
    "peak_mem_bytes",
    "reported_peak_mem_bytes",
    "measured_peak_device_bytes",
    "measured_peak_rss_bytes",
)


def example_document(example: str, device: dict[str, Any], tiny: bool) -> dict[str, Any]:
    """The example's space on one device of this machine, searching one micro-batch size."""
    data = yaml.safe_load((EXAMPLES / TRAINER_EXAMPLES[example]).read_text())
    data["name"] = f"trainer-check-{example}"
    data.pop("exclude", None)  # its rules name pipeline sizes this check does not search
    searched = data["search"]
    data["search"] = {"tp": 1, "pp": 1, "gas": 1, "mbs": 1}
    if "zero_stage" in searched:
        data["search"]["zero_stage"] = 0  # dp 1: nothing for ZeRO to shard over
    trainer = data["trainer"]
    trainer["vars"]["python"] = sys.executable
    trainer["vars"]["device"] = "cpu" if tiny else "cuda"
    trainer["steps"] = 6  # DeepSpeed prints its throughput from the third step on
    trainer["timeout"] = 300 if tiny else 180
    data["allocation"]["devices_per_node"] = 1
    if not tiny:
        data["model"] = {**data["model"], "name": "gpt2-small", **GPT2_SMALL}
        data["allocation"].update(
            device="cuda",
            device_memory=f"{device['memory_bytes']}B",
            peak_tflops=(device["peak_flops"] or 312e12) / 1e12,
        )
        data["estimate"] = {"precision": "bf16" if example == "hf-trainer" else "fp32"}
    return data


def out_of_memory_mbs(document: dict[str, Any], memory_bytes: int, scratch: Path) -> int:
    """The smallest candidate micro-batch whose predicted memory is above twice the
    device's: far enough over that the device must refuse it whatever the estimate's error."""
    probe = {**document, "search": {**document["search"], "mbs": list(OOM_MBS_CANDIDATES)}}
    path = scratch / "oom-probe.yaml"
    path.write_text(yaml.safe_dump(probe, sort_keys=False))
    plan = load_space(path).plan()
    predicted = sorted([*plan.feasible, *plan.predicted_oom], key=lambda item: item[0].mbs)
    over = [layout.mbs for layout, p in predicted if p.memory.total > 2 * memory_bytes]
    return over[0] if over else OOM_MBS_CANDIDATES[-1]


def cases(device: dict[str, Any], tiny: bool, scratch: Path) -> list[dict[str, Any]]:
    """Each (trainer, case) with its space document and the state it must end in."""
    out = []
    for example in TRAINER_EXAMPLES:
        fits = example_document(example, device, tiny)
        oom = example_document(example, device, tiny)
        if tiny:
            oom["memory_cap"] = "1MiB"  # below any process: the CPU rehearsal's memory wall
        else:
            fits["search"]["mbs"] = FITS_MBS_GPU
            oom["search"]["mbs"] = out_of_memory_mbs(oom, device["memory_bytes"], scratch)
        out.append({"trainer": example, "case": "fits", "expected": "ok", "document": fits})
        out.append(
            {"trainer": example, "case": "out of memory", "expected": "oom", "document": oom}
        )
    return out


def run_case(case: dict[str, Any], scratch: Path, timeout_s: float) -> dict[str, Any]:
    """One ``parsearch run`` of budget 1 for the case; what the store holds of its trial."""
    name = f"{case['trainer']}-{case['case'].replace(' ', '-')}"
    space_path = scratch / f"{name}.yaml"
    space_path.write_text(yaml.safe_dump(case["document"], sort_keys=False))
    store = scratch / f"{name}.db"
    command = [
        sys.executable, "-m", "parsearch", "run", str(space_path), "--store", str(store),
        "--budget", "1", "--quiet", "--keep-predicted-oom",
        "--backend-opt", f"workdir={scratch / name}",
    ]  # fmt: skip
    row: dict[str, Any] = {key: case[key] for key in ("trainer", "case", "expected")}
    began = time.monotonic()
    try:
        # From the repository root: the examples' scripts are relative to {launch_dir}.
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {**row, "state": "not finished", "error": f"parsearch run over {timeout_s:.0f} s"}
    row["wall_s"] = round(time.monotonic() - began, 1)
    if not store.exists():
        return {**row, "state": "not run", "error": done.stderr[-2000:]}
    with open_store(store, readonly=True) as opened:
        trials = opened.trials(opened.get_campaign().id)
    if not trials:
        return {**row, "state": "not run", "error": done.stderr[-2000:]}
    (trial,) = trials
    row.update(
        layout=" ".join(f"{key}{trial.config[key]}" for key in ("tp", "pp", "mbs", "gas")),
        state=trial.state.value,
        figures={key: trial.metrics[key] for key in FIGURES if key in trial.metrics},
        error=trial.error or "",
    )
    return row


def run_trainer_checks(
    device: dict[str, Any], tiny: bool, scratch: Path, budget_s: float
) -> list[dict[str, Any]]:
    """Every case in turn; a case not started within ``budget_s`` is reported as such."""
    scratch.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    rows = []
    for case in cases(device, tiny, scratch):
        left = budget_s - (time.monotonic() - began)
        if left < 30:
            row = {key: case[key] for key in ("trainer", "case", "expected")}
            rows.append({**row, "state": "not run", "error": "the check's budget was spent"})
            continue
        rows.append(run_case(case, scratch, timeout_s=left))
    return rows


def print_trainer_table(rows: list[dict[str, Any]]) -> None:
    print(
        "| trainer | case | layout | state (expected) | tokens/s | peak GiB (NVML / RSS) | error |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        figures = row.get("figures") or {}
        measured = figures.get("measured_peak_device_bytes") or figures.get(
            "measured_peak_rss_bytes"
        )
        peak = f"{measured / 2**30:.2f}" if measured else "-"
        tokens = figures.get("tokens_per_s")
        mark = "" if row["state"] == row["expected"] else " MISMATCH"
        print(
            f"| {row['trainer']} | {row['case']} | {row.get('layout', '-')} "
            f"| {row['state']} ({row['expected']}){mark} "
            f"| {f'{tokens:.4g}' if tokens else '-'} | {peak} "
            f"| {(row.get('error') or '')[:160]} |"
        )
