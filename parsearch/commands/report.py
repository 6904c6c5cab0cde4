"""``parsearch report --store FILE.db --out DIR``: figures and one HTML page of a campaign."""

from __future__ import annotations

import argparse
from pathlib import Path

from parsearch.commands import COMMANDS
from parsearch.commands._arguments import add_store_option, rows
from parsearch.errors import UsageError
from parsearch.query import open_campaign


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report",
        help=COMMANDS["report"],
        description="Draw a campaign's convergence, TP x PP heat map, throughput vs memory "
        "with the Pareto front, and predicted vs measured figures, and write them with the "
        "top trials into DIR/index.html. Opens the store read-only, so it can run while the "
        "campaign does.",
    )
    add_store_option(parser)
    parser.add_argument("--name", help="campaign name (default: the latest campaign)")
    parser.add_argument("--out", required=True, help="directory for index.html and PNGs")
    parser.add_argument("--top", type=rows, default=10, help="rows in the top table (default 10)")
    parser.set_defaults(func=run)


def check_out_dir(out: str) -> None:
    """``--out``: a directory, or a path one can be made at (exit 2 otherwise), checked
    before the figures are drawn."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise UsageError(f"--out {out}: is a file, not a directory (the report is a directory)")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"--out {out}: {parent} is not a directory")
            break


def run(args: argparse.Namespace) -> int:
    check_out_dir(args.out)
    with open_campaign(args.store, args.name):  # a missing store or campaign fails fast
        pass
    # Imported here: matplotlib and pandas cost a second that other commands need not pay.
    from parsearch.report import load_report_data, write_report

    page = write_report(load_report_data(args.store, args.name), args.out, top_k=args.top)
    print(page)
    return 0
