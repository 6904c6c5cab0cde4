"""``parsearch resume --store FILE.db``: continue a stopped, killed or timed-out campaign."""

from __future__ import annotations

import argparse
from typing import Any

from parsearch.backends import parse_options, serve_if_worker
from parsearch.campaign.arguments import add_session_arguments, add_store_arguments, positive_int
from parsearch.campaign.progress import Progress
from parsearch.campaign.session import resume_campaign
from parsearch.errors import StoreError
from parsearch.store import open_store


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "resume",
        help="continue a campaign after a kill, a signal or the end of an allocation",
        description="Continue a campaign: finished trials are kept and told to the optimiser "
        "again, interrupted ones run first, and the campaign stops at its budget. Settings "
        "not given here keep the values the campaign was started with.",
    )
    add_store_arguments(parser)
    parser.add_argument("--budget", type=positive_int, help="new total budget (default: as stored)")
    add_session_arguments(parser, resume=True)
    parser.set_defaults(func=run)


def _stored_backend(args: argparse.Namespace) -> str | None:
    """The campaign's backend, read without writing: under ``mpiexec``/``srun`` every rank
    runs this command, and the workers must be diverted before anyone opens the store to
    write. ``None`` when the store cannot be read; resuming then reports why."""
    try:
        with open_store(args.store, readonly=True) as store:
            return store.get_campaign(args.name).backend
    except StoreError:
        return None


def run(args: argparse.Namespace) -> int:
    backend = args.backend or _stored_backend(args)
    if backend is not None and serve_if_worker(backend):
        return 0
    overrides: dict[str, Any] = {
        "backend": args.backend,
        "slots": args.slots,
        "timeout_s": args.timeout,
        "grace_s": args.grace,
        "lease_timeout_s": args.lease_timeout,
    }
    if args.backend_opt is not None:
        overrides["backend_options"] = parse_options(args.backend_opt)
    summary = resume_campaign(
        args.store,
        name=args.name,
        budget=args.budget,
        overrides={key: value for key, value in overrides.items() if value is not None},
        progress=Progress(enabled=not args.quiet),
    )
    print(summary.render(args.store))
    return 0
