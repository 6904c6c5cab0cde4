"""Search-space files: load, validate, enumerate and prune.

A space file names a model, an allocation, which layout dimensions are searched (lists,
powers of two or ranges), what is fixed (the global batch), the trainer, the objective and an
optional memory cap. Loading is strict: an unknown key, a wrong type or an empty range is a
:class:`~parsearch.errors.SpaceError` that names the file, the field and what would be
valid, so a typo never silently becomes a default.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import itertools
import math
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from parsearch.config import (
    DIMENSIONS_BY_NAME,
    LAYOUT_DIMENSIONS,
    AllocationSpec,
    ModelSpec,
    MoESpec,
    ParallelLayout,
    layout_violations,
)
from parsearch.errors import LayoutError, SpaceError
from parsearch.estimate import EstimateSettings, Prediction, predict
from parsearch.estimate.machine import MachineProfile
from parsearch.estimate.memory import FRAMEWORKS
from parsearch.estimate.profile import check_profile, with_machine
from parsearch.exclusions import Exclusion, exclusion_reasons, parse_exclusions
from parsearch.inputs import name_problem
from parsearch.profiles import load_profile, resolve
from parsearch.space_file import read_document
from parsearch.trainers import TRAINER_KINDS
from parsearch.units import count_of, format_bytes, parse_bytes, parse_rate

OBJECTIVES: tuple[str, ...] = ("tokens_per_s", "tflops_per_device", "mfu")
# What a space's ``search`` may name: every declared layout dimension but the derived dp.
DIMENSIONS: tuple[str, ...] = tuple(d.name for d in LAYOUT_DIMENSIONS if d.searched)
_DIMENSION_DEFAULTS: dict[str, Any] = {
    d.name: d.default for d in LAYOUT_DIMENSIONS if d.searched and d.default is not None
}
_TOP_KEYS = (
    "name",
    "description",
    "model",
    "allocation",
    "search",
    "global_batch",
    "objective",
    "memory_cap",
    "trainer",
    "estimate",
    "exclude",
)
_MODEL_KEYS = {f.name for f in fields(ModelSpec)}
_MOE_KEYS = {f.name for f in fields(MoESpec)}
_ALLOCATION_KEYS = (
    "name",
    "nodes",
    "devices_per_node",
    "device_memory",
    "peak_tflops",
    "intra_node_bandwidth",
    "inter_node_bandwidth",
    "memory_bandwidth",
    "device",
)
_ESTIMATE_KEYS = (
    "precision",
    "flash_attention",
    "dropout",
    "runtime_overhead",
    "compute_efficiency",
    "gemm_half_efficiency_elements",
    "dp_overlap",
    "collective_latency_s",
    "framework",
    "machine",
)


DEFAULT_TRIAL_TIMEOUT_S = 600.0
# Bounds that keep loading and planning a space fast whatever the file says.
MAX_INT = 10**12
MAX_CANDIDATES = 4096
MAX_POINTS = 10**6
# Bounds from the memory that per-node and per-device bookkeeping takes: the simulate
# backend holds every node of every slot (~40 B each), a trial's host list and host file a
# line per node, a node agent a process per device. 10^6 nodes (100x today's largest
# machines) is ~40 MB a slot; a billion would need tens of GB before the first trial.
MAX_NODES = 10**6
MAX_DEVICES_PER_NODE = 2**16


@dataclass(frozen=True)
class SearchSpace:
    """A validated search space. ``dimensions`` maps each layout field to its candidates."""

    name: str
    source: str
    model: ModelSpec
    allocation: AllocationSpec
    dimensions: dict[str, tuple[Any, ...]]
    global_batch: int | None
    objective: str
    memory_cap_bytes: int | None
    trainer: dict[str, Any]
    estimate: EstimateSettings
    description: str = ""
    raw: dict[str, Any] = field(default_factory=dict, compare=False)
    exclusions: tuple[Exclusion, ...] = ()

    @property
    def world_size(self) -> int:
        return self.allocation.world_size

    @property
    def memory_limit_bytes(self) -> int:
        """What a rank may use: the device, or the space's cap when that is lower."""
        limit = self.allocation.device_memory_bytes
        return min(limit, self.memory_cap_bytes) if self.memory_cap_bytes else limit

    @property
    def schedule(self) -> str:
        return str(self.trainer.get("schedule", "1f1b"))

    @property
    def trial_timeout_s(self) -> float:
        """Seconds a trial may run (``trainer.timeout``) before it is killed as ``timeout``."""
        return float(self.trainer.get("timeout", DEFAULT_TRIAL_TIMEOUT_S))

    @property
    def timed_steps(self) -> int:
        """Training steps a trial surely runs: the built-in trainer runs ``warmup_steps``
        more than ``steps``; a command trainer's ``steps`` include its warm-up."""
        steps = int(self.trainer.get("steps", 10))
        if self.trainer.get("kind", "builtin") == "builtin":
            steps += int(self.trainer.get("warmup_steps", 0))
        return steps

    @property
    def searched(self) -> dict[str, tuple[Any, ...]]:
        """Dimensions with more than one candidate: what the optimiser explores."""
        return {name: values for name, values in self.dimensions.items() if len(values) > 1}

    def layout_from_point(self, point: Mapping[str, Any]) -> ParallelLayout | None:
        """Complete a point of the searched dimensions into a layout (dp, and gas when the
        global batch is fixed, are derived). ``None`` when the derivation does not divide."""
        values = {name: candidates[0] for name, candidates in self.dimensions.items()}
        values.update({name: point[name] for name in self.searched if name in point})
        model_ranks = int(values["tp"]) * int(values["cp"]) * int(values["pp"])
        if self.world_size % model_ranks:
            return None
        values["dp"] = self.world_size // model_ranks
        if "gas" not in self.dimensions:
            assert self.global_batch is not None  # guaranteed by the loader
            if self.global_batch % (int(values["mbs"]) * values["dp"]):
                return None
            values["gas"] = self.global_batch // (int(values["mbs"]) * values["dp"])
        return ParallelLayout.from_dict(values)

    def points(self) -> Iterator[dict[str, Any]]:
        """Every combination of the searched dimensions."""
        names = list(self.searched)
        for combo in itertools.product(*(self.searched[name] for name in names)):
            yield dict(zip(names, combo, strict=True))

    def violations(self, layout: ParallelLayout) -> list[str]:
        """Why ``layout`` cannot run here: the divisibility rules, then :meth:`refusals`, so no
        strategy ever proposes what the trainer refuses."""
        problems = layout_violations(layout, self.model, self.world_size, self.global_batch)
        return problems + self.refusals(layout)

    def refusals(self, layout: ParallelLayout) -> list[str]:
        """Why a dividing layout is refused: the space's own ``exclude`` rules, then what its
        trainer kind does not run (the built-in trainer's expert tensor parallelism, say)."""
        kind = TRAINER_KINDS[str(self.trainer.get("kind", "builtin"))]
        return exclusion_reasons(self.exclusions, layout) + kind.refusals(self.model, layout)

    def predict(self, layout: ParallelLayout) -> Prediction:
        return predict(self.model, layout, self.allocation, self.estimate, self.schedule)

    def fits(self, prediction: Prediction) -> bool:
        return prediction.memory.total <= self.memory_limit_bytes

    def plan(self) -> SpacePlan:
        """Every point of the space sorted into what can run; computed once per space (it
        is immutable), since the run command and the strategy both need it."""
        return self._plan

    @functools.cached_property
    def _plan(self) -> SpacePlan:
        total = 0
        reasons: Counter[str] = Counter()
        excluded: Counter[str] = Counter()
        oom: list[tuple[ParallelLayout, Prediction]] = []
        feasible: list[tuple[ParallelLayout, Prediction]] = []
        for point in self.points():
            total += 1
            layout = self.layout_from_point(point)
            if layout is None:
                reasons[self._derivation_failure(point)] += 1
                continue
            problems = layout_violations(layout, self.model, self.world_size, self.global_batch)
            if problems:
                reasons[problems[0]] += 1
                continue
            if refused := self.refusals(layout):
                excluded[refused[0]] += 1
                continue
            prediction = self.predict(layout)
            (feasible if self.fits(prediction) else oom).append((layout, prediction))
        feasible.sort(key=lambda item: -getattr(item[1], self.objective))
        return SpacePlan(self, total, reasons, oom, feasible, excluded)

    def _derivation_failure(self, point: Mapping[str, Any]) -> str:
        tp, cp, pp = (point.get(name, self.dimensions[name][0]) for name in ("tp", "cp", "pp"))
        if self.world_size % (tp * cp * pp):
            return f"tp*cp*pp does not divide the world size {self.world_size}"
        return f"mbs*dp does not divide the global batch {self.global_batch}"


@dataclass
class SpacePlan:
    """A space sorted into what does not divide, what its rules exclude, what is predicted
    OOM and what can run."""

    space: SearchSpace
    total: int
    not_dividing: Counter[str]
    predicted_oom: list[tuple[ParallelLayout, Prediction]]
    feasible: list[tuple[ParallelLayout, Prediction]]
    excluded: Counter[str] = field(default_factory=Counter)

    @property
    def not_dividing_count(self) -> int:
        return sum(self.not_dividing.values())

    @property
    def excluded_count(self) -> int:
        return sum(self.excluded.values())

    def unreachable(self) -> list[str]:
        """Why each value of a searched dimension that no feasible layout takes is out of
        reach: at 128K tokens, say, why no layout at cp 1 fits. A value some layout divides
        at but none fits is named with its smallest layout and what fills its memory."""
        feasible = {
            (name, getattr(layout, name))
            for layout, _ in self.feasible
            for name in self.space.searched
        }
        reasons = []
        for name, values in self.space.searched.items():
            label = DIMENSIONS_BY_NAME[name].token
            for value in values:
                if (name, value) in feasible:
                    continue
                dividing = [item for item in self.predicted_oom if getattr(item[0], name) == value]
                shown = f"{name} {value}" if label.endswith("=") else f"{label}{value}"
                if not dividing:
                    reasons.append(f"{shown}: no layout divides or passes the space's rules")
                    continue
                layout, prediction = min(dividing, key=lambda item: item[1].memory.total)
                memory = prediction.memory
                states = memory.weights + memory.grads + memory.optimizer
                reasons.append(
                    f"{shown}: none of its {len(dividing)} dividing layouts fits; the smallest, "
                    f"{layout.short()}, needs {format_bytes(memory.total)} per rank "
                    f"(activations {format_bytes(memory.activations)}, weights, gradients "
                    f"and optimizer {format_bytes(states)}) against "
                    f"{format_bytes(self.space.memory_limit_bytes)}"
                )
        return reasons

    def best_by_value(self) -> dict[str, list[tuple[Any, int | None, float | None]]]:
        """For each searched dimension, each value's best feasible layout: its rank in
        :attr:`feasible` (1-based) and its objective as a share of the best's; ``None``
        where no layout with that value is feasible (:meth:`unreachable` says why)."""
        objective = self.space.objective
        top = getattr(self.feasible[0][1], objective) if self.feasible else None
        found: dict[tuple[str, Any], tuple[int, float]] = {}
        for rank, (layout, prediction) in enumerate(self.feasible, start=1):
            for name in self.space.searched:
                key = (name, getattr(layout, name))
                if key not in found and top:
                    found[key] = (rank, getattr(prediction, objective) / top)
        return {
            name: [(value, *found.get((name, value), (None, None))) for value in values]
            for name, values in self.space.searched.items()
        }

    def timeout_warning(self, top: int = 10) -> str | None:
        """Say so when some of the ``top`` predicted-best layouts would outlast the trial
        timeout: a campaign tries them last and kills them, so the space's optimum may
        never be measured; the fix (a longer timeout, fewer steps) is the user's to choose."""
        space = self.space
        limit, steps = space.trial_timeout_s, space.timed_steps
        needed = [p.step_time_s * steps for _, p in self.feasible[:top]]
        over = [seconds for seconds in needed if seconds > limit]
        if not over:
            return None
        return (
            f"{space.source}: {len(over)} of the {len(needed)} best predicted layouts need "
            f"longer than trainer.timeout ({limit:g} s) for their {steps} steps (up to "
            f"{max(over):.0f} s predicted); a campaign tries them last and kills them as "
            f"timeouts. Raise trainer.timeout to about {1.5 * max(needed):.0f} or lower "
            "trainer.steps"
        )

    def require_runnable(self, *, keep_predicted_oom: bool = False) -> None:
        """Raise a :class:`SpaceError` explaining why nothing in the space can run."""
        space = self.space
        if self.feasible or (keep_predicted_oom and self.predicted_oom):
            return
        if not self.predicted_oom and self.excluded:
            common = "; ".join(f"{reason} ({n}x)" for reason, n in self.excluded.most_common(3))
            raise SpaceError(
                f"of the {self.total} layouts in the space, {self.not_dividing_count} do not "
                f"divide and the space's exclude rules or what its trainer does not run "
                f"remove the other {self.excluded_count}: {common}. Widen 'search' or narrow "
                "the rules",
                source=space.source,
                field="exclude" if space.exclusions else "search",
            )
        if not self.predicted_oom:
            common = "; ".join(f"{reason} ({n}x)" for reason, n in self.not_dividing.most_common(3))
            raise SpaceError(
                f"no layout of the {self.total} in the space divides: {common}. World size is "
                f"{space.world_size} ({count_of(space.allocation.nodes, 'node')} x "
                f"{count_of(space.allocation.devices_per_node, 'device')}); choose tp, cp and pp "
                f"whose product divides it, tp dividing num_heads {space.model.num_heads} and "
                f"hidden_size {space.model.hidden_size}, pp dividing num_layers "
                f"{space.model.num_layers}",
                source=space.source,
                field="search",
            )
        smallest = min(self.predicted_oom, key=lambda item: item[1].memory.total)
        raise SpaceError(
            f"every one of the {len(self.predicted_oom)} dividing layouts is predicted to run "
            f"out of memory: the smallest, {smallest[0].short()}, needs "
            f"{format_bytes(smallest[1].memory.total)} per rank but the limit is "
            f"{format_bytes(space.memory_limit_bytes)}. Allow larger tp/pp, zero_stage or "
            f"recompute in 'search', more nodes, or a smaller model (or pass "
            f"--keep-predicted-oom to run them anyway)",
            source=space.source,
            field="search",
        )


def load_space(path: str | Path) -> SearchSpace:
    """Read and validate a search-space YAML file."""
    path = Path(path)
    return space_from_dict(read_document(path), source=str(path))


def space_from_dict(data: Any, *, source: str = "<dict>") -> SearchSpace:
    """Validate an already-parsed space (the store keeps spaces as loaded, as dicts)."""
    reader = _Reader(source)
    top = reader.mapping(data, "", _TOP_KEYS, required=("model", "allocation", "search"))
    model = reader.model(top["model"])
    allocation = reader.allocation(top["allocation"])
    global_batch = None
    if "global_batch" in top:
        global_batch = reader.positive_int(top["global_batch"], "global_batch")
    search = top["search"]
    precisions = search.get("precision", "auto") if isinstance(search, dict) else "auto"
    if isinstance(search, dict):
        search = {key: value for key, value in search.items() if key != "precision"}
    dimensions = reader.dimensions(search, has_global_batch=global_batch is not None)
    reader.context_splits(dimensions["cp"], model)
    objective = top.get("objective", "tokens_per_s")
    if objective not in OBJECTIVES:
        raise reader.error("objective", f"must be one of {list(OBJECTIVES)}, got {objective!r}")
    memory_cap = None
    if "memory_cap" in top:
        memory_cap = reader.size(top["memory_cap"], "memory_cap")
    trainer = reader.trainer(top.get("trainer", {"kind": "builtin"}))
    if trainer.get("launch") == "single" and allocation.nodes > 1:
        raise reader.error(
            "trainer.launch",
            f"single runs one process per trial, on one node, but the allocation has "
            f"{allocation.nodes} nodes; use per_node (a launcher such as torchrun) or per_rank",
        )
    estimate = reader.estimate(
        top.get("estimate", {}), trainer_kind=trainer["kind"], allocation=allocation
    )
    dimensions["precision"] = reader.gemm_precisions(precisions, estimate)
    allocation = _profiled_allocation(allocation, estimate.machine)
    exclusions = parse_exclusions(top["exclude"], dimensions, source) if "exclude" in top else ()
    name = top.get("name") or Path(source).stem
    if not isinstance(name, str):
        raise reader.error("name", f"must be a string, got {name!r}")
    if problem := name_problem(name):
        raise reader.error("name", f"cannot name a campaign: {problem}")
    description = top.get("description", "")
    if not isinstance(description, str):
        raise reader.error("description", f"must be a string, got {type(description).__name__}")
    return SearchSpace(
        name=name,
        source=source,
        model=model,
        allocation=allocation,
        dimensions=dimensions,
        global_batch=global_batch,
        objective=objective,
        memory_cap_bytes=memory_cap,
        trainer=trainer,
        estimate=estimate,
        description=description,
        raw=data,
        exclusions=exclusions,
    )


class _Reader:
    """Validation helpers that know which file they read, for error messages."""

    def __init__(self, source: str):
        self.source = source

    def error(self, field_name: str, message: str) -> SpaceError:
        return SpaceError(message, source=self.source, field=field_name or None)

    def mapping(
        self,
        value: Any,
        where: str,
        allowed: tuple[str, ...] | set[str],
        required: tuple[str, ...] = (),
    ) -> dict[str, Any]:
        if not isinstance(value, dict):
            kind = type(value).__name__ if value is not None else "nothing"
            raise self.error(where, f"must be a mapping of keys to values, got {kind}")
        for key in value:
            if key not in allowed:
                close = difflib.get_close_matches(str(key), list(allowed), n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise self.error(
                    _join(where, str(key)),
                    f"unknown key{hint}; valid keys here: {', '.join(sorted(allowed))}",
                )
        for key in required:
            if key not in value:
                raise self.error(_join(where, key), "is required but missing")
        return value

    def positive_int(self, value: Any, where: str, most: int = MAX_INT) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            shown = f"{most:.0e}" if most >= 10**7 else f"{most}"
            raise self.error(where, f"must be a positive integer in [1, {shown}], got {value!r}")
        return value

    def positive_number(self, value: Any, where: str) -> float:
        # NaN and infinity are floats too; either would poison every prediction or wait.
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not 0 < value < math.inf
        ):
            raise self.error(where, f"must be a positive finite number, got {value!r}")
        return float(value)

    def size(self, value: Any, where: str) -> int:
        try:
            return parse_bytes(value)
        except ValueError as error:
            raise self.error(where, str(error)) from None

    def rate(self, value: Any, where: str) -> float:
        try:
            return parse_rate(value)
        except ValueError as error:
            raise self.error(where, str(error)) from None

    def model(self, value: Any) -> ModelSpec:
        data = self.mapping(
            value,
            "model",
            _MODEL_KEYS,
            required=("num_layers", "hidden_size", "num_heads", "vocab_size", "seq_length"),
        )
        kwargs: dict[str, Any] = {}
        for key, item in data.items():
            if key in ("name", "arch"):
                kwargs[key] = str(item)
            elif item is None and key in ("ffn_hidden_size", "num_kv_heads", "moe"):
                continue
            elif key == "moe":
                kwargs[key] = self.moe(item)
            else:
                kwargs[key] = self.positive_int(item, f"model.{key}")
        try:
            return ModelSpec(**kwargs)
        except LayoutError as error:
            raise self.error("model", str(error)) from None

    def moe(self, value: Any) -> MoESpec:
        data = self.mapping(
            value,
            "model.moe",
            _MOE_KEYS,
            required=("num_experts", "top_k", "expert_ffn_hidden_size"),
        )
        kwargs: dict[str, Any] = {}
        for key, item in data.items():
            where = f"model.moe.{key}"
            if key == "capacity_factor":
                kwargs[key] = None if item is None else self.positive_number(item, where)
            elif key in ("shared_expert_ffn_hidden_size", "first_dense_layers"):
                if isinstance(item, bool) or not isinstance(item, int) or item < 0:
                    raise self.error(where, f"must be an integer >= 0, got {item!r}")
                kwargs[key] = item
            else:
                kwargs[key] = self.positive_int(item, where)
        try:
            return MoESpec(**kwargs)
        except LayoutError as error:
            raise self.error("model.moe", str(error)) from None

    def allocation(self, value: Any) -> AllocationSpec:
        data = self.mapping(
            value,
            "allocation",
            _ALLOCATION_KEYS,
            required=("nodes", "devices_per_node", "device_memory", "peak_tflops"),
        )
        device = data.get("device", "cuda")
        if device not in ("cuda", "cpu"):
            raise self.error("allocation.device", f"must be 'cuda' or 'cpu', got {device!r}")
        kwargs: dict[str, Any] = {
            "nodes": self.positive_int(data["nodes"], "allocation.nodes", MAX_NODES),
            "devices_per_node": self.positive_int(
                data["devices_per_node"], "allocation.devices_per_node", MAX_DEVICES_PER_NODE
            ),
            "device_memory_bytes": self.size(data["device_memory"], "allocation.device_memory"),
            "peak_flops_per_device": 1e12
            * self.positive_number(data["peak_tflops"], "allocation.peak_tflops"),
            "device": device,
            "name": str(data.get("name", "allocation")),
        }
        if "intra_node_bandwidth" in data:
            kwargs["intra_node_bandwidth_bytes_per_s"] = self.rate(
                data["intra_node_bandwidth"], "allocation.intra_node_bandwidth"
            )
        if "inter_node_bandwidth" in data:
            kwargs["inter_node_bandwidth_bytes_per_s"] = self.rate(
                data["inter_node_bandwidth"], "allocation.inter_node_bandwidth"
            )
        if "memory_bandwidth" in data:
            kwargs["memory_bandwidth_bytes_per_s"] = self.rate(
                data["memory_bandwidth"], "allocation.memory_bandwidth"
            )
        return AllocationSpec(**kwargs)

    def dimensions(self, value: Any, *, has_global_batch: bool) -> dict[str, tuple[Any, ...]]:
        if isinstance(value, dict) and "dp" in value:
            raise self.error(
                "search.dp",
                "dp is derived as world_size / (tp*cp*pp) and cannot be searched; remove it",
            )
        data = self.mapping(value, "search", DIMENSIONS, required=("tp", "pp", "mbs"))
        if "gas" not in data and not has_global_batch:
            raise self.error(
                "search.gas",
                "is required unless 'global_batch' is set (then gas = global_batch/(mbs*dp))",
            )
        dimensions: dict[str, tuple[Any, ...]] = {}
        for name in DIMENSIONS:
            if name in data:
                dimensions[name] = self._candidates(data[name], f"search.{name}", name)
            elif name in _DIMENSION_DEFAULTS:
                dimensions[name] = (_DIMENSION_DEFAULTS[name],)
        points = math.prod(len(values) for values in dimensions.values())
        if points > MAX_POINTS:
            raise self.error(
                "search",
                f"spans {points:.3g} combinations, more than {MAX_POINTS:.0e}: planning would "
                "take hours; give fewer candidates per dimension",
            )
        return dimensions

    def context_splits(self, candidates: tuple[int, ...], model: ModelSpec) -> None:
        """Every context-parallel degree must cut the sequence into 2*cp equal chunks (the
        load-balanced causal split Megatron-core and torchtitan require): a degree that
        cannot is a mistake in the space, not a layout to count as not dividing."""
        bad = [cp for cp in candidates if cp > 1 and model.seq_length % (2 * cp)]
        if not bad:
            return
        most = max(candidates)
        valid = [cp for cp in range(1, most + 1) if cp == 1 or model.seq_length % (2 * cp) == 0]
        raise self.error(
            "search.cp",
            f"cp {', '.join(map(str, bad))} cannot split seq_length {model.seq_length} into "
            f"2*cp equal chunks (context parallelism's causal load balancing); valid values "
            f"up to {most}: {', '.join(map(str, valid))}",
        )

    def _candidates(self, value: Any, where: str, name: str) -> tuple[Any, ...]:
        dimension = DIMENSIONS_BY_NAME[name]
        if dimension.kind == "choice":
            values = value if isinstance(value, list) else [value]
            bad = [v for v in values if v not in dimension.choices]
            if bad or not values:
                raise self.error(
                    where, f"values must be from {list(dimension.choices)}, got {value!r}"
                )
            return tuple(dict.fromkeys(values))
        if dimension.kind == "bool":
            values = value if isinstance(value, list) else [value]
            if not values or any(not isinstance(v, bool) for v in values):
                raise self.error(where, f"values must be true/false, got {value!r}")
            return tuple(dict.fromkeys(values))
        minimum = dimension.minimum
        if isinstance(value, dict):
            values = self._range(value, where)
        elif isinstance(value, list):
            values = value
            if len(values) > MAX_CANDIDATES:
                raise self.error(
                    where, f"lists {len(values)} candidates, more than {MAX_CANDIDATES}"
                )
        else:
            values = [value]
        for item in values:
            if isinstance(item, bool) or not isinstance(item, int) or item < minimum:
                raise self.error(
                    where, f"values must be integers >= {minimum}, got {item!r} in {value!r}"
                )
        if dimension.maximum is not None and any(item > dimension.maximum for item in values):
            *allowed, last = range(minimum, dimension.maximum + 1)
            raise self.error(
                where,
                f"{name} values must be {', '.join(map(str, allowed))} or {last}, got {value!r}",
            )
        if not values:
            raise self.error(where, f"is empty: {value!r} gives no candidate")
        return tuple(sorted(set(values)))

    def _range(self, value: dict[str, Any], where: str) -> list[int]:
        """``{pow2: [lo, hi]}`` or ``{range: [lo, hi], step: k}``."""
        forms = "{pow2: [lo, hi]} or {range: [lo, hi], step: k}"
        keys = set(value)
        if keys == {"pow2"}:
            low, high = self._bounds(value["pow2"], f"{where}.pow2")
            first = 1 << max(0, math.ceil(math.log2(low)))
            values = []
            power = first
            while power <= high:
                values.append(power)
                power *= 2
            if not values:
                raise self.error(where, f"no power of two lies in [{low}, {high}]")
            return values
        if keys in ({"range"}, {"range", "step"}):
            low, high = self._bounds(value["range"], f"{where}.range")
            step = self.positive_int(value.get("step", 1), f"{where}.step")
            values = range(low, high + 1, step)
            if len(values) > MAX_CANDIDATES:
                raise self.error(
                    where,
                    f"gives {len(values)} candidates, more than {MAX_CANDIDATES}; narrow the "
                    "range, raise its step or use {pow2: [lo, hi]}",
                )
            return list(values)
        raise self.error(where, f"a range must be written {forms}, got {value!r}")

    def _bounds(self, value: Any, where: str) -> tuple[int, int]:
        if (
            not isinstance(value, list)
            or len(value) != 2
            or any(isinstance(v, bool) or not isinstance(v, int) for v in value)
        ):
            raise self.error(where, f"must be two integers [low, high], got {value!r}")
        low, high = value
        if low < 1 or high < low:
            raise self.error(where, f"is empty: need 1 <= low <= high, got [{low}, {high}]")
        return low, high

    def gemm_precisions(self, value: Any, estimate: EstimateSettings) -> tuple[str, ...]:
        """``search.precision``: the matmuls' precisions, named as a user names them (the
        space's own ``estimate.precision``, e.g. bf16, or fp8), as layout values (``auto``
        for the space's own, so a layout stored before the dimension keeps its key). FP8
        only where the device profile gives an FP8 peak (:func:`fp8_refusal`)."""
        values = value if isinstance(value, list) else [value]
        own = estimate.precision
        valid = [own, "fp8"]
        bad = [v for v in values if v not in (*valid, "auto")]
        if bad or not values:
            raise self.error(
                "search.precision",
                f"values must be from {valid} (this space's estimate.precision is {own}), "
                f"got {value!r}",
            )
        chosen = tuple(dict.fromkeys("fp8" if v == "fp8" else "auto" for v in values))
        if "fp8" in chosen and (problem := fp8_refusal(estimate)):
            raise self.error("search.precision", problem)
        return chosen

    def trainer(self, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.error("trainer", f"must be a mapping, got {type(value).__name__}")
        kind = value.get("kind", "builtin")
        if not isinstance(kind, str) or kind not in TRAINER_KINDS:
            raise self.error("trainer.kind", f"must be one of {list(TRAINER_KINDS)}, got {kind!r}")
        return TRAINER_KINDS[kind].validate(value, self.source)

    def estimate(
        self, value: Any, *, trainer_kind: str, allocation: AllocationSpec
    ) -> EstimateSettings:
        """The estimate's settings; its memory accounting follows the trainer unless set:
        the built-in trainer's own (``torch``) or Megatron's for a command trainer. Its
        precision follows the device unless set: CPUs train in fp32 (the built-in trainer's
        ``auto``, and what a DeepSpeed or HF program does there unless told otherwise), so a CPU
        campaign's memory is counted in fp32 and ``best --format deepspeed`` turns no 16-bit
        mode on that never ran. A ``machine`` profile (a path relative to the space file)
        replaces its constants."""
        data = self.mapping(value, "estimate", _ESTIMATE_KEYS)
        kwargs: dict[str, Any] = {
            "framework": "torch" if trainer_kind == "builtin" else "megatron",
            "precision": "fp32" if allocation.device == "cpu" else "bf16",
        }
        machine = None
        for key, item in data.items():
            where = f"estimate.{key}"
            if key == "machine":
                if not isinstance(item, str) or not item:
                    raise self.error(
                        where,
                        f"must name a shipped machine profile or the path of one, got {item!r}",
                    )
                machine = load_profile(resolve(item, Path(self.source).parent))
            elif key == "precision":
                if item not in ("bf16", "fp16", "fp32"):
                    raise self.error(where, f"must be 'bf16', 'fp16' or 'fp32', got {item!r}")
                kwargs[key] = item
            elif key in ("flash_attention", "dropout"):
                if not isinstance(item, bool):
                    raise self.error(where, f"must be true or false, got {item!r}")
                kwargs[key] = item
            elif key == "framework":
                if item not in FRAMEWORKS:
                    raise self.error(where, f"must be one of {list(FRAMEWORKS)}, got {item!r}")
                kwargs[key] = item
            elif key == "runtime_overhead":
                kwargs["runtime_overhead_bytes"] = self.size(item, where)
            elif key in ("compute_efficiency", "dp_overlap"):
                number = self.positive_number(item, where)
                if number > 1:
                    raise self.error(where, f"must lie in (0, 1], got {item!r}")
                kwargs[key] = number
            else:
                kwargs[key] = self.positive_number(item, where)
        settings = EstimateSettings(**kwargs)
        if machine is None:
            return settings
        check_profile(machine, allocation, settings.precision, source=machine.path)
        return with_machine(settings, machine, allocation)


def _profiled_allocation(
    allocation: AllocationSpec, profile: MachineProfile | None
) -> AllocationSpec:
    """The allocation with a profile's usable memory per device, when it gives one."""
    if profile is None or profile.device_memory_bytes is None:
        return allocation
    return dataclasses.replace(allocation, device_memory_bytes=int(profile.device_memory_bytes))


def apply_profile(space: SearchSpace, path: str | Path) -> SearchSpace:
    """``space`` estimated with the profile at ``path`` or shipped under that name
    (``run/plan --machine``)."""
    return space_with_profile(space, load_profile(path))


def fp8_refusal(estimate: EstimateSettings) -> str:
    """Why this space's device cannot train in FP8 ("" where it can): FP8 matmuls need a
    device profile with an FP8 peak (H100, H200; not A100 or MI250X)."""
    machine = estimate.machine
    if machine is None:
        return (
            "fp8 needs a device profile with an FP8 peak (estimate.machine: h100-sxm-dgx or "
            "h200-sxm-hgx); this space names none"
        )
    if machine.fp8_peak_flops is None:
        return (
            f"fp8 needs a device with FP8 tensor cores; profile {machine.name} "
            f"({machine.device or machine.path}) gives no fp8_peak_tflops (H100 and H200 do; "
            "A100 and MI250X have no FP8)"
        )
    return ""


def space_with_profile(space: SearchSpace, profile: MachineProfile) -> SearchSpace:
    check_profile(profile, space.allocation, space.estimate.precision, source=profile.path)
    estimate = with_machine(space.estimate, profile, space.allocation)
    if "fp8" in space.dimensions.get("precision", ()) and (problem := fp8_refusal(estimate)):
        raise SpaceError(problem, source=space.source, field="search.precision")
    allocation = _profiled_allocation(space.allocation, profile)
    return dataclasses.replace(space, estimate=estimate, allocation=allocation)


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key
