"""Command templates: a trial's layout turned into an argument list, checked at load time.

A template is a list of arguments (or one string, split like a shell would split it *before*
anything is substituted). Each argument may hold ``{placeholder}`` fields, filled from the
trial; a filled argument stays exactly one argument whatever its value holds, so a value read
from a file (``"; rm -rf ~"``) can never become a command. With ``shell: true`` the template
is one string given to ``/bin/sh -c`` and no value is ever written into it: each placeholder
becomes a reference to a variable the shell receives as data (see
:mod:`parsearch.trainers.command.shell`), so no value can be parsed as shell syntax whatever
the template says; where a placeholder sits only earns load-time advice.

An argument may also be a *switch*, which expands to zero or more arguments chosen by a
placeholder's value — how one template serves trainers that take flags rather than values::

    - switch: seq_parallel
      cases: {true: [--sequence-parallel], false: []}
    - switch: recompute
      cases:
        none: []
        selective: [--recompute-granularity, selective]
        full: [--recompute-granularity, full, --recompute-method, uniform]
    - switch: vpp
      cases: {1: []}
      default: [--num-virtual-stages-per-pipeline-rank, "{vpp}"]
    - switch: cp
      cases: {1: []}
      default: [--context-parallel-size, "{cp}", --cp-comm-type, p2p]

A switch on ``recompute`` or ``seq_parallel`` must list every value (or give ``default``);
any other switch needs a ``default``. Unknown placeholders, switches and case values are
errors when the space is loaded, never in the middle of a campaign.
"""

from __future__ import annotations

import os
import shlex
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parsearch.config import LAYOUT_DIMENSIONS, RECOMPUTE_CHOICES
from parsearch.trainers.command import shell as shell_script
from parsearch.trial import TrialSpec
from parsearch.units import exact_size

PLACEHOLDERS: dict[str, str] = {
    **{d.slot: d.help for d in LAYOUT_DIMENSIONS},
    "global_batch": "sequences per optimizer step (mbs*gas*dp)",
    "batch_per_replica": "sequences per step per data-parallel replica (mbs*gas)",
    "gas_times_dp": "micro-batches per optimizer step over every replica (gas*dp), as "
    "nanoGPT's gradient_accumulation_steps under DDP expects",
    "tokens_per_step": "tokens per optimizer step (global_batch*seq_length)",
    "layers_per_virtual_stage": "num_layers / (pp*vpp)",
    "world_size": "ranks in the trial (tp*cp*pp*dp)",
    "nnodes": "nodes the trial spans",
    "node_rank": "this node's index in the trial (0-based)",
    "nproc_per_node": "ranks on each node",
    "master_addr": "rendezvous host",
    "master_port": "rendezvous port",
    "hosts": "the trial's hosts, comma-separated, node 0 first (for a launcher of its own)",
    "hostfile": "a file in the trial directory listing the trial's hosts, one per line",
    "steps": "training steps to run (trainer.steps)",
    "warmup_steps": "steps excluded from the measurement (trainer.warmup_steps)",
    "trial_dir": "this trial's directory (logs, generated files)",
    "trial_id": "the trial's identifier",
    "trial_tmp": "this node's scratch directory for the trial under TMPDIR, made before the "
    "ranks start and removed when they end, whatever the outcome (e.g. a cache trials must "
    "not share)",
    "seed": "the trial's random seed",
    "num_layers": "model.num_layers",
    "hidden_size": "model.hidden_size",
    "num_heads": "model.num_heads",
    "num_kv_heads": "model.num_kv_heads (num_heads when not set)",
    "ffn_hidden_size": "model.ffn_hidden_size (4*hidden_size when not set)",
    "vocab_size": "model.vocab_size",
    "seq_length": "model.seq_length",
    "num_experts": "model.moe.num_experts, the routed experts (0 for a dense model: Megatron's "
    "--num-experts 0 means no MoE)",
    "moe_top_k": "model.moe.top_k, experts per token (0 for a dense model)",
    "moe_ffn_hidden_size": "model.moe.expert_ffn_hidden_size, one expert's FFN width (0 for a "
    "dense model)",
    "moe_shared_ffn_hidden_size": "model.moe.shared_expert_ffn_hidden_size, the shared experts' "
    "summed width (0: none, or a dense model)",
    "memory_cap": "the space's memory_cap (else the device memory) as a size, e.g. 40MiB",
    "memory_cap_bytes": "the space's memory_cap (else the device memory) in bytes",
    "launch_dir": "the directory the campaign was created in (kept on resume), else the "
    "current one",
}
# The mixture-of-experts shape's placeholders and the MoESpec field each reads (0: dense model).
MOE_PLACEHOLDERS: dict[str, str] = {
    "num_experts": "num_experts",
    "moe_top_k": "top_k",
    "moe_ffn_hidden_size": "expert_ffn_hidden_size",
    "moe_shared_ffn_hidden_size": "shared_expert_ffn_hidden_size",
}
# Placeholders whose value is always a number (trial_values), so safe in shell arithmetic.
NUMERIC = frozenset(
    (
        *(d.slot for d in LAYOUT_DIMENSIONS if d.kind == "int"),
        "global_batch",
        "batch_per_replica",
        "gas_times_dp",
        "tokens_per_step",
        "layers_per_virtual_stage",
        "world_size",
        "nnodes",
        "node_rank",
        "nproc_per_node",
        "master_port",
        "steps",
        "warmup_steps",
        "seed",
        "num_layers",
        "hidden_size",
        "num_heads",
        "num_kv_heads",
        "ffn_hidden_size",
        "vocab_size",
        "seq_length",
        *MOE_PLACEHOLDERS,
        "memory_cap_bytes",
    )
)
# The file {hostfile} names, in the trial directory.
HOSTFILE = "hosts"
# Placeholders whose every value is known, so a switch on them can list them all.
ENUMERABLE: dict[str, tuple[str, ...]] = {
    "recompute": RECOMPUTE_CHOICES,
    "seq_parallel": ("true", "false"),
}


class TemplateError(ValueError):
    """A template is malformed; ``where`` is the field (``trainer.command[3]``)."""

    def __init__(self, where: str, message: str) -> None:
        self.where = where
        super().__init__(message)


def as_text(value: Any) -> str:
    """A placeholder value as it appears in an argument (booleans as ``true``/``false``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def trial_values(
    spec: TrialSpec,
    *,
    node_rank: int,
    nnodes: int,
    master_addr: str,
    master_port: int,
    trial_dir: Path,
    steps: int,
    warmup_steps: int,
    hosts: Sequence[str] = (),
    trial_tmp: Path | None = None,
) -> dict[str, Any]:
    """Every built-in placeholder's value for one node of one trial. ``hosts``: where the
    trial's nodes run, node 0 first, as the backend knows them; ``trial_tmp``: the node's
    scratch directory (``None`` where no node runs, e.g. a command shown: empty)."""
    layout, model = spec.layout, spec.model
    cap = spec.memory_cap_bytes or spec.allocation.device_memory_bytes
    return {
        **{d.slot: getattr(layout, d.name) for d in LAYOUT_DIMENSIONS},
        "global_batch": layout.global_batch,
        "batch_per_replica": layout.mbs * layout.gas,
        "gas_times_dp": layout.gas * layout.dp,
        "tokens_per_step": layout.global_batch * model.seq_length,
        "layers_per_virtual_stage": model.num_layers // (layout.pp * layout.vpp),
        "world_size": layout.world_size,
        "nnodes": nnodes,
        "node_rank": node_rank,
        "nproc_per_node": spec.ranks_per_node,
        "master_addr": master_addr,
        "master_port": master_port,
        "hosts": ",".join(hosts),
        "hostfile": str(trial_dir / HOSTFILE),
        "steps": steps,
        "warmup_steps": warmup_steps,
        "trial_dir": str(trial_dir),
        "trial_id": spec.trial_id,
        "trial_tmp": str(trial_tmp) if trial_tmp is not None else "",
        "seed": spec.seed,
        "num_layers": model.num_layers,
        "hidden_size": model.hidden_size,
        "num_heads": model.num_heads,
        "num_kv_heads": model.kv_heads,
        "ffn_hidden_size": model.ffn,
        "vocab_size": model.vocab_size,
        "seq_length": model.seq_length,
        **{
            slot: getattr(model.moe, field) if model.moe else 0
            for slot, field in MOE_PLACEHOLDERS.items()
        },
        "memory_cap": exact_size(cap),
        "memory_cap_bytes": cap,
        "launch_dir": spec.launch_dir or os.getcwd(),
    }


def _valid_list(names: set[str] | frozenset[str]) -> str:
    return ", ".join("{" + name + "}" for name in sorted(names))


@dataclass(frozen=True)
class Text:
    """One argument (or a shell string, or an env value): literals and placeholders."""

    parts: tuple[tuple[str, str | None], ...]

    @classmethod
    def parse(cls, text: Any, names: set[str] | frozenset[str], where: str) -> Text:
        if isinstance(text, bool) or not isinstance(text, str | int | float):
            raise TemplateError(where, f"must be a string, got {type(text).__name__} {text!r}")
        text = as_text(text)
        parts: list[tuple[str, str | None]] = []
        try:
            parsed = list(string.Formatter().parse(text))
        except ValueError as error:
            raise TemplateError(
                where, f"{text!r}: {error} (write a literal brace as {{{{ or }}}})"
            ) from None
        for literal, name, spec, conversion in parsed:
            if name is not None and (spec or conversion or name not in names):
                shown = "{" + name + (f"!{conversion}" if conversion else "")
                shown += (f":{spec}" if spec else "") + "}"
                problem = "unknown placeholder" if name not in names else "no formatting allowed"
                raise TemplateError(
                    where,
                    f"{problem} {shown} in {text!r}; valid placeholders: {_valid_list(names)}",
                )
            parts.append((literal, name))
        return cls(tuple(parts))

    def render(self, values: Mapping[str, Any]) -> str:
        out = []
        for literal, name in self.parts:
            out.append(literal)
            if name is not None:
                out.append(as_text(values[name]))
        return "".join(out)

    def typed(self, values: Mapping[str, Any]) -> Any:
        """The raw value when the text is exactly one placeholder (``"{mbs}"`` → ``4``),
        so generated JSON files keep numbers and booleans typed; else the rendered text."""
        if len(self.parts) == 1 and self.parts[0][0] == "" and self.parts[0][1] is not None:
            return values[self.parts[0][1]]
        return self.render(values)


@dataclass(frozen=True)
class Switch:
    """Arguments chosen by one placeholder's value (see the module docstring)."""

    on: str
    cases: tuple[tuple[str, tuple[Text, ...]], ...]
    default: tuple[Text, ...] | None

    @classmethod
    def parse(cls, item: Mapping[str, Any], names: set[str] | frozenset[str], where: str) -> Switch:
        unknown = sorted(set(item) - {"switch", "cases", "default"})
        if unknown:
            raise TemplateError(
                where, f"unknown key {unknown[0]!r} in a switch; valid: switch, cases, default"
            )
        on = item.get("switch")
        if on not in names:
            raise TemplateError(
                f"{where}.switch",
                f"must name a placeholder, got {on!r}; valid placeholders: {_valid_list(names)}",
            )
        cases = item.get("cases")
        if not isinstance(cases, Mapping) or not cases:
            raise TemplateError(f"{where}.cases", "must map values to lists of arguments")
        parsed = tuple(
            (as_text(key), _arguments(args, names, f"{where}.cases.{as_text(key)}"))
            for key, args in cases.items()
        )
        default = None
        if "default" in item:
            default = _arguments(item["default"], names, f"{where}.default")
        allowed = ENUMERABLE.get(on)
        keys = {key for key, _ in parsed}
        if allowed is not None:
            bad = sorted(keys - set(allowed))
            if bad:
                raise TemplateError(
                    f"{where}.cases", f"{on} is never {bad[0]!r}; its values: {', '.join(allowed)}"
                )
            missing = [value for value in allowed if value not in keys]
            if missing and default is None:
                raise TemplateError(
                    f"{where}.cases",
                    f"no case for {on} = {', '.join(missing)}; list every value or add 'default'",
                )
        elif default is None:
            raise TemplateError(
                f"{where}.default",
                f"a switch on {on} needs a 'default' (its values cannot all be listed)",
            )
        return cls(on, parsed, default)

    def render(self, values: Mapping[str, Any]) -> list[str]:
        key = as_text(values[self.on])
        chosen = dict(self.cases).get(key, self.default)
        assert chosen is not None  # parse() guarantees a case or a default
        return [text.render(values) for text in chosen]


def _arguments(value: Any, names: set[str] | frozenset[str], where: str) -> tuple[Text, ...]:
    items = value if isinstance(value, list) else [value]
    return tuple(Text.parse(item, names, f"{where}[{i}]") for i, item in enumerate(items))


@dataclass(frozen=True)
class CommandTemplate:
    """A validated command: argument templates and switches, or one shell string."""

    items: tuple[Text | Switch, ...]
    shell: bool = False
    # With shell: true, where each placeholder sits (shell.scan) and the warnings it earns.
    placements: tuple[shell_script.Placement, ...] = ()
    advice: tuple[str, ...] = ()

    @classmethod
    def parse(
        cls, command: Any, names: set[str] | frozenset[str], *, shell: bool = False
    ) -> CommandTemplate:
        where = "trainer.command"
        if shell:
            if not isinstance(command, str) or not command.strip():
                raise TemplateError(where, "with shell: true the command must be one string")
            text = Text.parse(command, names, where)
            placements = shell_script.scan(text.parts)
            clash = shell_script.check_names([place.name for place in placements])
            if clash is not None:
                raise TemplateError(where, clash)
            advice = tuple(f"{where}: {note}" for note in shell_script.advice(placements, NUMERIC))
            return cls((text,), shell=True, placements=tuple(placements), advice=advice)
        if isinstance(command, str):
            try:
                command = shlex.split(command)
            except ValueError as error:
                raise TemplateError(where, f"cannot be split into arguments: {error}") from None
        if not isinstance(command, list) or not command:
            raise TemplateError(where, "must be a non-empty list of arguments or a string")
        items: list[Text | Switch] = []
        for i, item in enumerate(command):
            if isinstance(item, Mapping):
                items.append(Switch.parse(item, names, f"{where}[{i}]"))
            else:
                items.append(Text.parse(item, names, f"{where}[{i}]"))
        if isinstance(items[0], Switch):
            raise TemplateError(f"{where}[0]", "the program to run cannot be a switch")
        return cls(tuple(items))

    def argv(self, values: Mapping[str, Any], *, shell: str = shell_script.SHELL) -> list[str]:
        """The argument list for one node of one trial (``shell``: the shell that runs a
        ``shell: true`` template; tests run it under dash and bash alike)."""
        if self.shell:
            text = self.items[0]
            assert isinstance(text, Text)
            body, order = shell_script.script(text.parts, self.placements)
            filled = {name: as_text(values[name]) for name in order}
            return shell_script.argv(body, order, filled, shell)
        argv: list[str] = []
        for item in self.items:
            if isinstance(item, Switch):
                argv.extend(item.render(values))
            else:
                argv.append(item.render(values))
        return argv
