"""A space's own exclusions: layouts its trainer refuses although they divide.

Divisibility is the same for every trainer (:func:`parsearch.config.layout_violations`); what
a particular trainer cannot run is not, so a space file lists it::

    exclude:
      - when: {zero_stage: 0}
        unless: {tp: 1, pp: 1}
        reason: "torchtitan: DDP has not supported > 1D parallelism"

A rule excludes a layout that matches every field of ``when`` and not every field of
``unless`` (omitted: no exception). A field's value is one value or a list of the values
that match. ``reason`` is required: ``plan`` counts excluded layouts under it, and a
strategy that searches the raw space records it as the trial's reason. Rules are checked when
the space is loaded: an unknown field, a value of the wrong type, or a value no candidate of
the searched dimension takes (a typo that would make the rule silently dead) is a
:class:`~parsearch.errors.SpaceError` naming the rule and the field.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from parsearch.config import DIMENSIONS_BY_NAME, ParallelLayout
from parsearch.errors import SpaceError

FIELDS: tuple[str, ...] = tuple(DIMENSIONS_BY_NAME)
_RULE_KEYS = ("when", "unless", "reason")


@dataclass(frozen=True)
class Exclusion:
    """One rule: layouts matching ``when`` but not ``unless`` are excluded for ``reason``."""

    when: Mapping[str, tuple[Any, ...]]
    unless: Mapping[str, tuple[Any, ...]]
    reason: str

    def excludes(self, layout: ParallelLayout) -> bool:
        if not _matches(self.when, layout):
            return False
        return not (self.unless and _matches(self.unless, layout))


def _matches(condition: Mapping[str, tuple[Any, ...]], layout: ParallelLayout) -> bool:
    return all(getattr(layout, name) in values for name, values in condition.items())


def exclusion_reasons(rules: tuple[Exclusion, ...], layout: ParallelLayout) -> list[str]:
    """The reasons of every rule that excludes ``layout`` (empty: none does)."""
    return [rule.reason for rule in rules if rule.excludes(layout)]


def parse_exclusions(
    value: Any, dimensions: Mapping[str, tuple[Any, ...]], source: str
) -> tuple[Exclusion, ...]:
    """The ``exclude`` list of a space file, validated against the space's ``dimensions``."""
    if not isinstance(value, list):
        raise SpaceError(
            f"must be a list of rules ({{when: ..., unless: ..., reason: ...}}), got {value!r}",
            source=source,
            field="exclude",
        )
    return tuple(_rule(item, f"exclude[{i}]", dimensions, source) for i, item in enumerate(value))


def _rule(
    item: Any, where: str, dimensions: Mapping[str, tuple[Any, ...]], source: str
) -> Exclusion:
    if not isinstance(item, dict):
        raise SpaceError(
            f"must be a mapping with when, reason (and unless), got {item!r}",
            source=source,
            field=where,
        )
    for key in item:
        if key not in _RULE_KEYS:
            raise SpaceError(
                f"unknown key; valid keys here: {', '.join(_RULE_KEYS)}",
                source=source,
                field=f"{where}.{key}",
            )
    reason = item.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise SpaceError(
            "is required: say why the trainer refuses these layouts",
            source=source,
            field=f"{where}.reason",
        )
    if "when" not in item:
        raise SpaceError("is required but missing", source=source, field=f"{where}.when")
    when = _condition(item["when"], f"{where}.when", dimensions, source)
    unless = _condition(item.get("unless", {}), f"{where}.unless", dimensions, source)
    if not when:
        raise SpaceError("must name at least one field", source=source, field=f"{where}.when")
    return Exclusion(when=when, unless=unless, reason=reason.strip())


def _condition(
    value: Any, where: str, dimensions: Mapping[str, tuple[Any, ...]], source: str
) -> dict[str, tuple[Any, ...]]:
    if not isinstance(value, dict):
        raise SpaceError(
            f"must map layout fields to values, got {value!r}", source=source, field=where
        )
    condition = {}
    for name, given in value.items():
        field = f"{where}.{name}"
        if name not in FIELDS:
            close = difflib.get_close_matches(str(name), FIELDS, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise SpaceError(
                f"unknown layout field{hint}; valid: {', '.join(FIELDS)}",
                source=source,
                field=field,
            )
        values = tuple(given) if isinstance(given, list) else (given,)
        if not values:
            raise SpaceError("is an empty list: it matches nothing", source=source, field=field)
        for item in values:
            _check_type(name, item, field, source)
        candidates = dimensions.get(name)
        if candidates is not None and not set(values) & set(candidates):
            raise SpaceError(
                f"{given!r} matches no candidate of search.{name} ({list(candidates)}): the "
                "rule would never apply",
                source=source,
                field=field,
            )
        condition[name] = values
    return condition


def _check_type(name: str, value: Any, field: str, source: str) -> None:
    dimension = DIMENSIONS_BY_NAME[name]
    if dimension.kind == "choice":
        if value not in dimension.choices:
            raise SpaceError(
                f"must be one of {list(dimension.choices)}, got {value!r}",
                source=source,
                field=field,
            )
    elif dimension.kind == "bool":
        if not isinstance(value, bool):
            raise SpaceError(f"must be true or false, got {value!r}", source=source, field=field)
    elif isinstance(value, bool) or not isinstance(value, int):
        raise SpaceError(f"must be an integer, got {value!r}", source=source, field=field)
