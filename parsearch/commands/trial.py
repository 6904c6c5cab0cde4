"""``parsearch trial SPACE --layout "tp2 pp1 mbs4 gas2"``: a dry run of one layout.

Runs one trial of the space's trainer on this machine exactly as the ``local`` backend
would (the same node agent, guard, parser and classification), and prints what a user
testing a command template or a regex pattern needs: the filled command, the parsed
metrics, the trial's state and why, and the log tail. Nothing is written to a store.
Exit code 0 when the trial ends ``ok``, 1 when it does not, 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from parsearch.commands import COMMANDS
from parsearch.commands._arguments import rows
from parsearch.commands.plan import print_trainer_advice
from parsearch.config import DIMENSIONS_BY_NAME, LAYOUT_DIMENSIONS, ParallelLayout
from parsearch.errors import LayoutError
from parsearch.failures import failure_reason
from parsearch.launch.guard import guarded
from parsearch.launch.placement import NodePlacement
from parsearch.launch.process import free_port, run_together
from parsearch.plausible import checked
from parsearch.result import TrialResult
from parsearch.sanitize import shown
from parsearch.search.candidates import layout_problems, raw_layout
from parsearch.space import SearchSpace, load_space
from parsearch.tempdirs import owned_tempdir
from parsearch.trial import TrialSpec
from parsearch.trial_kinds import merge_results, node_run

# Tokens as ParallelLayout.short() writes them, from the declared dimensions (and "zero" for
# z, as people write it). At most 9 digits: a size no layout reaches, and int() of thousands
# of digits is refused.
_ALIASES = {"zero": "zero_stage"}
_BY_TOKEN = {d.token: d for d in LAYOUT_DIMENSIONS} | {
    alias: DIMENSIONS_BY_NAME[name] for alias, name in _ALIASES.items()
}
# Longest prefix first: "zero1" is read as zero, not as z followed by "ero1".
_LONGEST_FIRST = sorted(_BY_TOKEN.items(), key=lambda item: -len(item[0]))
_EXAMPLES = " ".join(
    d.token + {"int": "N", "bool": "", "choice": "|".join(d.choices)}[d.kind]
    for d in LAYOUT_DIMENSIONS
)


def _read_token(token: str) -> tuple[str, Any] | None:
    """The dimension a short-form token names and its value, or ``None``."""
    for prefix, dimension in _LONGEST_FIRST:
        if not token.startswith(prefix):
            continue
        rest = token[len(prefix) :]
        if dimension.kind == "bool" and not rest:
            return dimension.name, True
        if dimension.kind == "choice" and re.fullmatch(r"\w+", rest):
            return dimension.name, rest
        if dimension.kind == "int" and re.fullmatch(r"\d{1,9}", rest):
            return dimension.name, int(rest)
    return None


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "trial",
        help=COMMANDS["trial"],
        description="Run one layout of SPACE with its trainer on this machine (as the local "
        "backend would) and print the filled command, the parsed metrics, the "
        "classification and the log tail. Nothing is stored. Exit 0 if the trial is ok.",
    )
    parser.add_argument("space", help="search-space YAML file")
    parser.add_argument(
        "--layout",
        required=True,
        help='the layout as top prints it, e.g. "tp2 pp1 mbs4 gas2" (also z1, rc=full, vpp2, '
        "sp, cp2); dp is derived, and dimensions the space fixes may be left out",
    )
    parser.add_argument("--workdir", help="keep the trial's directory (logs, files) here")
    parser.add_argument("--lines", type=rows, default=30, help="log tail lines (default 30)")
    parser.set_defaults(func=run)


def _cut(text: str, most: int = 60) -> str:
    """``text`` quoted for a message, cut when long (a token of thousands of digits)."""
    return repr(text) if len(text) <= most else repr(text[:most]) + f"... ({len(text)} chars)"


def parse_layout(space: SearchSpace, text: str) -> ParallelLayout:
    """The layout ``text`` names in ``space``; :class:`LayoutError` says what is wrong."""
    given: dict[str, Any] = {}
    for token in text.replace(",", " ").split():
        read = _read_token(token)
        if read is None:
            raise LayoutError(
                f'--layout: cannot read {_cut(token)}; write e.g. "tp2 pp1 mbs4 gas2" ({_EXAMPLES})'
            )
        name, value = read
        given[name] = value
    for name, candidates in space.searched.items():
        # The short form leaves a dimension at its default out (no cp1, z0 or sp).
        default = DIMENSIONS_BY_NAME[name].default
        if name not in given and default is not None and default in candidates:
            given[name] = default
        elif name not in given:
            raise LayoutError(
                f"--layout: {space.source} searches {name} over "
                f"{', '.join(map(str, candidates))}; give one"
            )
    for name, candidates in space.searched.items():
        if name in given and given[name] not in candidates:
            raise LayoutError(
                f"--layout: {name} {given[name]} is not among the values {space.source} "
                f"searches: {', '.join(map(str, candidates))}"
            )
    point = {name: given[name] for name in space.searched}
    layout = raw_layout(space, point)
    for name, value in given.items():
        if name not in space.searched and getattr(layout, name) != value:
            raise LayoutError(
                f"--layout: {name}{value} is not this space's: {space.source} has "
                f"{name} = {getattr(layout, name)}"
                + (" (dp = world size / (tp*cp*pp))" if name == "dp" else "")
            )
    problems = layout_problems(space, layout)
    if problems:
        raise LayoutError(f"--layout {_cut(text)} cannot run: {'; '.join(problems)}")
    return layout


def run(args: argparse.Namespace) -> int:
    space = load_space(args.space)
    layout = parse_layout(space, args.layout)
    print_trainer_advice(space)
    spec = TrialSpec(
        trial_id="dry-run",
        model=space.model,
        layout=layout,
        allocation=space.allocation,
        trainer=dict(space.trainer),
        timeout_s=space.trial_timeout_s,
        memory_cap_bytes=space.memory_cap_bytes,
    )
    keep = args.workdir is not None
    # Owned: a trial killed with kill -9 leaves it to the next parsearch to remove.
    workdir = Path(args.workdir) if keep else owned_tempdir("trial")
    trial_dir = (workdir / spec.trial_id).resolve()
    try:
        result, commands = run_trial(spec, trial_dir)
        result = checked(  # as the campaign judges it: impossible or contradictory figures
            result,
            objective=space.objective,
            peak_flops_per_device=space.allocation.peak_flops_per_device,
            tokens_per_step=layout.global_batch * space.model.seq_length,
        )
        text = render(layout, spec, result, commands, trial_dir if keep else None, args.lines)
        print(shown(text))  # the trainer's log tail and error: no escape sequences
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0 if result.ok else 1


def run_trial(spec: TrialSpec, trial_dir: Path) -> tuple[TrialResult, list[list[str]]]:
    """Every node of ``spec`` on this machine, as the local backend runs them; the merged
    result and each node's command (without the guard's prefix)."""
    port = free_port("127.0.0.1")
    runs = [
        node_run(NodePlacement(spec, node, spec.nodes, "127.0.0.1", port, trial_dir))
        for node in range(spec.nodes)
    ]
    commands = [list(run.command) for run in runs]
    runs = [guarded(run) for run in runs]
    print(f"running {spec.layout.short()} (timeout {spec.timeout_s:g} s) ...", file=sys.stderr)
    return merge_results(spec, run_together(runs)), commands


def render(
    layout: ParallelLayout,
    spec: TrialSpec,
    result: TrialResult,
    commands: list[list[str]],
    kept: Path | None,
    lines: int,
) -> str:
    out = [f"layout   {layout.short()} ({spec.trainer.get('kind', 'builtin')} trainer)"]
    for node, command in enumerate(commands):
        label = "command " if len(commands) == 1 else f"node {node}  "
        out.append(f"{label} {shlex.join(command)}")
    out.append(f"state    {result.status.value}, {result.duration_s:.1f} s")
    if result.error:
        why = failure_reason(result.error, result.log_tail) if not result.ok else result.error
        out.append(f"why      {why}")
    if result.metrics:
        out.append("metrics  " + json.dumps(_shown(result.metrics), indent=None))
    if kept is not None:
        out.append(f"files    {kept}")
    tail = result.log_tail.splitlines()[-lines:] if lines else []
    out.append(f"log tail ({len(tail)} lines)" if tail else "log tail (empty)")
    out += [f"  {line}" for line in tail]
    return "\n".join(out)


def _shown(metrics: dict[str, Any]) -> dict[str, Any]:
    return {
        key: f"[{len(value)} values]" if isinstance(value, list) and len(value) > 8 else value
        for key, value in metrics.items()
    }
