"""The three configuration types every other module speaks: model, allocation, layout.

Like torchtitan's ``ParallelDims``, the divisibility rules of a layout live in exactly one
function, :func:`layout_violations`. The space enumerator, the DeepHyper constraint, the
trainer and the CLI all ask it, so they can never disagree about what is runnable.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

from parsearch.errors import LayoutError

Recompute = Literal["none", "selective", "full"]
RECOMPUTE_CHOICES: tuple[str, ...] = ("none", "selective", "full")
Arch = Literal["gpt", "llama"]
Precision = Literal["bf16", "fp16", "fp32"]


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a decoder-only transformer.

    ``arch="gpt"``: GELU MLP, biases, LayerNorm, learned positions, tied embeddings
    (Megatron's GPT). ``arch="llama"``: SwiGLU MLP, no biases, RMSNorm, rotary positions,
    untied embeddings, optional grouped-query attention (``num_kv_heads``).
    """

    num_layers: int
    hidden_size: int
    num_heads: int
    vocab_size: int
    seq_length: int
    ffn_hidden_size: int | None = None
    num_kv_heads: int | None = None
    arch: Arch = "gpt"
    name: str = "model"

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_heads", "vocab_size", "seq_length"):
            if getattr(self, name) < 1:
                raise LayoutError(f"model.{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads:
            raise LayoutError(
                f"model.hidden_size ({self.hidden_size}) must be a multiple of "
                f"model.num_heads ({self.num_heads})"
            )
        if self.arch not in ("gpt", "llama"):
            raise LayoutError(f"model.arch must be 'gpt' or 'llama', got {self.arch!r}")
        if self.num_kv_heads is not None and (
            self.num_kv_heads < 1 or self.num_heads % self.num_kv_heads
        ):
            raise LayoutError(
                f"model.num_kv_heads ({self.num_kv_heads}) must divide "
                f"model.num_heads ({self.num_heads})"
            )

    @property
    def ffn(self) -> int:
        """FFN width; 4h by default, as in GPT and Megatron."""
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def tied_embeddings(self) -> bool:
        return self.arch == "gpt"

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(frozen=True)
class AllocationSpec:
    """The hardware a campaign runs on: how many devices, how big and fast each is."""

    nodes: int
    devices_per_node: int
    device_memory_bytes: int
    peak_flops_per_device: float
    intra_node_bandwidth_bytes_per_s: float = 100e9
    inter_node_bandwidth_bytes_per_s: float = 25e9
    device: Literal["cpu", "cuda"] = "cuda"
    # Device memory bandwidth (an A100's ~2 TB/s by default): what an unfused attention
    # softmax, which streams every score through memory, runs at.
    memory_bandwidth_bytes_per_s: float = 2.0e12
    name: str = "allocation"

    def __post_init__(self) -> None:
        for name in ("nodes", "devices_per_node", "device_memory_bytes"):
            if getattr(self, name) < 1:
                raise LayoutError(f"allocation.{name} must be >= 1, got {getattr(self, name)}")
        if self.peak_flops_per_device <= 0:
            raise LayoutError("allocation.peak_flops_per_device must be > 0")

    @property
    def world_size(self) -> int:
        return self.nodes * self.devices_per_node


@dataclass(frozen=True, order=True)
class ParallelLayout:
    """One point of the search: how a training step is split over ``tp*pp*dp`` ranks.

    ``gas`` is the number of micro-batches per step per data-parallel replica; it is also the
    number of micro-batches the pipeline schedule sees.
    """

    tp: int
    pp: int
    dp: int
    mbs: int
    gas: int
    zero_stage: int = 0
    recompute: Recompute = "none"
    vpp: int = 1
    sequence_parallel: bool = False

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step."""
        return self.mbs * self.gas * self.dp

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ParallelLayout:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise LayoutError(f"unknown layout fields {unknown}; valid: {sorted(names)}")
        values = dict(data)
        for name in ("tp", "pp", "dp", "mbs", "gas", "zero_stage", "vpp"):
            if name in values:
                values[name] = int(values[name])
        if "sequence_parallel" in values:
            values["sequence_parallel"] = _as_bool(values["sequence_parallel"])
        if "recompute" in values:
            values["recompute"] = str(values["recompute"])
        return cls(**values)

    def key(self) -> str:
        """Canonical identity within a campaign: equal layouts give equal keys."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha1(text.encode()).hexdigest()[:16]

    def short(self) -> str:
        """Human-readable one-liner, e.g. ``tp2 pp4 dp16 mbs1 gas8 z1 rc=full``."""
        text = f"tp{self.tp} pp{self.pp} dp{self.dp} mbs{self.mbs} gas{self.gas}"
        if self.zero_stage:
            text += f" z{self.zero_stage}"
        if self.recompute != "none":
            text += f" rc={self.recompute}"
        if self.vpp > 1:
            text += f" vpp{self.vpp}"
        if self.sequence_parallel:
            text += " sp"
        return text


def _as_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def layout_violations(
    layout: ParallelLayout,
    model: ModelSpec,
    world_size: int,
    global_batch: int | None = None,
) -> list[str]:
    """Every divisibility rule ``layout`` breaks, as readable sentences (empty: runnable).

    The single source of truth for feasibility-by-construction; memory is judged elsewhere
    (the estimate), because it is a prediction, not a rule.
    """
    problems: list[str] = []
    for name in ("tp", "pp", "dp", "mbs", "gas", "vpp"):
        if getattr(layout, name) < 1:
            problems.append(f"{name} must be >= 1 (got {getattr(layout, name)})")
    if problems:
        return problems
    if layout.world_size != world_size:
        problems.append(
            f"tp*pp*dp = {layout.tp}*{layout.pp}*{layout.dp} = {layout.world_size} "
            f"!= world size {world_size}"
        )
    if model.num_heads % layout.tp:
        problems.append(f"num_heads {model.num_heads} not divisible by tp {layout.tp}")
    if model.kv_heads % layout.tp:
        problems.append(f"num_kv_heads {model.kv_heads} not divisible by tp {layout.tp}")
    if model.hidden_size % layout.tp:
        problems.append(f"hidden_size {model.hidden_size} not divisible by tp {layout.tp}")
    if model.ffn % layout.tp:
        problems.append(f"ffn_hidden_size {model.ffn} not divisible by tp {layout.tp}")
    stages = layout.pp * layout.vpp
    if model.num_layers % stages:
        problems.append(
            f"num_layers {model.num_layers} not divisible by pp*vpp = {layout.pp}*{layout.vpp}"
        )
    if layout.vpp > 1 and layout.pp == 1:
        problems.append("vpp > 1 needs pp > 1 (interleaving splits pipeline stages)")
    if layout.vpp > 1 and layout.gas % layout.pp:
        problems.append(
            f"interleaved schedule needs gas ({layout.gas}) to be a multiple of pp ({layout.pp})"
        )
    if layout.sequence_parallel and layout.tp == 1:
        problems.append("sequence_parallel needs tp > 1")
    if layout.sequence_parallel and model.seq_length % layout.tp:
        problems.append(f"seq_length {model.seq_length} not divisible by tp {layout.tp}")
    if layout.zero_stage not in (0, 1, 2, 3):
        problems.append(f"zero_stage must be 0, 1, 2 or 3 (got {layout.zero_stage})")
    if layout.zero_stage and layout.dp == 1:
        problems.append("zero_stage > 0 shards over data parallel ranks and needs dp > 1")
    if layout.recompute not in RECOMPUTE_CHOICES:
        problems.append(f"recompute must be one of {list(RECOMPUTE_CHOICES)}")
    if global_batch is not None and layout.global_batch != global_batch:
        problems.append(
            f"mbs*gas*dp = {layout.mbs}*{layout.gas}*{layout.dp} = {layout.global_batch} "
            f"!= global batch {global_batch}"
        )
    return problems


def check_layout(
    layout: ParallelLayout,
    model: ModelSpec,
    world_size: int,
    global_batch: int | None = None,
) -> ParallelLayout:
    """Return ``layout`` if it is runnable, else raise :class:`LayoutError` listing why."""
    problems = layout_violations(layout, model, world_size, global_batch)
    if problems:
        raise LayoutError(f"layout {layout.short()} is invalid: " + "; ".join(problems))
    return layout
