"""``parsearch show --store FILE.db --trial N``: one trial whole, to see why it ended so.

Layout, state and why (the stored error, with the log's last exception when the error only
says how a rank exited), every metric, the estimate's prediction, the command a command
trainer ran (filled again from the stored space; values known only at run time are shown
as ``<name>``) and the tail of its log.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path
from typing import Any

from parsearch.commands import COMMANDS
from parsearch.commands._arguments import add_store_arguments, rows
from parsearch.errors import ParsearchError
from parsearch.failures import failure_reason
from parsearch.formats import trial_document
from parsearch.query import open_campaign
from parsearch.sanitize import shown
from parsearch.space import SearchSpace, space_from_dict
from parsearch.store import Campaign, TrialRecord, fidelity_note
from parsearch.trial import TrialSpec
from parsearch.units import format_bytes

RUNTIME_VALUES = ("master_addr", "master_port", "trial_dir", "trial_tmp", "launch_dir")


class NoSuchTrialError(ParsearchError):
    """The campaign has no trial of that number."""

    exit_code = 2


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "show",
        help=COMMANDS["show"],
        description="Show everything the store holds about one trial (its number as top, "
        "status and the report print it). Safe while the campaign runs.",
    )
    add_store_arguments(parser)
    parser.add_argument("--trial", type=int, required=True, metavar="N", help="trial number")
    parser.add_argument("--lines", type=rows, default=40, help="log tail lines (default 40)")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with open_campaign(args.store, args.name) as (store, campaign):
        trials = {record.number: record for record in store.trials(campaign.id)}
    record = trials.get(args.trial)
    if record is None:
        numbers = f"0 to {max(trials)}" if trials else "none yet"
        raise NoSuchTrialError(
            f"campaign '{campaign.name}' in {args.store} has no trial #{args.trial} "
            f"(its trials: {numbers})"
        )
    space = space_from_dict(campaign.space, source=campaign.space_path or campaign.name)
    command = filled_command(space, record, campaign.seed)
    if args.format == "json":
        document = trial_document(record, campaign)
        document.update(
            error=record.error,
            reason=failure_reason(record.error, record.log_tail) if record.state.failed else None,
            command=command,
            log_tail=record.log_tail,
        )
        print(json.dumps(document, indent=2))
    else:
        print(shown(render_text(record, campaign, command, args.lines)))
    return 0


def filled_command(space: SearchSpace, record: TrialRecord, seed: int) -> list[str] | None:
    """Node 0's command of a command-trainer trial, filled from the stored space."""
    if space.trainer.get("kind") != "command":
        return None
    from parsearch.trainers.command.trainer import CommandSettings

    settings = CommandSettings.from_section(space.trainer, space.source)
    spec = TrialSpec(
        trial_id=f"<trial_id of #{record.number}>",
        model=space.model,
        layout=record.layout,
        allocation=space.allocation,
        trainer=space.trainer,
        seed=seed,
        memory_cap_bytes=space.memory_cap_bytes,
    )
    values = settings.values(
        spec, node_rank=0, nnodes=spec.nodes, master_addr="", master_port=0, trial_dir=Path()
    )
    values.update({name: f"<{name}>" for name in RUNTIME_VALUES})
    return settings.template.argv(values)


def render_text(
    record: TrialRecord, campaign: Campaign, command: list[str] | None, lines: int
) -> str:
    where = f" on {', '.join(record.hosts)}" if record.hosts else ""
    took = f", {record.duration_s:.1f} s" if record.duration_s else ""
    out = [
        f"trial #{record.number} of campaign '{campaign.name}': {record.state.value} "
        f"(attempt {record.attempt}{took}{where}; origin {record.origin})",
        f"  layout     {record.layout.short()}",
    ]
    if record.state.failed:
        out.append(f"  why        {failure_reason(record.error, record.log_tail)}")
    elif record.error:
        out.append(f"  note       {record.error}")
    if record.proxy_dp is not None or campaign.settings.get("proxy"):
        out.append(f"  fidelity   {fidelity_note(record)}")
    if record.objective is not None:
        out.append(f"  objective  {campaign.objective_metric} {record.objective:.6g}")
    out += _mapping("metrics", record.metrics)
    out += _mapping("predicted", record.predicted or {})
    if command is not None:
        out.append(f"  command    {shlex.join(command)}")
    tail = record.log_tail.splitlines()[-lines:] if record.log_tail and lines else []
    out.append(f"  log tail   ({len(tail)} lines)" if tail else "  log tail   (none stored)")
    out += [f"    {line}" for line in tail]
    return "\n".join(out)


def _mapping(title: str, values: dict[str, Any]) -> list[str]:
    rows = []
    for key in sorted(values):
        value = values[key]
        if isinstance(value, list) and len(value) > 8:
            value = f"[{len(value)} values]"
        elif isinstance(value, float):
            value = f"{value:.6g}"
        if key.endswith("_bytes") and isinstance(values[key], int | float):
            value = f"{format_bytes(values[key])} ({int(values[key])} B)"
        rows.append(f"  {title if not rows else '':<10} {key} {value}")
    return rows
