"""The command trainer: run the user's own training program for a trial, read its log.

A space names it with ``trainer: {kind: command, ...}`` (see :func:`validate_section` for the
keys). For each node of a trial :class:`CommandNode` fills the command template from the
layout and plans its processes for the node agent (:class:`parsearch.launch.process.NodeRun`),
which owns process groups, the timeout and the logs, in one of three ways:

* ``launch: per_rank`` — once per rank, with ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
  ``MASTER_ADDR``, ``MASTER_PORT`` set, as ``srun`` would (Megatron's ``pretrain_gpt.py``);
* ``launch: per_node`` — once per node, for launchers that start the ranks themselves
  (``torchrun``, ``deepspeed``); the template passes ``{nnodes} {node_rank}
  {nproc_per_node} {master_addr} {master_port}`` to them;
* ``launch: single`` — one plain process for the whole (single-node) trial, with none of
  the launcher variables, for programs that switch to distributed mode when ``RANK`` is
  set (nanoGPT's ``train.py``).

It runs in the trial directory, or in ``cwd`` (placeholders allowed; relative to the trial
directory) for programs that read files relative to their checkout.

When the ranks have ended (or been killed), the node's logs are read again. Unless every
rank exited 0 with metrics, an out-of-memory line in any log makes the trial ``oom``, even
when a hang ended it (a rank that ran out of memory often leaves its peers waiting in a
collective until the timeout). The metrics come from the *last* rank whose log has metric
lines, as Megatron prints from its last pipeline stage, and peak memory from every log. A
timeout after enough measured steps keeps them (``ended_by_timeout``) but stays a
``timeout``: a run that hangs after its warm-up (a deadlock) must never be the best layout;
``timeout_ok: true`` stores it as ``ok``, for programs that run until they are stopped.

Memory is also measured by the node agent (the peak resident set of every process it
started, :mod:`parsearch.launch.memory`; on NVIDIA GPUs the device memory the driver sees,
:mod:`parsearch.launch.device_memory`): a trial's ``peak_mem_bytes`` is the larger of the
measure that applies (CPU: resident set; GPU: device) and the logged figure (kept as
``reported_peak_mem_bytes``), so the cap holds for programs that print no memory. A peak
above the space's ``memory_cap`` makes an otherwise ok trial ``oom`` (:func:`over_memory_cap`);
``{memory_cap}`` passes the cap to the program.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parsearch.errors import SpaceError
from parsearch.launch.oom import first_oom_line
from parsearch.launch.placement import NodePlacement
from parsearch.launch.plan import NodePlan
from parsearch.launch.process import MEASURED_DEVICE, MEASURED_RSS, NodeRun, read_tail
from parsearch.rank_program import SPEC_FILE, uses_gpu
from parsearch.result import TrialResult, TrialState
from parsearch.trainers.command.parsers import (
    PARSERS,
    LogScan,
    make_parser,
    no_metric_lines,
    parse_lines,
)
from parsearch.trainers.command.parsers.regex import (
    TIMING_METRICS,
    compile_patterns,
    resolve_scale,
    scale_factors,
)
from parsearch.trainers.command.summary import NoMeasurement, summarize
from parsearch.trainers.command.template import (
    HOSTFILE,
    PLACEHOLDERS,
    CommandTemplate,
    TemplateError,
    Text,
    as_text,
    trial_values,
)
from parsearch.trial import TrialSpec
from parsearch.units import format_bytes

SECTION_KEYS = (
    "kind",
    "command",
    "launch",
    "shell",
    "env",
    "vars",
    "files",
    "parser",
    "patterns",
    "scale",
    "steps",
    "warmup_steps",
    "timeout",
    "bind_devices",
    "cwd",
    "timeout_ok",
)
LAUNCH_MODES = ("per_rank", "per_node", "single")
DEFAULTS: dict[str, Any] = {
    "launch": "per_rank",
    "shell": False,
    "parser": "json",
    "steps": 10,
    "warmup_steps": 2,
    "bind_devices": False,
    "timeout_ok": False,
    "env": {},
    "vars": {},
    "files": {},
}
_RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
# What makes a program think it is one rank of a distributed job (nanoGPT checks RANK).
_LAUNCHER_VARS = (*_RANK_VARS, "GROUP_RANK", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")


def validate_section(data: Mapping[str, Any], source: str) -> dict[str, Any]:
    """Check a space's ``trainer`` section of ``kind: command``; return it with defaults.

    Keys: ``command`` (list or string; required), ``launch`` (per_rank | per_node | single),
    ``shell`` (false), ``env`` (name → value, placeholders allowed), ``vars`` (the space's
    own placeholders: name → fixed value), ``files`` (file name in the trial directory →
    a mapping written as JSON, or a text template), ``parser`` (json | megatron |
    megatron-deepspeed | torchtitan | regex), ``patterns`` and ``scale`` (regex parser),
    ``steps``, ``warmup_steps``, ``timeout`` (seconds), ``bind_devices`` (false: every rank
    sees every device of its node; true: one each, as ``srun --gpu-bind``), ``cwd`` (the
    working directory, placeholders allowed; default the trial directory), ``timeout_ok``
    (false: a trial ended by its timeout after measured steps stays ``timeout``, never best).
    """
    return CommandSettings.from_section(data, source).section


@dataclass(frozen=True)
class CommandSettings:
    """A validated command-trainer section, ready to fill for a trial."""

    section: dict[str, Any]
    template: CommandTemplate
    env: dict[str, Text]
    files: dict[str, Any]
    cwd: Text | None = None

    @classmethod
    def from_section(cls, data: Mapping[str, Any], source: str) -> CommandSettings:
        def error(field: str, message: str) -> SpaceError:
            return SpaceError(message, source=source, field=field)

        if not isinstance(data, Mapping):
            raise error("trainer", f"must be a mapping, got {type(data).__name__}")
        unknown = sorted(set(data) - set(SECTION_KEYS))
        if unknown:
            raise error(
                f"trainer.{unknown[0]}",
                f"unknown key for a command trainer; valid keys: {', '.join(SECTION_KEYS)}",
            )
        if "command" not in data:
            raise error("trainer.command", "is required for kind: command")
        section = {**DEFAULTS, **data, "kind": "command"}
        section["command"] = _string_case_keys(section["command"])
        for key in ("launch", "parser"):
            choices = LAUNCH_MODES if key == "launch" else PARSERS
            if section[key] not in choices:
                raise error(
                    f"trainer.{key}", f"must be one of {list(choices)}, got {section[key]!r}"
                )
        for key in ("shell", "bind_devices", "timeout_ok"):
            if not isinstance(section[key], bool):
                raise error(f"trainer.{key}", f"must be true or false, got {section[key]!r}")
        steps, warmup = section["steps"], section["warmup_steps"]
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise error("trainer.steps", f"must be a positive integer, got {steps!r}")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or not 0 <= warmup < steps:
            raise error(
                "trainer.warmup_steps",
                f"must be an integer in [0, steps={steps}) so some steps are measured, "
                f"got {warmup!r}",
            )
        if "timeout" in section:
            timeout = section["timeout"]
            if isinstance(timeout, bool) or not isinstance(timeout, int | float):
                raise error("trainer.timeout", f"must be a positive number, got {timeout!r}")
            if not 0 < timeout < math.inf:  # False for NaN: an endless trial is refused
                raise error("trainer.timeout", f"must be a positive number, got {timeout!r}")
            section["timeout"] = float(timeout)
        names = _placeholder_names(section["vars"], error)
        _check_parser(section, names, error)
        try:
            template = CommandTemplate.parse(section["command"], names, shell=section["shell"])
            env = {
                str(key): Text.parse(value, names, f"trainer.env.{key}")
                for key, value in _mapping(section["env"], "trainer.env", error).items()
            }
            files = {
                name: _parse_file(content, names, name, error)
                for name, content in _mapping(section["files"], "trainer.files", error).items()
            }
            cwd = Text.parse(section["cwd"], names, "trainer.cwd") if "cwd" in section else None
        except TemplateError as problem:
            raise error(problem.where, str(problem)) from None
        return cls(section, template, env, files, cwd)

    def values(self, spec: TrialSpec, **node: Any) -> dict[str, Any]:
        """Every placeholder's value (built-in and the space's ``vars``) for one node."""
        values = trial_values(
            spec, steps=self.section["steps"], warmup_steps=self.section["warmup_steps"], **node
        )
        values.update(self.section["vars"])
        return values


def shell_advice(section: Mapping[str, Any], source: str) -> list[str]:
    """Warnings about a ``shell: true`` template (where its placeholders sit; never errors:
    every value reaches the shell as data wherever it sits), for ``plan`` and ``run``."""
    if section.get("kind") != "command" or not section.get("shell"):
        return []
    try:
        settings = CommandSettings.from_section(section, source)
    except SpaceError:
        return []
    return [f"{source}: {note}" for note in settings.template.advice]


def _string_case_keys(command: Any) -> Any:
    """Switch cases keyed by text (``1`` and ``true`` from YAML become ``"1"``, ``"true"``),
    so the section survives the JSON round trip of a :class:`TrialSpec` unchanged."""
    if not isinstance(command, list):
        return command
    return [
        {**item, "cases": {as_text(key): value for key, value in item["cases"].items()}}
        if isinstance(item, Mapping) and isinstance(item.get("cases"), Mapping)
        else item
        for item in command
    ]


def _mapping(value: Any, where: str, error: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise error(where, f"must be a mapping, got {type(value).__name__}")
    return dict(value)


def _placeholder_names(variables: Any, error: Any) -> frozenset[str]:
    variables = _mapping(variables, "trainer.vars", error)
    for name, value in variables.items():
        where = f"trainer.vars.{name}"
        if not isinstance(name, str) or not name.isidentifier():
            raise error(where, "a placeholder name must be an identifier (letters, digits, _)")
        if name in PLACEHOLDERS:
            raise error(where, f"{{{name}}} is a built-in placeholder and cannot be redefined")
        if isinstance(value, Mapping | list) or value is None:
            raise error(where, f"must be a string, number or boolean, got {value!r}")
        if isinstance(value, str) and "\0" in value:  # no argument or variable can hold one
            raise error(where, "must not contain a NUL character (\\0)")
    return frozenset(PLACEHOLDERS) | frozenset(variables)


def _check_parser(section: dict[str, Any], names: frozenset[str], error: Any) -> None:
    if section["parser"] != "regex":
        for key in ("patterns", "scale"):
            if key in section:
                raise error(f"trainer.{key}", "is only used with parser: regex")
        return
    patterns = _mapping(section.get("patterns"), "trainer.patterns", error)
    try:
        compile_patterns(patterns)
    except ValueError as problem:
        raise error("trainer.patterns", str(problem)) from None
    for metric, factor in _mapping(section.get("scale", {}), "trainer.scale", error).items():
        if metric not in patterns:
            raise error(f"trainer.scale.{metric}", "scales a metric that has no pattern")
        try:
            scale_factors(factor, names)
        except ValueError as problem:
            raise error(f"trainer.scale.{metric}", str(problem)) from None


def _parse_file(content: Any, names: frozenset[str], name: Any, error: Any) -> Any:
    """Validate a generated file's template: every string leaf becomes a :class:`Text`."""
    where = f"trainer.files.{name}"
    if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
        raise error(where, "must be a plain file name (written into the trial directory)")

    def walk(node: Any, path: str) -> Any:
        if isinstance(node, Mapping):
            return {str(key): walk(value, f"{path}.{key}") for key, value in node.items()}
        if isinstance(node, list):
            return [walk(value, f"{path}[{i}]") for i, value in enumerate(node)]
        if isinstance(node, str):
            return Text.parse(node, names, path)
        return node

    if not isinstance(content, Mapping | list | str):
        raise error(where, "must be a mapping or list (written as JSON) or a text template")
    return walk(content, where)


def _render_file(template: Any, values: Mapping[str, Any]) -> str:
    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {key: walk(value) for key, value in node.items()}
        if isinstance(node, list):
            return [walk(value) for value in node]
        if isinstance(node, Text):
            return node.typed(values)
        return node

    if isinstance(template, Text):
        return template.render(values)
    return json.dumps(walk(template), indent=2) + "\n"


class CommandNode:
    """One node's part of a command-trainer trial: the plan of its processes for the node
    agent (:meth:`plan`), and the conclusion of its result from their logs
    (:meth:`conclude`)."""

    def __init__(self, placement: NodePlacement) -> None:
        spec = placement.spec
        self.settings = CommandSettings.from_section(spec.trainer, f"trial {spec.trial_id}")
        self.placement = placement
        self.spec = spec
        self.values = self.settings.values(
            spec,
            node_rank=placement.node_rank,
            nnodes=placement.nnodes,
            master_addr=placement.master_addr,
            master_port=placement.master_port,
            trial_dir=placement.trial_dir,
            hosts=list(placement.hosts),
            trial_tmp=placement.scratch_dir,
        )
        self.launch = self.settings.section["launch"]
        self.per_node = self.launch in ("per_node", "single")

    def plan(self) -> NodePlan:
        """The filled command, the space's ``trainer.env`` (the backend's own environment
        wins over it) and generated files plus the host file and ``spec.json``; per node,
        ``NNODES`` and ``NPROC_PER_NODE`` instead of the rank variables (``single``: no
        launcher variables); devices bound to ranks only with ``bind_devices``."""
        env = {key: text.render(self.values) for key, text in self.settings.env.items()}
        drop: tuple[str, ...] = ()
        if self.launch == "single":
            drop = _LAUNCHER_VARS
        elif self.per_node:
            drop = _RANK_VARS
            env["NNODES"] = str(self.placement.nnodes)
            env["NPROC_PER_NODE"] = str(self.spec.ranks_per_node)
        files = {
            name: _render_file(template, self.values)
            for name, template in self.settings.files.items()
        }
        files.setdefault(HOSTFILE, "".join(f"{host}\n" for host in self.placement.hosts))
        files.setdefault(SPEC_FILE, self.spec.to_json())  # the trial, for whoever reads it
        cwd = None
        if self.settings.cwd is not None:
            where = Path(self.settings.cwd.render(self.values)).expanduser()
            cwd = self.placement.trial_dir.resolve() / where
        return NodePlan(
            argv=self.settings.template.argv(self.values),
            env=env,
            files=files,
            cwd=cwd,
            cwd_field="trainer.cwd",
            bind_devices=(
                uses_gpu(self.spec) and not self.per_node and self.settings.section["bind_devices"]
            ),
            drop_env=drop,
            per_node=self.per_node,
            conclusion=self,
        )

    def _label(self, rank: int) -> str:
        if self.launch == "single":
            return "the trainer"
        return f"node {rank}" if self.per_node else f"rank {rank}"

    def conclude(self, run: NodeRun, agent: TrialResult) -> TrialResult:
        """Re-read the logs and decide the trial's state and metrics (see module doc)."""
        if agent.status is TrialState.INTERRUPTED:
            return agent
        judged = self._with_measured_memory(self._judge(run, agent), agent)
        final = over_memory_cap(judged, self.spec.memory_cap_bytes)
        if self.per_node and final.error:  # the agent counts processes as ranks
            for rank in run.ranks:
                label = self._label(rank.rank)
                final.error = final.error.replace(f"rank {rank.rank} ", f"{label} ", 1)
                final.error = final.error.replace(f"ranks [{rank.rank}]", label, 1)
        return final

    def _with_measured_memory(self, result: TrialResult, agent: TrialResult) -> TrialResult:
        """The agent's measures in the metrics: the peak resident set, and on a GPU the
        device memory the driver saw (NVML); the trial's ``peak_mem_bytes`` is the larger
        of the one that applies (CPU: resident set; GPU: device) and the logs' figure."""
        for key in (MEASURED_RSS, MEASURED_DEVICE):
            if agent.metrics.get(key):
                result.metrics[key] = agent.metrics[key]
        measured = agent.metrics.get(MEASURED_DEVICE if uses_gpu(self.spec) else MEASURED_RSS)
        if measured:
            reported = result.metrics.get("peak_mem_bytes")
            if reported is not None:
                result.metrics["reported_peak_mem_bytes"] = reported
            result.metrics["peak_mem_bytes"] = max(int(reported or 0), int(measured))
        return result

    def _judge(self, run: NodeRun, agent: TrialResult) -> TrialResult:
        """Precedence: a status the trainer reported itself; a clean exit with metrics; an
        out-of-memory line in any log (it explains a crash or a hang); the agent's OOM;
        metrics before a timeout; the agent's failure; a clean exit without metrics."""
        metrics, reason, log = self._measure(run)
        measured = "tokens_per_s" in metrics
        status = metrics.pop("status", "ok")
        if status != "ok":
            return TrialResult(
                status=TrialState(status) if status in ("oom", "timeout") else TrialState.ERROR,
                error=f"the trainer reported status {status!r}",
                log_tail=read_tail(log) if log else agent.log_tail,
            )
        tail = read_tail(log) if log else agent.log_tail
        # The agent calls a trial whose log merely mentions "out of memory" an OOM even when
        # every rank exited 0; a trainer that recovered and measured is not one.
        clean = agent.status in (TrialState.OK, TrialState.OOM) and all(
            rank.exit_code == 0 for rank in run.ranks
        )
        if clean and measured:
            return TrialResult(status=TrialState.OK, metrics=metrics, log_tail=tail)
        for rank in run.ranks:
            with rank.log.open(errors="replace") as lines:
                oom = first_oom_line(lines)
            if oom is not None:
                return TrialResult(
                    status=TrialState.OOM,
                    error=f"{self._label(rank.rank)} ran out of memory: {oom[:500]}",
                    log_tail=read_tail(rank.log),
                )
        if agent.status is TrialState.OOM:
            return agent
        if agent.status is TrialState.TIMEOUT and measured:
            metrics["ended_by_timeout"] = True
            if self.settings.section["timeout_ok"]:
                return TrialResult(status=TrialState.OK, metrics=metrics, log_tail=agent.log_tail)
            steps = metrics.get("measured_steps")
            after = f" after {steps} measured steps" if steps else " after it reported metrics"
            return TrialResult(
                status=TrialState.TIMEOUT,
                metrics=metrics,
                error=(
                    f"{agent.error}{after}: it hung after its warm-up, so it is never the best "
                    "(trainer.timeout_ok: true stores such a trial as ok, for a program that "
                    "runs until it is stopped)"
                ),
                log_tail=agent.log_tail,
            )
        if agent.status is not TrialState.OK:
            return agent
        if self.placement.nnodes > 1:  # another node may hold the last rank: see merge_node_results
            return TrialResult(status=TrialState.OK, metrics=metrics, error=reason, log_tail=tail)
        return TrialResult(
            status=TrialState.ERROR, error=f"every rank exited 0 but {reason}", log_tail=tail
        )

    def _measure(self, run: NodeRun) -> tuple[dict[str, Any], str, Path | None]:
        """Metrics from the last log that has metric lines, peak memory from every log
        (Megatron reports memory on each stage's first rank, timings on the last); or why
        there are no metrics (then ``peak_mem_bytes`` alone, for merge_node_results)."""
        section = self.settings.section
        scans: list[tuple[int, Path, LogScan]] = []
        scale = resolve_scale(section.get("scale", {}), self.values)
        for rank in run.ranks:
            parser = make_parser(section["parser"], section.get("patterns"), scale)
            with rank.log.open(errors="replace") as lines:
                scans.append((rank.rank, rank.log, parse_lines(lines, parser)))
        memory = LogScan()
        for _, _, scan in scans:
            memory.add_memory(scan.peak_mem_bytes, scan.peak_reserved_bytes)
        chosen = next(
            ((r, log, scan) for r, log, scan in reversed(scans) if scan.has_metrics), None
        )
        if chosen is None:
            logs = ", ".join(log.name for _, log, _ in scans)
            reason = no_metric_lines(section["parser"], logs)
            if memory.peak_mem_bytes is not None:  # the memory pattern matched, timing did not
                timing = sorted(set(section.get("patterns") or {}) & set(TIMING_METRICS))
                what = f"the patterns of {', '.join(timing)}" if timing else "its metric lines"
                reason = (
                    f"only peak memory was found in {logs}: {what} matched no line "
                    f"(parser {section['parser']})"
                )
            return _memory_metrics(memory), reason, None
        rank, log, scan = chosen
        scan.add_memory(memory.peak_mem_bytes, memory.peak_reserved_bytes)
        try:
            metrics = summarize(scan, self.spec, section["warmup_steps"])
        except NoMeasurement as problem:
            return _memory_metrics(memory), f"{self._label(rank)}: {problem}", log
        if scan.summary is not None and "status" in scan.summary:
            metrics["status"] = scan.summary["status"]
        metrics.update(parser=section["parser"], metrics_log=log.name)
        return metrics, "", log


def over_memory_cap(result: TrialResult, cap: int | None) -> TrialResult:
    """``result``, or ``oom`` when it measured a peak above the space's ``memory_cap``: the
    layout would not fit the memory the space allows, so it must never rank as best. The
    metrics stay, so ``parsearch show`` has the measured figure."""
    peak = result.metrics.get("peak_mem_bytes")
    if not result.ok or cap is None or peak is None or peak <= cap:
        return result
    return TrialResult(
        status=TrialState.OOM,
        metrics=result.metrics,
        error=(
            f"measured peak memory {format_bytes(peak)} ({int(peak)} B) per rank exceeds "
            f"memory_cap {format_bytes(cap)} ({cap} B)"
        ),
        log_tail=result.log_tail,
        hosts=result.hosts,
        duration_s=result.duration_s,
    )


def _memory_metrics(scan: LogScan) -> dict[str, Any]:
    return {} if scan.peak_mem_bytes is None else {"peak_mem_bytes": int(scan.peak_mem_bytes)}


def run_node(placement: NodePlacement) -> TrialResult:
    """Run this node's part of a command-trainer trial to the end (the blocking form)."""
    return NodeRun(placement, CommandNode(placement).plan()).start().wait()


_FAILURE_ORDER = (TrialState.OOM, TrialState.ERROR, TrialState.TIMEOUT, TrialState.INTERRUPTED)


def merge_node_results(results: Sequence[TrialResult]) -> TrialResult:
    """One trial's result from its nodes' results (index = node rank).

    A failure wins, the most telling first (an OOM on one node explains the others' timeout);
    otherwise the metrics come from the last node that has them (it holds the last rank).
    """
    for state in _FAILURE_ORDER:
        for result in results:
            if result.status is state:
                return result
    hosts = [host for result in results for host in result.hosts]
    duration = max((result.duration_s for result in results), default=0.0)
    peaks = [r.metrics["peak_mem_bytes"] for r in results if "peak_mem_bytes" in r.metrics]
    for result in reversed(results):
        if "tokens_per_s" in result.metrics:
            metrics = dict(result.metrics)
            if peaks:
                metrics["peak_mem_bytes"] = max(peaks)
            return TrialResult(
                status=TrialState.OK,
                metrics=metrics,
                log_tail=result.log_tail,
                hosts=hosts,
                duration_s=duration,
            )
    reasons = "; ".join(result.error for result in results if result.error) or "no metrics"
    return TrialResult(
        status=TrialState.ERROR,
        error=f"every node exited 0 but none reported metrics: {reasons}",
        log_tail=results[-1].log_tail if results else "",
        hosts=hosts,
        duration_s=duration,
    )
