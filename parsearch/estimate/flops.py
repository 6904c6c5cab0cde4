"""Parameter count and training FLOPs of a decoder-only transformer.

Counts are exact for the two architectures :class:`~parsearch.config.ModelSpec` describes and
reduce to Narayanan et al. (2021) for GPT: parameters ≈ 12·L·h²·(1 + 13/(12h) + (V+s)/(12·L·h))
and FLOPs per step = 72·B·s·L·h²·(1 + s/(6h) + V/(12·L·h)) without recompute,
96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h)) with full recompute (the logit layer is not recomputed).

A mixture-of-experts layer (``model.moe``) replaces the dense FFN by a router (``h·E``), ``E``
routed SwiGLU experts (``3·h·f_e`` each) and the shared experts (``3·h·f_s``): its parameters
count every expert, its FLOPs only the ``top_k`` experts a token is routed to, the shared
experts and the router, as Megatron-LM counts model FLOPs (``num_floating_point_operations``
in ``megatron/training/training.py``, which leaves out the router's ``h·E``). MFU stays
defined on these active-parameter model FLOPs.
"""

from __future__ import annotations

from parsearch.config import ModelSpec

_FORWARD_PASSES = {"none": 3, "selective": 3, "full": 4}


def layer_matmul_params(model: ModelSpec) -> int:
    """Weights of one layer's matrix multiplies (the FLOP-bearing parameters)."""
    h, f = model.hidden_size, model.ffn
    kv_width = model.kv_heads * model.head_dim
    attention = h * h + 2 * h * kv_width + h * h  # q, k, v, output projection
    mlp = (3 if model.arch == "llama" else 2) * h * f
    return attention + mlp


def attention_matmul_params(model: ModelSpec) -> int:
    """The attention's projections: Q, K, V and the output."""
    h = model.hidden_size
    kv_width = model.kv_heads * model.head_dim
    return h * h + 2 * h * kv_width + h * h


def routed_expert_params(model: ModelSpec) -> int:
    """One routed expert of an MoE layer: a SwiGLU FFN (gate, up, down) of width
    ``expert_ffn_hidden_size``."""
    assert model.moe is not None
    return 3 * model.hidden_size * model.moe.expert_ffn_hidden_size


def moe_layer_dense_params(model: ModelSpec) -> int:
    """What an MoE layer holds besides its routed experts: the attention and its norms as
    in a dense layer, the router ``h·E`` and the shared experts (``3·h·f_s``); the dense FFN
    (with GPT's biases) is gone."""
    assert model.moe is not None
    h, f = model.hidden_size, model.ffn
    dense_mlp = layer_matmul_params(model) - attention_matmul_params(model)
    if model.arch == "gpt":
        dense_mlp += f + h  # the MLP's two biases
    router = h * model.moe.num_experts
    shared = 3 * h * model.moe.shared_expert_ffn_hidden_size
    return layer_params(model) - dense_mlp + router + shared


def moe_layer_active_matmul_params(model: ModelSpec) -> int:
    """The matmul weights one token passes through in an MoE layer: the attention, the
    router, its ``top_k`` routed experts and the shared experts."""
    assert model.moe is not None
    moe, h = model.moe, model.hidden_size
    experts = 3 * h * (moe.top_k * moe.expert_ffn_hidden_size + moe.shared_expert_ffn_hidden_size)
    return attention_matmul_params(model) + h * moe.num_experts + experts


def layer_params(model: ModelSpec) -> int:
    """All parameters of one transformer layer, norms and biases included."""
    h, f = model.hidden_size, model.ffn
    if model.arch == "llama":
        return layer_matmul_params(model) + 2 * h  # two RMSNorm weights
    kv_width = model.kv_heads * model.head_dim
    biases = (h + 2 * kv_width) + h + f + h
    norms = 2 * 2 * h
    return layer_matmul_params(model) + biases + norms


def embedding_params(model: ModelSpec) -> int:
    """Input embedding (and learned positions for GPT)."""
    positions = model.seq_length * model.hidden_size if model.arch == "gpt" else 0
    return model.vocab_size * model.hidden_size + positions


def head_params(model: ModelSpec) -> int:
    """Final norm plus the output projection when it is not tied to the input embedding."""
    final_norm = (2 if model.arch == "gpt" else 1) * model.hidden_size
    output = 0 if model.tied_embeddings else model.vocab_size * model.hidden_size
    return final_norm + output


def param_count(model: ModelSpec) -> int:
    """Total trainable parameters (a tied embedding is counted once), every expert counted."""
    dense = embedding_params(model) + model.num_layers * layer_params(model) + head_params(model)
    if model.moe is None:
        return dense
    moe_layer = moe_layer_dense_params(model) + model.moe.num_experts * routed_expert_params(model)
    return dense + model.moe_layers * (moe_layer - layer_params(model))


def active_param_count(model: ModelSpec) -> int:
    """Parameters one token uses: every expert but the ``top_k`` routed ones left out."""
    if model.moe is None:
        return param_count(model)
    unused = (model.moe.num_experts - model.moe.top_k) * routed_expert_params(model)
    return param_count(model) - model.moe_layers * unused


def attention_passes(recompute: str) -> int:
    """Passes of the attention core per micro-batch: forward and backward (counted as two
    forwards) and, under selective or full recompute, the forward again in the backward."""
    return 4 if recompute in ("selective", "full") else 3


def flops_breakdown(
    model: ModelSpec, global_batch: int, recompute: str = "none"
) -> dict[str, float]:
    """Training FLOPs of one optimizer step over ``global_batch`` sequences, by kind.

    ``attention`` is the two score matmuls (QKᵀ and AV) that fused attention kernels hide from
    torch's FLOP counter on CPU, counted over the whole ``s×s`` score matrix as Narayanan et
    al. and NeMo's ``flops_formulas`` count model FLOPs (a causal kernel executes about half;
    a context-parallel rank's share of it is ``1/cp`` with the load-balanced split);
    ``matmul`` is every layer's weight multiplies (of an MoE layer, the router's and the
    active experts'); ``logits`` the output projection, which is
    never recomputed.
    """
    if recompute not in _FORWARD_PASSES:
        raise ValueError(f"recompute must be one of {sorted(_FORWARD_PASSES)}, got {recompute!r}")
    tokens = global_batch * model.seq_length
    layers = model.num_layers
    moe_layers = model.moe_layers
    forward_matmul = 2.0 * tokens * layer_matmul_params(model) * (layers - moe_layers)
    if model.moe is not None:
        forward_matmul += 2.0 * tokens * moe_layer_active_matmul_params(model) * moe_layers
    forward_attention = 4.0 * tokens * model.seq_length * model.hidden_size * layers
    forward_logits = 2.0 * tokens * model.hidden_size * model.vocab_size
    passes = _FORWARD_PASSES[recompute]
    # Selective recompute re-runs only the attention core in the backward pass.
    breakdown = {
        "matmul": passes * forward_matmul,
        "attention": attention_passes(recompute) * forward_attention,
        "logits": 3 * forward_logits,
    }
    breakdown["total"] = sum(breakdown.values())
    return breakdown


def flops_per_step(model: ModelSpec, global_batch: int, recompute: str = "none") -> float:
    """FLOPs the hardware executes per step; with ``recompute="none"`` these are the model
    FLOPs that MFU is defined against."""
    return flops_breakdown(model, global_batch, recompute)["total"]
