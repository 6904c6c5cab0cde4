"""``parsearch store copy SRC DST``: move a store between SQLite and PostgreSQL, losslessly."""

from __future__ import annotations

import argparse

from parsearch.commands import COMMANDS


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "store",
        help=COMMANDS["store"],
        description="Work on a results store as a whole. A store is an SQLite file or a "
        "PostgreSQL URL (postgresql://user@host/db).",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    copy = actions.add_parser(
        "copy",
        help="copy every campaign, trial, setting and lease of SRC into a new store DST",
        description="Copy every row of SRC (SQLite file or postgresql:// URL) into DST, a new "
        "file or an empty PostgreSQL database or schema: campaigns with their settings, "
        "trials with their metrics and logs, leases with their generations, keeping ids. "
        "SRC is read in one snapshot (a driver may be running); DST is written in one "
        "transaction, so a failed copy writes nothing.",
    )
    copy.add_argument("source", metavar="SRC", help="the store to copy from")
    copy.add_argument("destination", metavar="DST", help="the new store to copy into")
    copy.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from parsearch.store.copy import copy_store
    from parsearch.store.postgres import shown_url

    copied = copy_store(args.source, args.destination)
    rows = ", ".join(f"{n} {table}" for table, n in copied.items() if table != "schema_version")
    print(f"copied {rows} from {shown_url(args.source)} to {shown_url(args.destination)}")
    return 0
