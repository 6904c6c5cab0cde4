"""``parsearch export --store FILE.db --out results.csv``: every trial, as a table."""

from __future__ import annotations

import argparse
from pathlib import Path

from parsearch.commands import COMMANDS
from parsearch.commands._arguments import add_store_arguments
from parsearch.errors import StoreError, UsageError
from parsearch.query import open_campaign
from parsearch.tracking import make_tracker, track_target


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export",
        help=COMMANDS["export"],
        description="One row per trial: layout, state, timings, measured metrics and the "
        "estimate's predictions (predicted.*). Safe while the campaign runs.",
    )
    add_store_arguments(parser)
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--out", metavar="FILE", help="results.csv or results.parquet")
    target.add_argument(
        "--to",
        type=track_target,
        metavar="mlflow[:URI]",
        help="log every finished trial to MLflow instead (a run per trial; trials logged "
        "before are skipped); URI defaults to $MLFLOW_TRACKING_URI, else ./mlruns",
    )
    parser.set_defaults(func=run)


def check_out(out: str) -> Path:
    """``--out``: a known format in a directory that exists, checked before the store is
    read (a usage error: exit 2)."""
    from parsearch.store.frames import check_export_path

    path = Path(out)
    try:
        check_export_path(path)
    except StoreError as error:
        raise UsageError(f"--out: {error}") from None
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise UsageError(f"--out {out}: is a directory; give a file name such as {path}/x.csv")
    if not parent.is_dir():
        why = "does not exist" if not parent.exists() else "is not a directory"
        raise UsageError(f"--out {out}: its directory {parent} {why}")
    return path


def run(args: argparse.Namespace) -> int:
    if args.to is not None:
        return _to_tracker(args)
    check_out(args.out)
    with open_campaign(args.store, args.name) as (store, campaign):
        path = store.export(campaign.id, args.out)
        count = sum(store.counts(campaign.id).values())
    print(f"wrote {count} trials of campaign '{campaign.name}' to {path}")
    return 0


def _to_tracker(args: argparse.Namespace) -> int:
    tracker = make_tracker(args.to, store_path=args.store)
    with open_campaign(args.store, args.name) as (store, campaign):
        records = store.trials(campaign.id)
    added = tracker.export(campaign, records)
    finished = sum(r.state.finished for r in records)
    print(
        f"logged {added} new of {finished} finished trials of campaign '{campaign.name}' "
        f"(store {args.store}) to {args.to.kind} at {tracker.uri} (experiment "
        f"'{campaign.name}', runs tagged parsearch.store and parsearch.campaign_uid)"
    )
    return 0
