"""How ``parsearch best`` prints a trial: a registry of formats, extended by name.

A formatter takes the trial and its campaign (whose ``space`` holds the model, the batch and
the trainer settings a training-framework format needs) and returns text. ``text``, ``json``
and ``yaml`` are built in; :func:`register_format` adds others (Megatron arguments,
DeepSpeed JSON...), and ``parsearch best --format`` offers whatever is registered.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import yaml

from parsearch.errors import ParsearchError
from parsearch.store import Campaign, TrialRecord, fidelity_note
from parsearch.units import format_bytes

Formatter = Callable[[TrialRecord, Campaign], str]
FORMATS: dict[str, Formatter] = {}


class FormatError(ParsearchError):
    """An unknown output format."""

    exit_code = 2


def register_format(name: str, formatter: Formatter) -> None:
    """Make ``formatter`` available as ``parsearch best --format name``."""
    FORMATS[name] = formatter


def format_layout(record: TrialRecord, campaign: Campaign, fmt: str) -> str:
    """``record`` printed in the format called ``fmt``."""
    try:
        formatter = FORMATS[fmt]
    except KeyError:
        raise FormatError(f"unknown format {fmt!r}; valid: {', '.join(FORMATS)}") from None
    return formatter(record, campaign)


def trial_document(record: TrialRecord, campaign: Campaign) -> dict[str, Any]:
    """A trial as plain data: what the json and yaml formats print. ``fidelity`` is
    ``full`` (figures measured at full scale) or ``proxy`` (``objective`` and ``metrics``
    predicted from a run at ``proxy_dp`` replicas, measured in ``metrics.fidelity``).
    ``layout`` has every dimension, those a trial predates at their defaults."""
    return {
        "campaign": campaign.name,
        "trial": record.number,
        "state": record.state.value,
        "fidelity": record.fidelity,
        "proxy_dp": record.proxy_dp,
        "objective": {"metric": campaign.objective_metric, "value": record.objective},
        "layout": record.layout.to_dict(),
        "layout_short": record.layout.short(),
        "metrics": record.metrics,
        "predicted": record.predicted,
        "hosts": record.hosts,
        "attempt": record.attempt,
        "duration_s": record.duration_s,
    }


def _json(record: TrialRecord, campaign: Campaign) -> str:
    return json.dumps(trial_document(record, campaign), indent=2, sort_keys=False)


def _yaml(record: TrialRecord, campaign: Campaign) -> str:
    return yaml.safe_dump(trial_document(record, campaign), sort_keys=False).rstrip()


def _text(record: TrialRecord, campaign: Campaign) -> str:
    layout = record.layout
    metric = campaign.objective_metric
    metrics, predicted = record.metrics, record.predicted or {}
    lines = [
        f"best of campaign '{campaign.name}': trial #{record.number}",
        f"  layout   {layout.short()}",
        "           " + ", ".join(f"{key} {value}" for key, value in layout.to_dict().items()),
    ]
    if record.proxy_dp is not None:
        lines.append(f"  fidelity {fidelity_note(record)} (no full-scale trial succeeded)")
    elif campaign.settings.get("proxy"):
        lines.append(f"  fidelity {fidelity_note(record)}")
    for name in dict.fromkeys((metric, "tokens_per_s", "tflops_per_device", "mfu", "step_time_s")):
        if metrics.get(name) is not None:
            lines.append(
                f"  {name:<17} {_number(name, metrics[name])}"
                + (f"  (predicted {_number(name, predicted[name])})" if name in predicted else "")
            )
    if metrics.get("peak_mem_bytes") is not None:
        mem = format_bytes(metrics["peak_mem_bytes"])
        if "peak_mem_bytes" in predicted:
            mem += f"  (predicted {format_bytes(predicted['peak_mem_bytes'])})"
        lines.append(f"  {'peak memory/rank':<17} {mem}")
    return "\n".join(lines)


def _number(name: str, value: float) -> str:
    return f"{value:.1%}" if name == "mfu" else f"{value:.4g}"


register_format("text", _text)
register_format("json", _json)
register_format("yaml", _yaml)

# Trainer settings (Megatron-LM, Megatron-DeepSpeed, DeepSpeed, torchtitan):
# parsearch.trainer_flags.
from parsearch.trainer_flags import EXPORTERS, record_formatter  # noqa: E402

for _name in EXPORTERS:
    register_format(_name, record_formatter(_name))
