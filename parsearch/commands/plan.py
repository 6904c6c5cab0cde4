"""``parsearch plan SPACE.yaml``: what the space holds before anything runs."""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import sys
from typing import Any

from parsearch.commands import COMMANDS
from parsearch.commands._arguments import rows
from parsearch.config import LAYOUT_DIMENSIONS
from parsearch.estimate.band import predict_band
from parsearch.space import SpacePlan, apply_profile, load_space
from parsearch.units import count_of, format_bytes


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan",
        help=COMMANDS["plan"],
        description="Enumerate a search space: how many layouts do not divide, are predicted "
        "to run out of memory, or can run; and the best runnable ones by predicted objective.",
    )
    parser.add_argument("space", help="search-space YAML file")
    parser.add_argument("--top", type=rows, default=15, help="rows in the table (default 15)")
    parser.add_argument("--format", choices=("table", "csv", "json"), default="table")
    parser.add_argument(
        "--machine",
        metavar="PROFILE.yaml",
        help="estimate with this machine profile (from `parsearch probe`)",
    )
    parser.set_defaults(func=run)


BAND_NOTE = (
    "the band holds until a trial is measured: from the first measured trial on, "
    "`parsearch run` ranks by the estimate calibrated from the campaign's own "
    "measurements, which replaces the band"
)


def plan_rows(plan: SpacePlan, top: int) -> list[dict[str, Any]]:
    """The table's rows; with a profile that states uncertainties, each row also has its
    band (``tokens_per_s_low`` / ``_high``, ``mfu_low`` / ``_high``:
    :func:`~parsearch.estimate.band.predict_band`); every row has its peak memory per rank
    broken down (``mem_dense_bytes``, ``mem_experts_bytes``, ``mem_optimizer_bytes``,
    ``mem_activations_bytes``, ``mem_buffers_bytes``, ``mem_overhead_bytes``:
    :meth:`~parsearch.estimate.memory.MemoryEstimate.breakdown`)."""
    space = plan.space
    rows = []
    for rank, (layout, prediction) in enumerate(plan.feasible[:top], start=1):
        row: dict[str, Any] = {"rank": rank, **layout.to_dict()}
        row.update(prediction.to_dict())
        row["trial_s"] = prediction.step_time_s * space.timed_steps
        for part, size in prediction.memory.breakdown().items():
            row[f"mem_{part}_bytes"] = size
        del row["fits"]
        band = predict_band(space.model, layout, space.allocation, space.estimate, space.schedule)
        if band is not None:
            row.update(band.to_dict())
        rows.append(row)
    return rows


def run(args: argparse.Namespace) -> int:
    space = load_space(args.space)
    if args.machine:
        space = apply_profile(space, args.machine)
    plan = space.plan()
    plan.require_runnable(keep_predicted_oom=True)
    rows = plan_rows(plan, args.top)
    counts = {
        "total": plan.total,
        "not_dividing": plan.not_dividing_count,
        "excluded": plan.excluded_count,
        "predicted_oom": len(plan.predicted_oom),
        "feasible": len(plan.feasible),
    }
    if args.format == "json":
        data = {
            "space": space.name,
            "machine": profile_summary(space),
            "counts": counts,
            "best_by_value": {
                name: [{"value": v, "rank": r, "share": f} for v, r, f in values]
                for name, values in plan.best_by_value().items()
            },
            "unreachable": plan.unreachable(),
        }
        json.dump({**data, "top": rows}, sys.stdout, indent=2)
        print()
    elif args.format == "csv":
        if rows:
            writer = csv.DictWriter(sys.stdout, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    else:
        _print_table(space, plan, counts, rows)
    warning = plan.timeout_warning()
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    print_trainer_advice(space)
    return 0


def print_trainer_advice(space: Any) -> None:
    """The command trainer's load-time advice (where a shell template's placeholders sit)."""
    if space.trainer.get("kind") != "command":
        return
    from parsearch.trainers.command.trainer import shell_advice

    for note in shell_advice(space.trainer, space.source):
        print(f"warning: {note}", file=sys.stderr)


def profile_summary(space: Any) -> dict[str, Any] | None:
    """The machine profile the estimate used: its name, file, and where its figures came
    from (``None``: the space's data-sheet constants)."""
    profile = space.estimate.machine
    if profile is None:
        return None
    if space.model.moe is None:
        # The experts' load imbalance does not touch a dense model's prediction.
        kept = tuple(item for item in profile.uncertainty if item.figure != "moe_imbalance")
        profile = dataclasses.replace(profile, uncertainty=kept)
    return {
        "name": profile.name,
        "path": profile.path,
        "device": profile.device,
        "compute_efficiency": space.estimate.compute_efficiency,
        "gemm_half_efficiency_elements": space.estimate.gemm_half_efficiency_elements,
        "sources": list(profile.sources),
        "uncertainty": [
            {
                "figure": item.figure,
                "low": item.low,
                "high": item.high,
                "basis": item.basis,
                "reason": item.reason,
            }
            for item in profile.uncertainty
        ],
        "band": _band_summary(profile) if profile.uncertainty else None,
    }


def _band_summary(profile: Any) -> dict[str, Any]:
    by_basis: dict[str, list[str]] = {}
    for item in profile.uncertainty:
        by_basis.setdefault(item.basis, []).append(item.figure)
    return {
        "method": "the prediction at the slow and the fast corner of the stated ranges "
        "(every rate at its low end and every latency at its high end, then the reverse)",
        "assumptions": by_basis.get("assumption", []),
        "single_points": by_basis.get("single point", []),
        "data_sheet": by_basis.get("data sheet", []),
        "note": BAND_NOTE,
    }


def _print_profile(space: Any) -> None:
    summary = profile_summary(space)
    if summary is None:
        print("  machine: no profile, the space's data-sheet constants")
        return
    what = f": {summary['device']}" if summary["device"] else ""
    print(f"  machine profile {summary['name']} ({summary['path']}){what}")
    print(
        f"    GEMM curve: up to {summary['compute_efficiency']:.1%} of peak, half of that at "
        f"{summary['gemm_half_efficiency_elements']:.3g} output elements"
    )
    for line in summary["sources"]:
        print(f"    source: {line}")
    band = summary["band"]
    if band is None:
        print("    no stated uncertainty: no band (the figures are taken as exact)")
        return
    print("    band: the prediction at the slow and the fast corner of these stated ranges:")
    for item in summary["uncertainty"]:
        print(
            f"      {item['figure']} x{item['low']:g}-{item['high']:g} ({item['basis']}): "
            f"{item['reason']}"
        )
    for label, key in (
        ("assumptions", "assumptions"),
        ("single points", "single_points"),
        ("data-sheet figures", "data_sheet"),
    ):
        print(f"    {label}: {', '.join(band[key]) or 'none'}")
    print(f"    {band['note']}")


def _print_table(space: Any, plan: SpacePlan, counts: dict[str, int], rows: list[dict]) -> None:
    model, alloc = space.model, space.allocation
    print(f"space {space.name} ({space.source})")
    print(
        f"  model {model.name}: {model.num_layers} layers, hidden {model.hidden_size}, "
        f"{model.num_heads} heads, seq {model.seq_length}"
    )
    print(
        f"  allocation {alloc.name}: {count_of(alloc.nodes, 'node')} x "
        f"{count_of(alloc.devices_per_node, 'device')} = "
        f"{space.world_size}, {format_bytes(space.memory_limit_bytes)} per device"
    )
    _print_profile(space)
    print(
        f"layouts: {counts['total']} total, {counts['not_dividing']} do not divide, "
        f"{counts['excluded']} excluded by the space's or its trainer's rules, "
        f"{counts['predicted_oom']} predicted out of memory, {counts['feasible']} feasible"
    )
    for reason, count in plan.not_dividing.most_common(3):
        print(f"  not dividing: {count:6d} x {reason}")
    for reason, count in plan.excluded.most_common():
        print(f"  excluded:     {count:6d} x {reason}")
    if plan.feasible:
        print(f"best layout of each searched value (its rank, its {space.objective} / the best's):")
        for name, values in plan.best_by_value().items():
            cells = [
                f"{value} #{rank} {share:.0%}" if rank else f"{value} none fits"
                for value, rank, share in values
            ]
            print(f"  {name}: {', '.join(cells)}")
    for reason in plan.unreachable():
        print(f"  out of reach: {reason}")
    if not rows:
        print("no feasible layout (all predicted out of memory)")
        return
    print(f"top {len(rows)} feasible layouts by predicted {space.objective}:")
    columns = [(d.label, d) for d in LAYOUT_DIMENSIONS]
    widths = {
        label: max(len(label), *(len(d.cell(row[d.name])) for row in rows)) for label, d in columns
    }
    header = (
        f"{'#':>3} {' '.join(f'{label:>{widths[label]}}' for label, _ in columns)} "
        f"{'step s':>9} {'tokens/s':>11} {'TFLOP/s':>8} {'MFU':>6} {'mem/rank':>10} "
        f"{'trial s':>8}"
    )
    banded = "mfu_low" in rows[0]
    if banded:
        header += f" {'tokens/s band':>19} {'MFU band':>11}"
    print(header)
    for row in rows:
        cells = " ".join(f"{d.cell(row[d.name]):>{widths[label]}}" for label, d in columns)
        line = (
            f"{row['rank']:>3} {cells} {row['step_time_s']:>9.3g} "
            f"{row['tokens_per_s']:>11.4g} {row['tflops_per_device']:>8.3g} "
            f"{row['mfu']:>6.1%} {format_bytes(row['peak_mem_bytes']):>10} {row['trial_s']:>8.0f}"
        )
        if banded:
            tokens = f"{row['tokens_per_s_low']:.3g}-{row['tokens_per_s_high']:.3g}"
            mfu = f"{row['mfu_low']:.1%}-{row['mfu_high']:.1%}"
            line += f" {tokens:>19} {mfu:>11}"
        print(line)
    parts = [key for key in rows[0] if key.startswith("mem_") and key.endswith("_bytes")]
    shown = ", ".join(f"{key[4:-6]} {format_bytes(rows[0][key])}" for key in parts)
    print(f"memory per rank of #1: {shown}")
