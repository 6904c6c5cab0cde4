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
# The layout's GEMM precision: "auto" runs the matmuls in the space's ``estimate.precision``
# (what it stores weights and activations in); "fp8" runs the linear layers' matmuls in FP8.
GemmPrecision = Literal["auto", "fp8"]
GEMM_PRECISION_CHOICES: tuple[str, ...] = ("auto", "fp8")


@dataclass(frozen=True)
class MoESpec:
    """The mixture-of-experts part of a model (Megatron-core's MoE arguments).

    ``num_experts`` routed experts, ``top_k`` of them per token, each a SwiGLU FFN of
    width ``expert_ffn_hidden_size``; ``shared_expert_ffn_hidden_size`` (0: none) is the
    width of the shared experts every token also passes (DeepSeek's, summed). A layer is
    MoE when its index ``i`` (0-based) is at least ``first_dense_layers`` and ``i %
    layer_freq == 0`` (Megatron's ``--moe-layer-freq``; DeepSeek-V3's first three dense
    layers); the others keep the model's dense FFN. ``capacity_factor`` ``None`` is
    dropless routing, else each expert takes at most ``capacity_factor · tokens·k/E``.
    """

    num_experts: int
    top_k: int
    expert_ffn_hidden_size: int
    shared_expert_ffn_hidden_size: int = 0
    layer_freq: int = 1
    first_dense_layers: int = 0
    capacity_factor: float | None = None

    def __post_init__(self) -> None:
        for name in ("num_experts", "top_k", "expert_ffn_hidden_size", "layer_freq"):
            if getattr(self, name) < 1:
                raise LayoutError(f"model.moe.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("shared_expert_ffn_hidden_size", "first_dense_layers"):
            if getattr(self, name) < 0:
                raise LayoutError(f"model.moe.{name} must be >= 0, got {getattr(self, name)}")
        if self.top_k > self.num_experts:
            raise LayoutError(
                f"model.moe.top_k ({self.top_k}) must be at most model.moe.num_experts "
                f"({self.num_experts})"
            )
        if self.capacity_factor is not None and not self.capacity_factor > 0:
            raise LayoutError(
                f"model.moe.capacity_factor must be > 0 (or left out: dropless), got "
                f"{self.capacity_factor}"
            )

    def is_moe_layer(self, index: int) -> bool:
        return index >= self.first_dense_layers and index % self.layer_freq == 0


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
    moe: MoESpec | None = None

    def __post_init__(self) -> None:
        if isinstance(self.moe, dict):  # from a TrialSpec's or a store's JSON
            object.__setattr__(self, "moe", MoESpec(**self.moe))
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

    @property
    def moe_layers(self) -> int:
        """How many of the layers are MoE layers (0 for a dense model)."""
        if self.moe is None:
            return 0
        return sum(self.moe.is_moe_layer(i) for i in range(self.num_layers))


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


@dataclass(frozen=True)
class Dimension:
    """What every listing of layouts needs to know of one layout field: a table column, a
    short-form token, a filter's bounds, a placeholder's description, a search feature.

    Declared once, beside the field (:func:`_dimension`); the places that only *list*
    dimensions read :data:`LAYOUT_DIMENSIONS`, so a new one is a field here plus its rules in
    :func:`layout_violations`, and only the code that gives it meaning (estimate, trainer,
    exports) changes. ``kind``: ``int`` (a degree or count), ``choice`` (one of ``choices``)
    or ``bool``. ``token``: the short form's prefix (``tp`` for ``tp2``, ``rc=`` for
    ``rc=full``, ``sp`` for a true flag). ``help``: what it is, for placeholder tables and API docs;
    ``heading`` and ``placeholder``: its table column and command-template name where these
    are not its name. ``always_shown``: in the short form even at its
    default. ``searched``: a space may search it (``dp`` is derived). ``keyed_at_default``:
    the field enters a layout's key at its default; ``False`` for a dimension added after
    stores existed, so a layout stored before it keeps its identity. ``order``: where it
    stands in tables and short forms (Megatron's rank order for the parallel degrees).
    """

    name: str
    kind: Literal["int", "choice", "bool"]
    default: Any
    token: str
    help: str
    order: int
    minimum: int = 1
    maximum: int | None = None
    choices: tuple[str, ...] = ()
    always_shown: bool = False
    searched: bool = True
    keyed_at_default: bool = True
    heading: str = ""
    placeholder: str = ""

    @property
    def slot(self) -> str:
        """Its name in a command template (``{tp}``): the name, or ``placeholder``."""
        return self.placeholder or self.name

    @property
    def label(self) -> str:
        """A table's column header: the name, or ``heading`` where the name is long."""
        return self.heading or self.name

    def shows(self, value: Any) -> str:
        """``value`` in the short form, or "" where the short form leaves it out."""
        if not self.always_shown and value == self.default:
            return ""
        if self.kind == "bool":
            return self.token if value else ""
        return f"{self.token}{value}"

    def cell(self, value: Any) -> str:
        """``value`` in a table cell."""
        if self.kind == "bool":
            return "y" if value else "n"
        return str(value)

    def coerce(self, value: Any) -> Any:
        """``value`` as the field's type (a store's JSON, a query string, a YAML scalar)."""
        if self.kind == "int":
            return int(value)
        if self.kind == "bool":
            return _as_bool(value)
        return str(value)


def _dimension(default: Any = dataclasses.MISSING, **declared: Any) -> Any:
    """A layout field and its :class:`Dimension` (named when the class is built)."""
    return dataclasses.field(default=default, metadata={"dimension": declared})


@dataclass(frozen=True, order=True)
class ParallelLayout:
    """One point of the search: how a training step is split over ``tp*cp*pp*dp`` ranks.

    ``ep`` and ``etp`` split a mixture-of-experts model's experts over the same ranks
    (Megatron's folding: they use no ranks of their own).

    ``gas`` is the number of micro-batches per step per data-parallel replica; it is also the
    number of micro-batches the pipeline schedule sees. ``cp`` splits every sequence over
    that many ranks (context parallelism, ring attention); ranks are ordered tp-cp-dp-pp,
    innermost first, as Megatron places them. A new field goes last (positional
    construction stays valid) and says where it shows with ``order``.
    """

    tp: int = _dimension(
        kind="int", token="tp", order=10, always_shown=True, help="tensor-parallel size"
    )
    pp: int = _dimension(
        kind="int", token="pp", order=30, always_shown=True, help="pipeline-parallel size"
    )
    dp: int = _dimension(
        kind="int",
        token="dp",
        order=40,
        always_shown=True,
        searched=False,
        help="data-parallel size (world_size / (tp*cp*pp))",
    )
    mbs: int = _dimension(
        kind="int",
        token="mbs",
        order=50,
        always_shown=True,
        help="micro-batch size (sequences per rank per micro-step)",
    )
    gas: int = _dimension(
        kind="int",
        token="gas",
        order=60,
        always_shown=True,
        help="micro-batches per step per data-parallel replica",
    )
    zero_stage: int = _dimension(
        0,
        kind="int",
        token="z",
        order=70,
        minimum=0,
        maximum=3,
        heading="zero",
        help="ZeRO / optimizer-sharding stage (0-3)",
    )
    recompute: Recompute = _dimension(
        "none",
        kind="choice",
        token="rc=",
        order=80,
        choices=RECOMPUTE_CHOICES,
        heading="recomp",
        help="activation recompute: none, selective or full",
    )
    vpp: int = _dimension(
        1,
        kind="int",
        token="vpp",
        order=90,
        help="virtual pipeline stages per pipeline rank (1: no interleaving)",
    )
    sequence_parallel: bool = _dimension(
        False,
        kind="bool",
        token="sp",
        order=100,
        heading="sp",
        placeholder="seq_parallel",
        help="sequence parallelism: true or false",
    )
    cp: int = _dimension(
        1,
        kind="int",
        token="cp",
        order=20,
        keyed_at_default=False,
        help="context-parallel size: each sequence split over cp ranks (ring attention)",
    )
    ep: int = _dimension(
        1,
        kind="int",
        token="ep",
        order=24,
        keyed_at_default=False,
        help="expert-parallel size: the routed experts split over ep ranks (MoE models)",
    )
    etp: int = _dimension(
        1,
        kind="int",
        token="etp",
        order=26,
        keyed_at_default=False,
        help="expert tensor-parallel size: 1 or tp (MoE models)",
    )
    precision: GemmPrecision = _dimension(
        "auto",
        kind="choice",
        token="p=",
        order=110,
        choices=GEMM_PRECISION_CHOICES,
        keyed_at_default=False,
        heading="gemm",
        help=(
            "precision of the linear layers' matmuls: auto (the space's estimate.precision; a "
            "space lists it by that name, e.g. bf16) or fp8 (devices whose profile has an FP8 "
            "peak: H100, H200)"
        ),
    )

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step."""
        return self.mbs * self.gas * self.dp

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ParallelLayout:
        """The layout ``data`` describes; a field it leaves out takes its default, so a
        layout stored before a dimension existed reads back."""
        unknown = sorted(set(data) - set(DIMENSIONS_BY_NAME))
        if unknown:
            raise LayoutError(
                f"unknown layout fields {unknown}; valid: {sorted(DIMENSIONS_BY_NAME)}"
            )
        return cls(**{name: DIMENSIONS_BY_NAME[name].coerce(value) for name, value in data.items()})

    def key(self) -> str:
        """Canonical identity within a campaign: equal layouts give equal keys, and a
        dimension added later leaves the keys of layouts at its default as they were."""
        keyed = {
            d.name: getattr(self, d.name)
            for d in LAYOUT_DIMENSIONS
            if d.keyed_at_default or getattr(self, d.name) != d.default
        }
        text = json.dumps(keyed, sort_keys=True, separators=(",", ":"))
        return hashlib.sha1(text.encode()).hexdigest()[:16]

    def short(self) -> str:
        """Human-readable one-liner, e.g. ``tp2 cp2 pp4 dp16 mbs1 gas8 z1 rc=full``."""
        shown = (d.shows(getattr(self, d.name)) for d in LAYOUT_DIMENSIONS)
        return " ".join(text for text in shown if text)


def _declared_dimensions() -> tuple[Dimension, ...]:
    declared = [
        Dimension(
            name=f.name,
            default=None if f.default is dataclasses.MISSING else f.default,
            **f.metadata["dimension"],
        )
        for f in dataclasses.fields(ParallelLayout)
    ]
    return tuple(sorted(declared, key=lambda d: d.order))


# The layout's dimensions in display order (tables, short forms, filters).
LAYOUT_DIMENSIONS: tuple[Dimension, ...] = _declared_dimensions()
DIMENSIONS_BY_NAME: dict[str, Dimension] = {d.name: d for d in LAYOUT_DIMENSIONS}


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
    for dimension in LAYOUT_DIMENSIONS:
        value = getattr(layout, dimension.name)
        if dimension.kind == "int" and value < dimension.minimum:
            problems.append(f"{dimension.name} must be >= {dimension.minimum} (got {value})")
    if problems:
        return problems
    if layout.world_size != world_size:
        problems.append(
            f"tp*cp*pp*dp = {layout.tp}*{layout.cp}*{layout.pp}*{layout.dp} = "
            f"{layout.world_size} != world size {world_size}"
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
    problems.extend(_sequence_split_violations(layout, model))
    problems.extend(_expert_violations(layout, model))
    if layout.zero_stage not in (0, 1, 2, 3):
        problems.append(f"zero_stage must be 0, 1, 2 or 3 (got {layout.zero_stage})")
    if layout.zero_stage and layout.dp * layout.cp == 1:
        # Megatron's distributed optimizer and torchtitan's FSDP shard over dp*cp.
        problems.append("zero_stage > 0 shards over data parallel ranks and needs dp*cp > 1")
    if layout.precision not in GEMM_PRECISION_CHOICES:
        problems.append(f"precision must be one of {list(GEMM_PRECISION_CHOICES)}")
    if layout.recompute not in RECOMPUTE_CHOICES:
        problems.append(f"recompute must be one of {list(RECOMPUTE_CHOICES)}")
    if global_batch is not None and layout.global_batch != global_batch:
        problems.append(
            f"mbs*gas*dp = {layout.mbs}*{layout.gas}*{layout.dp} = {layout.global_batch} "
            f"!= global batch {global_batch}"
        )
    return problems


def _sequence_split_violations(layout: ParallelLayout, model: ModelSpec) -> list[str]:
    """How the sequence must divide: context parallelism cuts it into 2*cp chunks, each
    rank holding chunks i and 2cp-1-i so the causal mask's work is even (Megatron-core and
    torchtitan both require it); sequence parallelism further splits each rank's part over
    tp (torchtitan's ``seq_len % (tp*2*cp)``)."""
    chunks = 2 * layout.cp if layout.cp > 1 else 1
    split = chunks * (layout.tp if layout.sequence_parallel else 1)
    if model.seq_length % split == 0:
        return []
    parts = []
    if layout.cp > 1:
        parts.append(f"2*cp = 2*{layout.cp}")
    if layout.sequence_parallel:
        parts.append(f"tp {layout.tp}")
    what = " times ".join(parts)
    return [f"seq_length {model.seq_length} not divisible by {what} (= {split})"]


def _expert_violations(layout: ParallelLayout, model: ModelSpec) -> list[str]:
    """Megatron-core's "parallel folding": per pipeline stage the experts' etp·ep·edp ranks
    are the attention's tp·cp·dp, so etp·ep must divide tp·cp·dp (edp is the rest); ep must
    divide the routed experts; expert TP is 1 or the attention's tp."""
    if model.moe is None:
        return [
            f"{name} > 1 needs a mixture-of-experts model (model.moe)"
            for name in ("ep", "etp")
            if getattr(layout, name) > 1
        ]
    moe, problems = model.moe, []
    if moe.num_experts % layout.ep:
        problems.append(f"num_experts {moe.num_experts} not divisible by ep {layout.ep}")
    if layout.etp not in (1, layout.tp):
        problems.append(f"etp must be 1 or tp ({layout.tp}), got {layout.etp}")
    if moe.expert_ffn_hidden_size % layout.etp:
        problems.append(
            f"expert_ffn_hidden_size {moe.expert_ffn_hidden_size} not divisible by etp {layout.etp}"
        )
    attention_ranks = layout.tp * layout.cp * layout.dp
    if attention_ranks % (layout.etp * layout.ep):
        problems.append(
            f"etp*ep = {layout.etp}*{layout.ep} does not divide tp*cp*dp = "
            f"{layout.tp}*{layout.cp}*{layout.dp} (Megatron's expert folding: "
            "etp*ep*edp = tp*cp*dp per pipeline stage)"
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
