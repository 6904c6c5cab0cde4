"""``parsearch resume --store FILE.db``: continue a stopped, killed or timed-out campaign."""

from __future__ import annotations

import argparse

from parsearch.backends import serve_if_worker
from parsearch.commands import COMMANDS
from parsearch.commands._arguments import (
    add_session_arguments,
    add_store_arguments,
    positive_int,
    session_overrides,
)
from parsearch.tracking import add_track_argument, make_observers


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "resume",
        help=COMMANDS["resume"],
        description="Continue a campaign: finished trials are kept and told to the optimiser "
        "again, interrupted ones run first, and the campaign stops at its budget. Settings "
        "not given here keep the values the campaign was started with.",
    )
    add_store_arguments(parser)
    parser.add_argument("--budget", type=positive_int, help="new total budget (default: as stored)")
    add_session_arguments(parser, resume=True)
    add_track_argument(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from parsearch.query import stored_backend

    backend = args.backend or stored_backend(args.store, args.name)
    if backend is not None and serve_if_worker(backend):
        return 0
    # Imported after the diversion: an MPI worker rank never loads the search and its numpy.
    from parsearch.campaign.progress import Progress
    from parsearch.campaign.session import resume_campaign

    observers = make_observers(args.track, store_path=args.store)
    try:
        summary = resume_campaign(
            args.store,
            name=args.name,
            budget=args.budget,
            overrides=session_overrides(args),
            progress=Progress(enabled=not args.quiet),
            observers=observers,
        )
    finally:
        observers.close()
    print(summary.render(args.store))
    return summary.outcome.exit_code
