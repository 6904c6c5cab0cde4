"""``parsearch export --store FILE.db --out results.csv``: every trial, as a table."""

from __future__ import annotations

import argparse

from parsearch.commands import COMMANDS
from parsearch.commands._arguments import add_store_arguments
from parsearch.query import open_campaign


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export",
        help=COMMANDS["export"],
        description="One row per trial: layout, state, timings, measured metrics and the "
        "estimate's predictions (predicted.*). Safe while the campaign runs.",
    )
    add_store_arguments(parser)
    parser.add_argument(
        "--out", required=True, metavar="FILE", help="results.csv or results.parquet"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with open_campaign(args.store, args.name) as (store, campaign):
        path = store.export(campaign.id, args.out)
        count = sum(store.counts(campaign.id).values())
    print(f"wrote {count} trials of campaign '{campaign.name}' to {path}")
    return 0
