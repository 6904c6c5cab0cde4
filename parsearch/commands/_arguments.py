"""Command-line options shared by the campaign commands, declared once."""

from __future__ import annotations

import argparse
import math
from typing import Any

from parsearch.backends import BACKENDS, parse_options
from parsearch.campaign.lease import MAX_STALE_AFTER_S, MIN_STALE_AFTER_S, check_lease_timeout
from parsearch.campaign.outage import DEFAULT_OUTAGE_LIMIT_S
from parsearch.errors import UsageError
from parsearch.inputs import budget, crash_limit, grace_seconds, option, seconds, slots
from parsearch.units import parse_bytes

# What ``--store`` accepts, said once for every command: an SQLite file or a PostgreSQL URL
# (parsearch.store.open_store tells them apart by the URL's scheme).
STORE_METAVAR = "FILE.db|URL"
STORE_HELP = "results store: an SQLite file, or a postgresql://user@host/dbname URL"


def add_store_option(parser: argparse.ArgumentParser, help: str = STORE_HELP) -> None:
    """``--store``, as every command that reads or writes a store takes it."""
    parser.add_argument("--store", required=True, metavar=STORE_METAVAR, help=help)


def add_store_arguments(parser: argparse.ArgumentParser) -> None:
    """``--store`` and ``--name``: the query commands' way of naming one campaign."""
    add_store_option(parser)
    parser.add_argument(
        "--name", help="campaign name (default: the space's name for run, the newest for others)"
    )


def add_session_arguments(parser: argparse.ArgumentParser, *, resume: bool) -> None:
    """Options of ``run`` and ``resume``; on resume (and ``run --resume``), omitted ones
    keep the stored values, so they all default to ``None`` here: see
    :func:`session_overrides`."""
    keep = " (default: as stored)" if resume else ""
    parser.add_argument(
        "--backend",
        choices=list(BACKENDS),
        help=f"where trials run{keep or ' (default: local)'}",
    )
    parser.add_argument(
        "--backend-opt",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="backend setting, repeatable, e.g. simulate: delay=0.5, mem_factor=1.2; local: "
        f"workdir=DIR (an unknown key is refused with the valid ones){keep}",
    )
    parser.add_argument(
        "--slots",
        type=option(slots),
        help="trials running at once" + (keep or " (default: the backend's)"),
    )
    parser.add_argument(
        "--timeout",
        type=option(seconds),
        metavar="SECONDS",
        help=f"stop this session after SECONDS (drains like SIGTERM){keep}",
    )
    parser.add_argument(
        "--grace",
        type=option(grace_seconds),
        metavar="SECONDS",
        help=f"on SIGTERM/SIGINT/SIGUSR1, wait this long for running trials{keep or ' (60)'}",
    )
    parser.add_argument(
        "--lease-timeout",
        type=option(lease_seconds),
        metavar="SECONDS",
        help="a driver silent this long is presumed dead and its campaign taken over, "
        f"{MIN_STALE_AFTER_S:g} to {MAX_STALE_AFTER_S:g}{keep or ' (60)'}",
    )
    parser.add_argument(
        "--store-outage-limit",
        type=option(grace_seconds),
        metavar="SECONDS",
        help="how long the store may stay unreachable (a server restart, a stalled network "
        "filesystem) before the driver drains, keeping the results it could not write for "
        f"`resume`{keep or f' ({DEFAULT_OUTAGE_LIMIT_S:g})'}",
    )
    parser.add_argument(
        "--crash-limit",
        type=option(crash_limit),
        metavar="N",
        help="stop starting trials once N in a row crash the same way before any has run "
        f"(a broken trainer command), 0: never{keep or ' (4)'}",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="no progress display, only the final summary"
    )


def session_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The session options given on the command line, as :class:`CampaignSettings` fields."""
    given: dict[str, Any] = {
        "backend": args.backend,
        "slots": args.slots,
        "timeout_s": args.timeout,
        "grace_s": args.grace,
        "lease_timeout_s": args.lease_timeout,
        "store_outage_limit_s": args.store_outage_limit,
        "crash_limit": args.crash_limit,
    }
    if args.backend_opt is not None:
        given["backend_options"] = parse_options(args.backend_opt)
    return {key: value for key, value in given.items() if value is not None}


def lease_seconds(text: str) -> float:
    """``--lease-timeout``: finite, and long enough for its heartbeats; one bound is quoted
    whatever is wrong (not ``seconds``' own, which is wider)."""
    try:
        number = float(text)
    except ValueError:
        number = math.nan  # check_lease_timeout refuses it, quoting its bounds
    try:
        return check_lease_timeout(number)
    except UsageError as error:
        raise ValueError(str(error).replace("got nan", f"got {text[:50]!r}")) from None


# The most lines or rows a listing option accepts (a log tail holds far fewer).
MAX_ROWS = 1_000_000


def rows(text: str) -> int:
    """``--lines`` and ``--top``: a whole number of lines or rows, 0 to :data:`MAX_ROWS`."""
    stripped = text.strip()
    if not stripped.lstrip("+-").isdigit() or len(stripped) > 12:
        raise argparse.ArgumentTypeError(
            f"expected a number of lines or rows, an integer in [0, {MAX_ROWS}], got {text[:50]!r}"
        )
    value = int(stripped)
    if not 0 <= value <= MAX_ROWS:
        raise argparse.ArgumentTypeError(
            f"expected a number of lines or rows, an integer in [0, {MAX_ROWS}], got {value}"
        )
    return value


def memory_size(text: str) -> int:
    """``--max-mem 60GiB`` (or bytes)."""
    try:
        return parse_bytes(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def positive_int(text: str) -> int:
    """``--budget`` (and other counts of trials): 1 to :data:`~parsearch.inputs.MAX_BUDGET`."""
    return option(budget)(text)
