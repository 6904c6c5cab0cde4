"""``parsearch best --store FILE.db``: the fastest layout found, in a format to paste; with
``--like SPACE.yaml``, the fastest any campaign of the store found for that space's model on
its allocation (:mod:`parsearch.best_known`)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from parsearch.best_known import (
    BestKnown,
    Comparable,
    KnownLayout,
    across_document,
    best_known,
)
from parsearch.commands import COMMANDS
from parsearch.commands._arguments import add_store_arguments, memory_size
from parsearch.errors import ParsearchError, UsageError
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
    parser.add_argument(
        "--like",
        metavar="SPACE.yaml",
        help="across every campaign of the store: the best layout found for this space's model "
        "on its allocation (nodes, devices per node, device kind), with where it came from",
    )
    parser.add_argument(
        "--trainer",
        metavar="KIND",
        help="with --like: only campaigns whose trainer is KIND (builtin, command...)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.like is not None:
        return run_across(args)
    if args.trainer is not None:
        raise UsageError("--trainer: only with --like (it chooses among campaigns)")
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


def run_across(args: argparse.Namespace) -> int:
    from parsearch.space import load_space
    from parsearch.store import open_store

    if args.name is not None:
        raise UsageError("--name: not with --like, which reads every campaign of the store")
    if args.max_mem is not None:
        raise UsageError("--max-mem: not with --like (each space states its own memory)")
    wanted = Comparable.of(load_space(args.like))
    with open_store(args.store, readonly=True) as store:
        known = best_known(store, wanted, trainer=args.trainer)
    best = known.best  # refuses, saying what the store holds, when nothing compares
    if known.unreadable:
        print(
            f"parsearch best: note: left out {len(known.unreadable)} campaign(s) whose stored "
            f"space no longer loads: {', '.join(known.unreadable)}",
            file=sys.stderr,
        )
    if args.format == "text":
        print(across_text(known))
    elif args.format == "json":
        print(json.dumps(across_document(known), indent=2))
    else:
        print(f"parsearch best: {provenance(best)}", file=sys.stderr)
        print(format_layout(best.trial, best.campaign, args.format))
    return 0


def provenance(known: KnownLayout) -> str:
    trial = known.trial
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(trial.finished_at or 0))
    return (
        f"campaign '{known.campaign.name}' trial #{trial.number} ({known.trainer} trainer), "
        f"{known.how}, finished {when}"
    )


def across_text(known: BestKnown) -> str:
    lines = [
        f"best known for {known.wanted.describe()}: {len(known.layouts)} of "
        f"{known.campaigns_in_store} campaigns compare"
    ]
    for rank, layout in enumerate(known.layouts, 1):
        trial = layout.trial
        mfu = trial.metrics.get("mfu")
        lines.append(
            f"  {rank}. {trial.layout.short():<32} {trial.tokens_per_s:.4g} tokens/s"
            + (f", MFU {mfu:.1%}" if mfu is not None else "")
            + f"  {provenance(layout)}"
        )
    if not known.best.measured:
        lines.append("  (no comparable trial was measured: the figures are only predicted)")
    return "\n".join(lines)
