"""``parsearch best --store FILE.db``: the fastest layout found, in a format to paste."""

from __future__ import annotations

import argparse
import sys

from parsearch.commands import COMMANDS
from parsearch.commands._arguments import add_store_arguments, memory_size
from parsearch.errors import ParsearchError
from parsearch.formats import FORMATS, format_layout
from parsearch.query import open_campaign
from parsearch.result import TrialState
from parsearch.units import count_of, format_bytes


class NoResultError(ParsearchError):
    """The campaign has no successful trial (under the memory cap) yet."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "best",
        help=COMMANDS["best"],
        description="Print the successful trial with the best objective (optionally within "
        "a peak-memory cap). Safe while the campaign runs.",
    )
    add_store_arguments(parser)
    parser.add_argument(
        "--max-mem",
        type=memory_size,
        metavar="SIZE",
        help="only trials whose measured peak memory per rank is at most SIZE (60GiB, bytes)",
    )
    parser.add_argument("--format", default="text", choices=sorted(FORMATS))
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    unmeasured = 0
    with open_campaign(args.store, args.name) as (store, campaign):
        record = store.best(campaign.id, max_mem_bytes=args.max_mem)
        if args.max_mem is not None:
            ok = store.trials(campaign.id, [TrialState.OK])
            unmeasured = sum(1 for trial in ok if trial.peak_mem_bytes is None)
    left_out = ""
    if unmeasured:
        left_out = (
            f"{count_of(unmeasured, 'successful trial')} without a measured peak memory "
            f"{'was' if unmeasured == 1 else 'were'} left out: it cannot be shown to fit "
            f"(its trainer's log reports no memory)"
        )
    if record is None:
        cap = f" within {format_bytes(args.max_mem)} per rank" if args.max_mem else ""
        raise NoResultError(
            f"campaign '{campaign.name}' has no successful trial{cap} yet"
            + (f"; {left_out}" if left_out else "")
        )
    if left_out:
        print(f"parsearch best: note: {left_out}", file=sys.stderr)
    print(format_layout(record, campaign, args.format))
    return 0
