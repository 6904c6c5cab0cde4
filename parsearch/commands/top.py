"""``parsearch top --store FILE.db -k N``: the best layouts so far, measured beside predicted."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from typing import Any

from parsearch.commands import COMMANDS
from parsearch.commands._arguments import add_store_arguments, memory_size, positive_int
from parsearch.formats import trial_document
from parsearch.query import open_campaign
from parsearch.sanitize import shown
from parsearch.store import Campaign, TrialRecord
from parsearch.units import format_bytes


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "top",
        help=COMMANDS["top"],
        description="Rank a campaign's successful trials by objective, with the estimate's "
        "prediction beside each measurement. Safe while the campaign runs.",
    )
    add_store_arguments(parser)
    parser.add_argument("-k", type=positive_int, default=10, help="rows (default 10)")
    parser.add_argument(
        "--max-mem", type=memory_size, metavar="SIZE", help="peak memory per rank at most SIZE"
    )
    parser.add_argument("--format", choices=("text", "json", "csv"), default="text")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with open_campaign(args.store, args.name) as (store, campaign):
        records = store.top(campaign.id, args.k, max_mem_bytes=args.max_mem)
    if args.format == "json":
        print(json.dumps([trial_document(r, campaign) for r in records], indent=2))
    elif args.format == "csv":
        metric = campaign.objective_metric
        rows = [_row(rank, r, metric) for rank, r in enumerate(records, start=1)]
        if rows:
            writer = csv.DictWriter(sys.stdout, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    else:
        print(shown(_table(records, campaign)))
    return 0


def _row(rank: int, record: TrialRecord, metric: str) -> dict[str, Any]:
    metrics, predicted = record.metrics, record.predicted or {}
    return {
        "rank": rank,
        "trial": record.number,
        **record.config,
        "objective": record.objective,
        "fidelity": record.fidelity,
        "proxy_dp": record.proxy_dp,
        "step_time_s": metrics.get("step_time_s"),
        "tflops_per_device": metrics.get("tflops_per_device"),
        "mfu": metrics.get("mfu"),
        "peak_mem_bytes": metrics.get("peak_mem_bytes"),
        "predicted_objective": predicted.get(metric),
        "predicted_step_time_s": predicted.get("step_time_s"),
        "predicted_peak_mem_bytes": predicted.get("peak_mem_bytes"),
    }


def _table(records: list[TrialRecord], campaign: Campaign) -> str:
    metric = campaign.objective_metric
    if not records:
        return f"campaign '{campaign.name}' has no successful trial yet"
    header = (
        f"{'#':>3} {'trial':>5}  {'layout':<34} {metric:>17} {'predicted':>10} "
        f"{'step s':>8} {'MFU':>6} {'mem/rank':>10} {'predicted':>10}"
    )
    proxies = any(record.proxy_dp is not None for record in records)
    if proxies:  # which figures are measured at full scale, which predicted from a proxy
        header += f"  {'fidelity':<9}"
    lines = [f"top {len(records)} of campaign '{campaign.name}' by {metric}:", header]
    for rank, record in enumerate(records, start=1):
        metrics, predicted = record.metrics, record.predicted or {}
        fidelity = "full" if record.proxy_dp is None else f"proxy dp{record.proxy_dp}"
        lines.append(
            f"{rank:>3} {record.number:>5}  {record.layout.short():<34} "
            f"{_fmt(record.objective):>17} {_fmt(predicted.get(metric)):>10} "
            f"{_fmt(metrics.get('step_time_s')):>8} {_pct(metrics.get('mfu')):>6} "
            f"{_mem(metrics.get('peak_mem_bytes')):>10} {_mem(predicted.get('peak_mem_bytes')):>10}"
            + (f"  {fidelity:<9}" if proxies else "")
        )
    if proxies:
        lines.append(
            "proxy rows: figures predicted at full scale from a run at fewer replicas "
            "(`parsearch show` gives what it measured)"
        )
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _mem(value: float | None) -> str:
    return "-" if value is None else format_bytes(value)
