"""One line saying which machine profile a campaign's estimate used (from its settings)."""

from __future__ import annotations

from typing import Any


def describe_machine(settings: dict[str, Any]) -> str:
    """``machine profile NAME (PATH; measured by ... on HOST at ...)`` or the constants."""
    profile = settings.get("machine_profile")
    if not profile:
        return "no machine profile: the space's data-sheet constants"
    measured = profile.get("measured") or {}
    how = ", ".join(
        f"{key} {measured[key]}"
        for key in ("by", "backend", "host", "at", "communication")
        if measured.get(key)
    )
    where = settings.get("machine_profile_path") or "path not recorded"
    gemm = profile.get("gemm") or []
    collectives = profile.get("collectives") or []
    return (
        f"machine profile {profile.get('name')} ({where}; {how}): {len(gemm)} layer shapes, "
        f"{len(collectives)} collective fits"
    )
