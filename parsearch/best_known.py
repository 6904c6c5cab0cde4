"""The best layout known for a model on an allocation, across every campaign of a store.

A store a centre shares holds many people's campaigns, and the first question a user asks
of it — "what is the best layout anybody found for a 175B GPT on 128 Frontier nodes?" — is
answered inside no single campaign. Two campaigns are *comparable* when they train the same
model shape (every field of the transformer but its name) on the same allocation shape: as
many nodes and devices per node, of the same kind of device (type, memory, peak FLOP/s).
Their ok trials are ranked by tokens/s: one campaign's objective may be another's secondary
figure, but tokens/s is what every trial measures and it means the same for one model on one
allocation. A proxy trial's figures are predicted from a run on fewer replicas and a simulate
campaign's are the estimate's own, so an answer says which figures were measured and which
only predicted, and a measured layout answers before any predicted one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from parsearch.config import AllocationSpec, ModelSpec
from parsearch.errors import ParsearchError
from parsearch.formats import trial_document
from parsearch.result import TrialState
from parsearch.space import SearchSpace, space_from_dict
from parsearch.store import Campaign, Store, TrialRecord
from parsearch.units import format_bytes


class NothingComparableError(ParsearchError):
    """No campaign of the store measured the model on the allocation asked about."""


@dataclass(frozen=True)
class Comparable:
    """What two campaigns must share for their trials to answer the same question."""

    model: ModelSpec
    nodes: int
    devices_per_node: int
    device: str
    device_memory_bytes: int
    peak_flops_per_device: float

    @classmethod
    def of(cls, space: SearchSpace) -> Comparable:
        return cls.of_parts(space.model, space.allocation)

    @classmethod
    def of_parts(cls, model: ModelSpec, allocation: AllocationSpec) -> Comparable:
        return cls(
            model=dataclasses.replace(model, name="model"),
            nodes=allocation.nodes,
            devices_per_node=allocation.devices_per_node,
            device=allocation.device,
            device_memory_bytes=allocation.device_memory_bytes,
            peak_flops_per_device=allocation.peak_flops_per_device,
        )

    def same_model_and_device(self, other: Comparable) -> bool:
        """The same model on the same kind of device and node, whatever the node count."""
        return dataclasses.replace(other, nodes=self.nodes) == self

    def describe(self) -> str:
        return (
            f"{model_shape(self.model)} on {self.nodes} node{'s' if self.nodes != 1 else ''} x "
            f"{self.devices_per_node} {self.device} ({format_bytes(self.device_memory_bytes)}, "
            f"{self.peak_flops_per_device / 1e12:g} TFLOP/s peak)"
        )


def model_shape(m: ModelSpec) -> str:
    """The fields :class:`Comparable` compares, in words: what makes two models the same."""
    return (
        f"{m.arch} {m.num_layers} layers, hidden {m.hidden_size}, {m.num_heads} heads"
        + (f" ({m.num_kv_heads} kv)" if m.num_kv_heads else "")
        + (f", ffn {m.ffn_hidden_size}" if m.ffn_hidden_size else "")
        + f", vocab {m.vocab_size}, seq {m.seq_length}"
        + (
            f", {m.moe.num_experts} experts top-{m.moe.top_k} (ffn {m.moe.expert_ffn_hidden_size})"
            if m.moe
            else ""
        )
    )


@dataclass(frozen=True)
class KnownLayout:
    """One campaign's best trial, where it came from."""

    campaign: Campaign
    trial: TrialRecord
    trainer: str

    @property
    def measured(self) -> bool:
        """Measured at full scale: neither rehearsed by the simulate backend (the estimate's
        own figures) nor predicted from a proxy trial on fewer replicas."""
        return self.campaign.backend != "simulate" and self.trial.proxy_dp is None

    @property
    def how(self) -> str:
        if self.campaign.backend == "simulate":
            return "simulated (the estimate's figures, backend simulate)"
        if self.trial.proxy_dp is not None:
            return f"predicted from a proxy trial at dp {self.trial.proxy_dp}"
        return "measured"


@dataclass(frozen=True)
class BestKnown:
    """Every comparable campaign's best trial, measured ones first, fastest first.

    ``other_allocations`` names the campaigns of the same model on the same kind of device
    but another node count (what a user asking about one count may want to know exists);
    ``unreadable`` those whose stored space no longer loads (a space from an older release).
    """

    wanted: Comparable
    layouts: list[KnownLayout]
    campaigns_in_store: int
    other_allocations: list[tuple[str, int]]
    unreadable: list[str]

    @property
    def best(self) -> KnownLayout:
        """The fastest measured layout, else the fastest predicted one."""
        if not self.layouts:
            raise NothingComparableError(self.nothing_comparable())
        return self.layouts[0]

    def nothing_comparable(self) -> str:
        text = (
            f"none of the {self.campaigns_in_store} campaign"
            f"{'s' if self.campaigns_in_store != 1 else ''} in the store has an ok trial of "
            f"{self.wanted.describe()}"
        )
        if self.other_allocations:
            others = ", ".join(
                f"'{name}' ({nodes} nodes)" for name, nodes in self.other_allocations
            )
            text += f"; the same model on the same devices was measured by {others}"
        return text


def best_known(store: Store, wanted: Comparable, *, trainer: str | None = None) -> BestKnown:
    """The comparable campaigns' best trials (by tokens/s) of ``store``, optionally only of
    campaigns whose trainer kind is ``trainer``."""
    layouts, others, unreadable = [], [], []
    campaigns = store.list_campaigns()
    for campaign in campaigns:
        try:
            space = space_from_dict(campaign.space, source=campaign.space_path or campaign.name)
        except ParsearchError:
            unreadable.append(campaign.name)
            continue
        kind = str(space.trainer.get("kind", "builtin"))
        if trainer is not None and kind != trainer:
            continue
        shape = Comparable.of(space)
        if shape != wanted:
            if wanted.same_model_and_device(shape):
                others.append((campaign.name, shape.nodes))
            continue
        ok = [t for t in store.trials(campaign.id, [TrialState.OK]) if t.tokens_per_s]
        if ok:
            top = max(ok, key=lambda t: (t.proxy_dp is None, t.tokens_per_s))
            layouts.append(KnownLayout(campaign, top, kind))
    # A measured layout answers before any predicted one, however fast that was predicted.
    layouts.sort(key=lambda known: (not known.measured, -(known.trial.tokens_per_s or 0.0)))
    return BestKnown(wanted, layouts, len(campaigns), others, unreadable)


def across_document(known: BestKnown) -> dict[str, Any]:
    """The answer as JSON data: what ``parsearch best --like --format json`` prints and
    ``parsearch serve`` answers, so the two cannot drift apart."""
    ranked = [
        {
            **trial_document(layout.trial, layout.campaign),
            "trainer": layout.trainer,
            "measured": layout.measured,
            "provenance": layout.how,
            "finished_at": layout.trial.finished_at,
        }
        for layout in known.layouts
    ]
    return {
        "like": known.wanted.describe(),
        "campaigns_in_store": known.campaigns_in_store,
        "best": ranked[0],
        "ranked": ranked,
        "other_allocations": [{"campaign": n, "nodes": k} for n, k in known.other_allocations],
    }
