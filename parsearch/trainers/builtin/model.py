"""A decoder-only transformer you can read in one sitting, free of any parallelism.

Parallelism is applied from outside (:mod:`parsearch.trainers.builtin.parallelize`), as in
torchtitan, so this file only describes the maths. Three things in it exist for the parallel
code's sake:

* layers live in a ``ModuleDict`` keyed by their global index, and every optional part
  (embeddings, final norm, output) may be ``None``, so a pipeline stage is this same class
  with the other layers deleted and parameter names stay global;
* attention reshapes with ``-1`` heads, so tensor-parallel ranks that hold ``heads/tp`` heads
  run the same code, and the attention core is its own module so it can be checkpointed alone
  (selective recompute) or replaced by ring attention (context parallelism);
* the model keeps the positions of the tokens it is fed (:meth:`Transformer.hold_positions`),
  so a context-parallel rank fed two chunks of each sequence embeds and rotates them by
  their real positions.

Weights are initialised by :func:`init_weights` from a generator seeded with the seed and the
parameter's global name, so every layout (any TP/PP/DP split) starts from identical weights
without ever materialising the whole model on one rank.
"""

from __future__ import annotations

import hashlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from parsearch.config import ModelSpec
from parsearch.trainers.builtin.moe import Experts, MoE

INIT_STD = 0.02


def _norm(spec: ModelSpec) -> nn.Module:
    if spec.arch == "llama":
        return nn.RMSNorm(spec.hidden_size, eps=1e-5)
    return nn.LayerNorm(spec.hidden_size, eps=1e-5)


class Embeddings(nn.Module):
    """Token embedding plus learned positions (GPT) in one module, so tensor parallelism can
    treat "tokens in, hidden states out" as a single unit."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.tok = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.pos = nn.Embedding(spec.seq_length, spec.hidden_size) if spec.arch == "gpt" else None

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens)
        if self.pos is not None:
            x = x + self.pos(positions)
        return x


def rotary_tables(spec: ModelSpec, positions: torch.Tensor) -> torch.Tensor:
    """cos and sin of the rotary angles of ``positions``, stacked as
    ``[2, len(positions), head_dim/2]`` (fp32)."""
    half = spec.head_dim // 2
    device = positions.device
    inv_freq = 1.0 / (10000.0 ** (torch.arange(half, device=device, dtype=torch.float32) / half))
    angles = torch.outer(positions.to(torch.float32), inv_freq)
    return torch.stack([angles.cos(), angles.sin()])


def apply_rotary(x: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` of shape ``[batch, seq, heads, head_dim]`` by position (rotate-half form)."""
    seq = x.shape[1]
    cos = tables[0, :seq, None, :].to(x.dtype)
    sin = tables[1, :seq, None, :].to(x.dtype)
    first, second = x.chunk(2, dim=-1)
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


class CausalCore(nn.Module):
    """Softmax(QKᵀ)V with a causal mask: the part selective recompute checkpoints."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [batch, heads, seq, head_dim]
        if k.shape[1] != q.shape[1]:  # grouped-query attention: share each K/V head
            repeat = q.shape[1] // k.shape[1]
            k = k.repeat_interleave(repeat, dim=1)
            v = v.repeat_interleave(repeat, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(1, 2)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        bias = spec.arch == "gpt"
        self.head_dim = spec.head_dim
        kv_width = spec.kv_heads * spec.head_dim
        self.wq = nn.Linear(spec.hidden_size, spec.hidden_size, bias=bias)
        self.wk = nn.Linear(spec.hidden_size, kv_width, bias=bias)
        self.wv = nn.Linear(spec.hidden_size, kv_width, bias=bias)
        self.wo = nn.Linear(spec.hidden_size, spec.hidden_size, bias=bias)
        self.core = CausalCore()

    def forward(self, x: torch.Tensor, rotary: torch.Tensor | None = None) -> torch.Tensor:
        batch, seq, _ = x.shape
        # -1 heads: under tensor parallelism each rank sees only its heads/tp local heads.
        q = self.wq(x).view(batch, seq, -1, self.head_dim)
        k = self.wk(x).view(batch, seq, -1, self.head_dim)
        v = self.wv(x).view(batch, seq, -1, self.head_dim)
        if rotary is not None:
            q, k = apply_rotary(q, rotary), apply_rotary(k, rotary)
        out = self.core(q, k, v)
        return self.wo(out.reshape(batch, seq, -1))


class FeedForward(nn.Module):
    """GELU MLP (GPT) or SwiGLU (llama: ``w2(silu(w1 x) * w3 x)``)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        bias = spec.arch == "gpt"
        self.w1 = nn.Linear(spec.hidden_size, spec.ffn, bias=bias)
        self.w3 = (
            nn.Linear(spec.hidden_size, spec.ffn, bias=False) if spec.arch == "llama" else None
        )
        self.w2 = nn.Linear(spec.ffn, spec.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is not None:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    """Pre-norm transformer layer; layer ``index`` of a mixture-of-experts model has an
    :class:`~parsearch.trainers.builtin.moe.MoE` for its FFN where ``model.moe`` says so."""

    def __init__(self, spec: ModelSpec, index: int) -> None:
        super().__init__()
        self.attention_norm = _norm(spec)
        self.attention = Attention(spec)
        self.ffn_norm = _norm(spec)
        moe = spec.moe is not None and spec.moe.is_moe_layer(index)
        self.feed_forward: nn.Module = MoE(spec) if moe else FeedForward(spec)

    def forward(self, x: torch.Tensor, rotary: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), rotary)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    """Tokens in, logits out; any of ``embed``, ``norm``, ``output`` may be ``None`` in a
    pipeline stage, which then takes or returns hidden states instead."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.embed: Embeddings | None = Embeddings(spec)
        self.layers = nn.ModuleDict({str(i): Block(spec, i) for i in range(spec.num_layers)})
        self.norm: nn.Module | None = _norm(spec)
        self.output: nn.Linear | None = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        if spec.tied_embeddings:
            self.output.weight = self.embed.tok.weight
        # The positions of the tokens this module is fed: all of them, or under context
        # parallelism this rank's chunks (see hold_positions).
        self.register_buffer("positions", torch.arange(spec.seq_length), persistent=False)
        rotary = rotary_tables(spec, self.positions) if spec.arch == "llama" else None
        self.register_buffer("rotary", rotary, persistent=False)

    def hold_positions(self, positions: torch.Tensor) -> None:
        """Take sequences made of the tokens at ``positions`` only (context parallelism):
        learned positions and rotary angles follow the real positions."""
        self.positions = positions.to(self.positions.device)
        if self.rotary is not None:
            self.rotary = rotary_tables(self.spec, self.positions)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x, self.positions)
        for layer in self.layers.values():
            x = layer(x, self.rotary)
        if self.norm is not None:
            x = self.norm(x)
        if self.output is not None:
            x = self.output(x)
        return x


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy of one micro-batch, computed in fp32."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def canonical_name(name: str, spec: ModelSpec) -> str:
    """The global name a parameter is initialised by: wrapper prefixes removed, and the
    output weight of a tied model named after the embedding it copies on another stage."""
    name = name.replace("_checkpoint_wrapped_module.", "")
    if spec.tied_embeddings and name == "output.weight":
        return "embed.tok.weight"
    return name


def _seed_for(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % (2**63)


def initial_value(
    spec: ModelSpec, name: str, shape: torch.Size, seed: int, device: torch.device
) -> torch.Tensor:
    """The full (unsharded) initial value of parameter ``name``.

    Normal(0, 0.02) for weights, scaled by 1/sqrt(2L) for the two projections that write into
    the residual stream (GPT-2); ones for norm weights; zeros for biases.
    """
    leaf = name.rsplit(".", 1)[-1]
    if "norm" in name:
        return (
            torch.ones(shape, device=device)
            if leaf == "weight"
            else torch.zeros(shape, device=device)
        )
    if leaf == "bias":
        return torch.zeros(shape, device=device)
    std = INIT_STD
    if name.endswith(("wo.weight", "w2.weight")):
        std /= math.sqrt(2 * spec.num_layers)
    generator = torch.Generator(device=device).manual_seed(_seed_for(seed, name))
    return torch.empty(shape, device=device).normal_(0.0, std, generator=generator)


def _local_part(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """The slice of ``full`` that ``param`` holds: all of it, or its DTensor shard."""
    placements = getattr(param, "placements", None)
    if placements is None:
        return full
    mesh = param.device_mesh
    for mesh_dim, placement in enumerate(placements):
        if placement.is_shard():
            chunks = torch.chunk(full, mesh.size(mesh_dim), dim=placement.dim)
            full = chunks[mesh.get_local_rank(mesh_dim)]
    return full


def materialize(module: Transformer, device: torch.device, seed: int) -> None:
    """Allocate a meta-device model (or stage) on ``device`` and initialise it."""
    module.to_empty(device=device)
    if module.spec.tied_embeddings and module.embed is not None and module.output is not None:
        module.output.weight = module.embed.tok.weight  # to_empty unties shared parameters
    init_weights(module, module.spec, seed)


def expert_offsets(module: nn.Module) -> dict[str, int]:
    """The global index of the first expert each stacked-experts parameter of ``module``
    holds, by parameter name (an EP rank holds a slice of the experts)."""
    return {
        f"{prefix}.{leaf}": part.first
        for prefix, part in module.named_modules()
        if isinstance(part, Experts)
        for leaf, _ in part.named_parameters()
    }


def _experts_value(
    spec: ModelSpec, name: str, param: torch.Tensor, first: int, seed: int
) -> torch.Tensor:
    """Stacked experts ``first ..`` of an :class:`Experts` weight, each initialised as the
    ``nn.Linear`` weight it stands for (``...experts.<global index>.w1.weight``), so an
    expert has the same value whichever EP rank holds it."""
    prefix, leaf = name.rsplit(".", 1)
    return torch.stack(
        [
            initial_value(spec, f"{prefix}.{e}.{leaf}.weight", param.shape[1:], seed, param.device)
            for e in range(first, first + param.shape[0])
        ]
    )


@torch.no_grad()
def init_weights(module: nn.Module, spec: ModelSpec, seed: int) -> None:
    """Fill every parameter of ``module`` (a whole model or a tensor-parallel pipeline stage,
    already materialised with ``to_empty``) with its deterministic initial value, and
    recompute its buffers. Only one full parameter exists at a time."""
    experts = expert_offsets(module)
    for name, param in module.named_parameters():
        device = param.device
        if name in experts:
            full = _experts_value(spec, canonical_name(name, spec), param, experts[name], seed)
        else:
            full = initial_value(spec, canonical_name(name, spec), param.shape, seed, device)
        local = param.to_local() if hasattr(param, "to_local") else param
        local.copy_(_local_part(full, param))
    if isinstance(module, Transformer):
        module.hold_positions(torch.arange(spec.seq_length, device=module.positions.device))
