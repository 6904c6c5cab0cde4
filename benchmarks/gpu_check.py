"""The estimate against this machine's own device: probe it, train a ~1B GPT with the
built-in trainer on the layouts that fit one device, and print measured against predicted
throughput, memory and MFU (issue 31, item 3); then run the command trainers users run, the
Hugging Face Trainer and DeepSpeed examples, one layout that fits and one out of memory each
(benchmarks/trainer_check.py, issue 36 item 3).

Three predictions per layout: the data-sheet defaults, the probed profile (``parsearch
probe`` on this device) and, when the device is one a shipped profile describes (by its
name: A100, H100, H200, MI250X), that published profile's figures. One call stays within
``--budget`` seconds (default 420, so the whole check fits in 8 minutes with the start-up),
of which the trainer campaigns get the last ``--trainer-budget`` (default 180): layouts are
run best-predicted first and no new one starts past their share.

    .venv/bin/python benchmarks/gpu_check.py                 # on a machine with a GPU
    .venv/bin/python benchmarks/gpu_check.py --tiny          # on CPU, a tiny GPT (the test)

Writes ``--out``/gpu_check.json (every figure) and prints a table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from trainer_check import print_trainer_table, run_trainer_checks

from parsearch.commands.trial import run_trial
from parsearch.estimate.profile import with_machine
from parsearch.profiles import load_profile
from parsearch.result import TrialState
from parsearch.space import apply_profile, load_space
from parsearch.trial import TrialSpec

# Dense bf16 peak per device (data sheets), and the shipped profile for it, by device name.
DEVICES = {
    "H200": (989e12, "h200-sxm-hgx"),
    "H100": (989e12, "h100-sxm-dgx"),
    "A100-SXM4-80GB": (312e12, "a100-80gb-dgx"),
    "A100-SXM4-40GB": (312e12, "a100-40gb-perlmutter"),
    "A100": (312e12, "a100-80gb-dgx"),
    "MI250X": (191.5e12, "mi250x-frontier"),
    "MI250": (181e12, "mi250x-frontier"),
}


def device_description() -> dict[str, Any]:
    """The first GPU's name, memory and data-sheet peak; ``None`` figures on CPU."""
    import torch

    if not torch.cuda.is_available():
        return {"name": "cpu", "memory_bytes": None, "peak_flops": None, "profile": None}
    props = torch.cuda.get_device_properties(0)
    peak, profile = next(
        ((p, n) for key, (p, n) in DEVICES.items() if key in props.name), (None, None)
    )
    return {
        "name": props.name,
        "memory_bytes": int(props.total_memory),
        "peak_flops": peak,
        "profile": profile,
    }


def space_document(device: dict[str, Any], tiny: bool) -> dict[str, Any]:
    """One node of one device: a ~1B GPT in bf16 on a GPU, a tiny one in fp32 on CPU."""
    if tiny:
        model = {
            "num_layers": 2,
            "hidden_size": 64,
            "num_heads": 4,
            "vocab_size": 256,
            "seq_length": 64,
        }
        # A core's fp32 peak, as search_spaces/tiny-cpu.yaml states it (one rank alone on a
        # core trains the tiny GPT above 0.05 TFLOP/s).
        allocation = {"device": "cpu", "device_memory": "4GiB", "peak_tflops": 0.25}
        estimate = {"framework": "torch", "precision": "fp32", "dropout": False}
        search = {"mbs": [1, 2], "recompute": ["none", "full"]}
    else:
        # GPT-1.3B's shape (Brown et al. 2020): 24 layers, hidden 2048, 16 heads.
        model = {
            "num_layers": 24,
            "hidden_size": 2048,
            "num_heads": 16,
            "vocab_size": 50304,
            "seq_length": 2048,
        }
        memory = device["memory_bytes"] or 80 * 2**30
        allocation = {
            "device": "cuda",
            "device_memory": f"{memory}B",
            "peak_tflops": (device["peak_flops"] or 312e12) / 1e12,
        }
        estimate = {"framework": "torch", "precision": "bf16", "dropout": False}
        search = {"mbs": [1, 2, 4, 8], "recompute": ["none", "full"]}
    return {
        "name": "gpu-check" if not tiny else "gpu-check-tiny",
        "model": {"name": "gpt-check", "arch": "gpt", **model},
        "allocation": {"name": "this-device", "nodes": 1, "devices_per_node": 1, **allocation},
        "search": {"tp": [1], "pp": [1], "gas": [1], **search},
        "objective": "tokens_per_s",
        "trainer": {"kind": "builtin", "steps": 3, "warmup_steps": 2, "timeout": 180},
        "estimate": estimate,
    }


def probe(space_path: Path, out: Path, timeout_s: float) -> Path | None:
    """``parsearch probe`` on this device; the profile's path, or ``None`` if it failed."""
    command = [
        sys.executable,
        "-m",
        "parsearch",
        "probe",
        str(space_path),
        "--out",
        str(out),
        "--quiet",
        "--timeout",
        f"{timeout_s:g}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s + 60)
    if done.returncode != 0:
        print(f"probe failed ({done.returncode}): {done.stderr[-2000:]}", file=sys.stderr)
        return None
    return out


def predictions(space, shipped: str | None, probed: Path | None) -> dict[str, Any]:
    """The space under each estimate: defaults, the probed profile, the shipped one."""
    estimates = {"defaults": space}
    if probed is not None:
        estimates["probed"] = apply_profile(space, probed)
    if shipped is not None:
        # A shipped profile describes a whole node; its device figures apply to this one.
        profile = load_profile(shipped)
        settings = dataclasses.replace(space.estimate, precision=profile.precision)
        estimates[f"shipped {shipped}"] = dataclasses.replace(
            space, estimate=with_machine(settings, profile, space.allocation)
        )
    return estimates


def spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=values.__getitem__)
        out = [0.0] * len(values)
        for rank, index in enumerate(order):
            out[index] = float(rank)
        return out

    if len(xs) < 3:
        return float("nan")
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    var = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return cov / var if var else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny GPT on CPU (the test)")
    parser.add_argument("--out", default="gpu-check", help="directory for the results")
    parser.add_argument("--budget", type=float, default=420.0, help="seconds for the trials")
    parser.add_argument("--max-layouts", type=int, default=8)
    parser.add_argument(
        "--trainer-budget", type=float, default=180.0, help="seconds of --budget for trainers"
    )
    args = parser.parse_args(argv)
    began = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = device_description()
    if device["name"] == "cpu" and not args.tiny:
        print("no GPU here: run with --tiny for the CPU rehearsal", file=sys.stderr)
        return 2
    space_path = out / "space.yaml"
    space_path.write_text(yaml.safe_dump(space_document(device, args.tiny), sort_keys=False))
    space = load_space(space_path)
    probed = probe(space_path, out / "machine.yaml", timeout_s=min(240.0, args.budget / 2))
    estimates = predictions(space, None if args.tiny else device["profile"], probed)
    plan = estimates.get("probed", space).plan()
    layouts = [layout for layout, _ in plan.feasible][: args.max_layouts]
    rows = []
    scratch = Path(tempfile.mkdtemp(prefix="parsearch-gpu-check-"))
    try:
        for index, layout in enumerate(layouts):
            if time.monotonic() - began > args.budget - args.trainer_budget:
                print(f"budget spent: {len(layouts) - index} layouts not run", file=sys.stderr)
                break
            spec = TrialSpec(
                trial_id=f"check-{index}",
                model=space.model,
                layout=layout,
                allocation=space.allocation,
                trainer=dict(space.trainer),
                timeout_s=space.trial_timeout_s,
            )
            result, _ = run_trial(spec, scratch / spec.trial_id)
            row: dict[str, Any] = {"layout": layout.short(), "state": result.status.value}
            if result.status is TrialState.OK:
                row["measured"] = {
                    key: result.metrics.get(key)
                    for key in ("tokens_per_s", "mfu", "tflops_per_device", "peak_mem_bytes")
                }
            for name, estimated in estimates.items():
                prediction = estimated.predict(layout)
                row[name] = {
                    "tokens_per_s": prediction.tokens_per_s,
                    "mfu": prediction.mfu,
                    "peak_mem_bytes": prediction.memory.total,
                }
            rows.append(row)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    trainers = run_trainer_checks(
        device, args.tiny, out / "trainers", budget_s=args.budget - (time.monotonic() - began)
    )
    report = {
        "device": device,
        "profile_probed": str(probed) if probed else None,
        "rows": rows,
        "trainers": trainers,
    }
    for name in estimates:
        ok = [row for row in rows if "measured" in row and row["measured"]["tokens_per_s"]]
        report[f"spearman {name}"] = spearman(
            [row[name]["tokens_per_s"] for row in ok],
            [row["measured"]["tokens_per_s"] for row in ok],
        )
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2))
    print_table(report, list(estimates))
    print_trainer_table(trainers)
    print(f"took {time.monotonic() - began:.0f} s; figures in {out / 'gpu_check.json'}")
    trainers_as_expected = all(row["state"] == row["expected"] for row in trainers)
    return 0 if any("measured" in row for row in rows) and trainers_as_expected else 1


def print_table(report: dict[str, Any], names: list[str]) -> None:
    device = report["device"]
    print(f"device {device['name']} (shipped profile: {device['profile'] or 'none'})")
    header = "| layout | state | tokens/s | MFU | mem GiB |"
    for name in names:
        header += f" {name}: tokens/s ratio, MFU, mem GiB |"
    print(header)
    print("|" + "---|" * (5 + len(names)))
    for row in report["rows"]:
        measured = row.get("measured") or {}
        tokens = measured.get("tokens_per_s") or float("nan")
        mfu = measured.get("mfu") or float("nan")
        memory = (measured.get("peak_mem_bytes") or float("nan")) / 2**30
        line = f"| {row['layout']} | {row['state']} | {tokens:.4g} | {mfu:.1%} | {memory:.2f} |"
        for name in names:
            predicted = row[name]
            ratio = predicted["tokens_per_s"] / tokens if tokens == tokens else float("nan")
            line += (
                f" {ratio:.2f}, {predicted['mfu']:.1%}, {predicted['peak_mem_bytes'] / 2**30:.2f} |"
            )
        print(line)
    for name in names:
        print(
            f"Spearman (predicted vs measured tokens/s), {name}: {report[f'spearman {name}']:.2f}"
        )


if __name__ == "__main__":
    sys.exit(main())
