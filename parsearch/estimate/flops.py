"""Parameter count and training FLOPs of a decoder-only transformer.

Counts are exact for the two architectures :class:`~parsearch.config.ModelSpec` describes and
reduce to Narayanan et al. (2021) for GPT: parameters ≈ 12·L·h²·(1 + 13/(12h) + (V+s)/(12·L·h))
and FLOPs per step = 72·B·s·L·h²·(1 + s/(6h) + V/(12·L·h)) without recompute,
96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h)) with full recompute (the logit layer is not recomputed).
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
    """Total trainable parameters (a tied embedding is counted once)."""
    return embedding_params(model) + model.num_layers * layer_params(model) + head_params(model)


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
    ``matmul`` is every layer's weight multiplies; ``logits`` the output projection, which is
    never recomputed.
    """
    if recompute not in _FORWARD_PASSES:
        raise ValueError(f"recompute must be one of {sorted(_FORWARD_PASSES)}, got {recompute!r}")
    tokens = global_batch * model.seq_length
    layers = model.num_layers
    forward_matmul = 2.0 * tokens * layer_matmul_params(model) * layers
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
