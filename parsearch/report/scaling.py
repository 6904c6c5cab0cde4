"""A scaling study's figure: efficiency and throughput against the allocation size."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from matplotlib.figure import Figure

if TYPE_CHECKING:
    from parsearch.scaling import ScalingStudy


def scaling_figure(study: ScalingStudy) -> Figure:
    """Efficiency (bars, left axis, with the 100% line) and tokens/s per device (right axis)
    at each measured size; sizes not measured yet are marked on the axis."""
    fig = Figure(figsize=(6.4, 3.8), layout="constrained")
    ax = fig.add_subplot()
    labels = [str(point.nodes) for point in study.points]
    efficiency = [(point.efficiency or 0.0) * 100 for point in study.points]
    bars = ax.bar(labels, efficiency, color="#6baed6")
    for bar, point in zip(bars, study.points, strict=True):
        text = point.state if point.efficiency is None else f"{point.efficiency:.0%}"
        ax.annotate(
            text,
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=9,
        )
    ax.axhline(100, color="#d62728", linewidth=1, linestyle="--")
    ax.set_xlabel("nodes")
    ax.set_ylabel("scaling efficiency (%)")
    ax.set_ylim(0, max([110.0, *efficiency]) * 1.1)
    per_device = ax.twinx()
    measured = [(str(p.nodes), p.tokens_per_s / p.devices) for p in study.points if p.tokens_per_s]
    if measured:
        per_device.plot(*zip(*measured, strict=True), color="#08519c", marker="o")
        per_device.set_ylim(0, 1.4 * max(value for _, value in measured))  # below the labels
    per_device.set_ylabel("tokens/s per device")
    ax.set_title(f"{study.mode} scaling of '{study.parent}'")
    return fig


def save_scaling_figure(study: ScalingStudy, path: str | Path) -> Path:
    path = Path(path)
    scaling_figure(study).savefig(path, dpi=110)
    return path
