"""``parsearch status --store FILE.db``: where a campaign stands, even while it runs."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from datetime import datetime

from parsearch.campaign.progress import describe_best, format_duration
from parsearch.commands import COMMANDS
from parsearch.commands._arguments import add_store_arguments
from parsearch.failures import (
    FAILURE_STATES,
    FailureGroup,
    describe_trials,
    group_failures,
)
from parsearch.query import CampaignProgress, campaign_progress, open_campaign, status_document
from parsearch.sanitize import shown
from parsearch.store import CampaignStatus, fidelity_note


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "status",
        help=COMMANDS["status"],
        description="Show a campaign's progress from its store (opened read-only, so it is "
        "safe while the campaign runs, from any host that sees the file).",
    )
    add_store_arguments(parser)
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with open_campaign(args.store, args.name) as (store, campaign):
        progress = campaign_progress(store, campaign)
        others = [c.name for c in store.list_campaigns() if c.id != campaign.id]
        failures = group_failures(store.trials(campaign.id, FAILURE_STATES))
    if args.format == "json":
        print(json.dumps(status_document(progress, failures), indent=2))
    else:
        print(shown(render_text(progress, others, failures)))  # stored text from trainers
    return 0


def render_text(
    progress: CampaignProgress, others: list[str], failures: Sequence[FailureGroup] = ()
) -> str:
    campaign, best = progress.campaign, progress.best
    created = datetime.fromtimestamp(campaign.created_at).strftime("%Y-%m-%d %H:%M")
    states = ", ".join(f"{s.value} {n}" for s, n in progress.counts.items() if n) or "none yet"
    done = f"{progress.finished}"
    if campaign.budget:
        done += f"/{campaign.budget} finished ({progress.finished / campaign.budget:.0%})"
    else:
        done += " finished"
    state = campaign.status.value
    if progress.driver_gone:
        state = "marked running, but no driver runs it"
    lines = [
        f"campaign '{campaign.name}' ({state}; backend {campaign.backend}; started {created})",
        f"  trials   {done}; {states}",
        "  "
        + describe_best(
            best.objective if best else None,
            best.layout if best else None,
            campaign.objective_metric,
        )
        + (f" (trial #{best.number})" if best else "")
        + (f"; {fidelity_note(best)}" if best and best.proxy_dp is not None else ""),
    ]
    hours = progress.node_hours
    if hours["proxy"] or campaign.settings.get("proxy"):
        lines.append(
            f"  node-h   {hours['full']:.3g} at full scale, {hours['proxy']:.3g} in proxies "
            "(each proxy is a trial of the budget)"
        )
    for i, group in enumerate(failures):
        count = len(group.trials)
        lines.append(
            f"  {'failed' if i == 0 else '':8} {group.state.value} x{count} "
            f"({describe_trials(group.trials)}): {group.reason}"
        )
    if progress.finish_reason:
        lines.append(f"  ended    before its budget: {progress.finish_reason}")
    if progress.eta_s is not None:
        lines.append(f"  ETA      {format_duration(progress.eta_s)}")
    if progress.driver is not None:
        driver, silent = progress.driver, progress.driver_silent_s or 0.0
        ahead = driver.heartbeat_at - progress.read_at
        when = f"{format_duration(silent)} ago"
        if ahead > 1.0:  # the driver's host clock runs ahead of this one's
            when = f"dated {format_duration(ahead)} ahead of this host's clock"
        line = f"  driver   pid {driver.pid} on {driver.host}, last heartbeat {when}"
        if progress.driver_gone:
            line += "; it seems dead: `parsearch resume` takes the campaign over"
        lines.append(line)
    elif campaign.status is CampaignStatus.RUNNING:
        lines.append(
            "  driver   none: the last driver stopped without finishing (killed, or an error "
            "it could not record, such as a full disk); `parsearch resume` continues the "
            "campaign"
        )
    if campaign.status is CampaignStatus.STOPPED and campaign.stop_reason:
        when = (
            datetime.fromtimestamp(campaign.stopped_at).strftime("%Y-%m-%d %H:%M:%S")
            if campaign.stopped_at is not None
            else "?"
        )
        lines.append(
            f"  stopped  at {when}: {campaign.stop_reason}; `parsearch resume` continues "
            "the campaign"
        )
    if others:
        lines.append(f"  other campaigns in this store: {', '.join(others)}")
    return "\n".join(lines)
