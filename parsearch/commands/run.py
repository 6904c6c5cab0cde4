"""``parsearch run SPACE.yaml --store FILE.db``: start a campaign and drive it to its budget."""

from __future__ import annotations

import argparse
from pathlib import Path

from parsearch.backends import serve_if_worker
from parsearch.campaign import DEFAULT_BUDGET
from parsearch.commands import COMMANDS
from parsearch.commands._arguments import (
    STORE_METAVAR,
    add_session_arguments,
    add_store_option,
    positive_int,
    session_overrides,
)
from parsearch.inputs import MAX_SEED, campaign_name, option, seed
from parsearch.search import STRATEGY_NAMES
from parsearch.tracking import add_track_argument, make_observers


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run",
        help=COMMANDS["run"],
        description="Start a campaign: the analytic estimate, calibrated by every result, and "
        "DeepHyper's CBO propose layouts the space's rules and memory allow; each runs as a "
        "short real "
        "training trial (or a simulated one) and is recorded in the store. Stop it with "
        "SIGTERM/SIGINT/SIGUSR1 (running trials drain), continue it with `parsearch resume`.",
    )
    parser.add_argument("space", help="search-space YAML file")
    add_store_option(parser)
    parser.add_argument(
        "--name", type=option(campaign_name), help="campaign name (default: the space's name)"
    )
    parser.add_argument(
        "--budget",
        type=positive_int,
        help=f"trials to finish (default {DEFAULT_BUDGET}; with --resume, the stored budget)",
    )
    parser.add_argument(
        "--seed", type=option(seed), default=0, help=f"random seed, 0 to {MAX_SEED} (default 0)"
    )
    parser.add_argument(
        "--strategy",
        choices=list(STRATEGY_NAMES),
        default="default",
        help="default: the estimate, calibrated online from each result, ranks what "
        "divides and fits, with a share of DeepHyper CBO proposals; cbo-raw: plain CBO over "
        "the raw space; random: uniform over the raw space",
    )
    parser.add_argument(
        "--keep-predicted-oom",
        action="store_true",
        help="also try layouts the estimate predicts to run out of memory",
    )
    parser.add_argument(
        "--settle",
        action="store_true",
        help="end before the budget once no untried layout is expected to beat the best "
        "measured one, even at the optimistic end of what the trials taught the estimate "
        "(default strategy; resume keeps it)",
    )
    parser.add_argument(
        "--proxy",
        action="store_true",
        help="explore by proxy trials (each layout on fewer data-parallel replicas, so on "
        "fewer nodes, several at once) and confirm the best at full scale; a proxy counts "
        "as a trial of the budget; resume keeps it",
    )
    parser.add_argument(
        "--warm-start",
        metavar=STORE_METAVAR,
        help="calibrate the estimate from a campaign of another store (a file or URL) "
        "before the first trial (default strategy; e.g. a 175B campaign on the same "
        "machine for a 1T search)",
    )
    parser.add_argument(
        "--no-auto-warm-start",
        action="store_true",
        help="do not warm-start from the store's own campaign of the same model on the same "
        "devices at another node count (what a new default-strategy campaign does otherwise)",
    )
    parser.add_argument(
        "--warm-start-name",
        metavar="NAME",
        help="the campaign of --warm-start to use (default: its newest)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="if the store already holds this campaign, continue it as `parsearch resume` "
        "would (its stored space and strategy; the session options given here) instead of "
        "refusing: one command for every job of a chain",
    )
    parser.add_argument(
        "--machine",
        metavar="PROFILE.yaml",
        help="machine profile from `parsearch probe` for the estimate (instead of the "
        "space's estimate.machine or its data-sheet constants); recorded with the campaign",
    )
    add_session_arguments(parser, resume=False)
    add_track_argument(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from parsearch.query import stored_backend
    from parsearch.space import load_space

    backend = args.backend
    if backend is None and args.resume:  # resume under mpiexec/srun: the stored backend
        backend = stored_backend(args.store, args.name or load_space(args.space).name)
    if serve_if_worker(backend or "local"):  # before anything rank 0 alone may fail at
        return 0
    # Imported after the diversion: an MPI worker rank never loads the search and its numpy.
    from parsearch.campaign.progress import Progress
    from parsearch.campaign.session import CampaignSettings, start_campaign

    _advise(args.space)
    given = session_overrides(args)
    settings = CampaignSettings(
        strategy=args.strategy,
        keep_predicted_oom=args.keep_predicted_oom,
        settle=args.settle,
        proxy=args.proxy,
        warm_start=str(Path(args.warm_start).resolve()) if args.warm_start else None,
        warm_start_name=args.warm_start_name,
        auto_warm_start=not args.no_auto_warm_start,
        machine=str(Path(args.machine).resolve()) if args.machine else None,
        **given,
    )
    observers = make_observers(args.track, store_path=args.store)
    try:
        summary = start_campaign(
            args.space,
            args.store,
            name=args.name,
            budget=args.budget,
            seed=args.seed,
            settings=settings,
            progress=Progress(enabled=not args.quiet),
            resume_overrides=given if args.resume else None,
            observers=observers,
        )
    finally:
        observers.close()
    print(summary.render(args.store))
    return summary.outcome.exit_code


def _advise(path: str) -> None:
    """Print the trainer's load-time advice; a space that does not load is left to the
    campaign's start, which says why (or, with --resume, may not need the file)."""
    from parsearch.commands.plan import print_trainer_advice
    from parsearch.errors import ParsearchError
    from parsearch.space import load_space

    try:
        space = load_space(path)
    except ParsearchError:
        return
    print_trainer_advice(space)
