"""``parsearch scaling --store FILE.db --nodes 16,32,64``: the best layout at several sizes."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from parsearch.commands import COMMANDS
from parsearch.commands._arguments import (
    add_session_arguments,
    add_store_option,
    session_overrides,
)

if TYPE_CHECKING:
    from parsearch.scaling import ScalingStudy


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "scaling",
        help=COMMANDS["scaling"],
        description="Run a campaign's best layout at several allocation sizes (one child "
        "campaign per size in the same store, through the same backend) and report the "
        "scaling efficiency: throughput per device relative to the smallest size. Weak "
        "scaling keeps mbs and gas (the global batch grows with dp); strong scaling keeps the "
        "global batch. Run the same command again to continue a stopped study.",
    )
    add_store_option(parser)
    parser.add_argument(
        "--name", help="campaign whose best layout to scale (default: the newest campaign)"
    )
    parser.add_argument(
        "--nodes", required=True, metavar="N,N,...", help="allocation sizes, e.g. 16,32,64,128"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--weak",
        dest="mode",
        action="store_const",
        const="weak",
        help="keep mbs and gas at every size, so the global batch grows with dp (the default)",
    )
    mode.add_argument(
        "--strong",
        dest="mode",
        action="store_const",
        const="strong",
        help="keep the global batch at every size (gas shrinks as dp grows)",
    )
    parser.set_defaults(mode="weak")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument(
        "--figure", metavar="FILE.png", help="also draw efficiency against nodes to FILE.png"
    )
    add_session_arguments(parser, resume=True)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from parsearch.backends import serve_if_worker
    from parsearch.query import stored_backend

    backend = args.backend or stored_backend(args.store, args.name) or "local"
    if serve_if_worker(backend):
        return 0
    from parsearch.campaign.progress import Progress
    from parsearch.campaign.scaling import parse_nodes, run_study

    study = run_study(
        args.store,
        name=args.name,
        nodes=parse_nodes(args.nodes),
        mode=args.mode,
        overrides=session_overrides(args),
        progress=Progress(enabled=not args.quiet and args.format == "text"),
    )
    if args.figure:
        from parsearch.report.scaling import save_scaling_figure

        save_scaling_figure(study, args.figure)
    if args.format == "json":
        print(json.dumps(study.to_dict(), indent=2))
        return 0
    print(render(study))
    if not study.complete:
        print(f"study stopped; continue it with the same command (--store {args.store})")
    return 0


def render(study: ScalingStudy) -> str:
    """The study as a table, one row per size."""
    lines = [
        f"{study.mode} scaling of campaign '{study.parent}'",
        f"{'nodes':>6} {'devices':>8} {'dp':>5} {'batch':>6} {'tokens/s':>12} "
        f"{'tok/s/dev':>10} {'eff.':>7}  state",
    ]
    for point in study.points:
        tokens = "-" if point.tokens_per_s is None else f"{point.tokens_per_s:.4g}"
        per_device = (
            "-" if point.tokens_per_s is None else f"{point.tokens_per_s / point.devices:.4g}"
        )
        efficiency = "-" if point.efficiency is None else f"{point.efficiency:.1%}"
        lines.append(
            f"{point.nodes:>6} {point.devices:>8} {point.layout.dp:>5} "
            f"{point.layout.global_batch:>6} {tokens:>12} {per_device:>10} {efficiency:>7}  "
            f"{point.state}"
        )
    return "\n".join(lines)
