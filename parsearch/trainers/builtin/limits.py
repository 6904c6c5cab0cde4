"""What the built-in trainer does not run, as plain rules (no torch): the space asks them
before anything runs, so such layouts are refused with the reason and never proposed, and
the trainer asks them again before any work (a trial started by hand)."""

from __future__ import annotations

from parsearch.config import ModelSpec, ParallelLayout


def unsupported(model: ModelSpec, layout: ParallelLayout) -> list[str]:
    """Why the built-in trainer cannot run ``layout`` of ``model`` (empty: it can)."""
    problems = []
    if layout.etp > 1:
        problems.append(
            f"etp {layout.etp}: the built-in trainer runs experts whole on each EP rank "
            "(expert tensor parallelism, etp > 1, is not implemented); search etp: [1]"
        )
    moe = model.moe
    if moe is None:
        return problems
    seq = model.seq_length
    if layout.tp > 1 and not layout.sequence_parallel and (seq // layout.cp) % layout.tp:
        problems.append(
            f"seq_length {seq} / cp {layout.cp} not divisible by tp {layout.tp}: each tp rank "
            "routes a slice of the sequence through the MoE layers; use sequence_parallel "
            "or a sequence length that divides"
        )
    if moe.capacity_factor is not None:
        problems.append(
            f"model.moe.capacity_factor {moe.capacity_factor}: the built-in trainer routes "
            "dropless only (no token is dropped); leave capacity_factor out"
        )
    return problems
