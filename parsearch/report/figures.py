"""The four figures of a report, as matplotlib :class:`~matplotlib.figure.Figure` objects.

Built on ``Figure`` directly, not pyplot: no global state and no GUI backend, so the CLI
renders with Agg on a headless node and a notebook shows the same objects inline.
Each function takes :class:`~parsearch.report.data.ReportData` and draws what the matching
function of :mod:`parsearch.report.data` computed; nothing is recomputed here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import matplotlib
from matplotlib.axes import Axes
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator

from parsearch.report.data import (
    ReportData,
    accuracy,
    convergence,
    pareto_front,
    tp_pp_grid,
)

# Finished states without a value, one row each in the convergence strip (top to bottom).
STATE_STYLE = {
    "oom": {"color": "#d62728", "marker": "x", "label": "OOM"},
    "timeout": {"color": "#ff7f0e", "marker": "v", "label": "timeout"},
    "error": {"color": "#9467bd", "marker": "D", "label": "error"},
    "infeasible": {"color": "#7f7f7f", "marker": "|", "label": "infeasible"},
}
# Heat-map cells without a measured value: fill, hatch, text in the cell, legend entry.
CELL_STYLE = {
    "oom": ("#f6b3b3", "", "OOM", "ran out of memory"),
    "failed": ("#fdd0a2", "", "failed", "timeout / error"),
    "predicted_oom": ("#e0e0e0", "//", "pred. OOM", "all layouts predicted OOM (pruned)"),
    "no_divide": ("#a8a8a8", "xx", "invalid", "no layout divides (rules)"),
    "not_run": ("#ffffff", "", "not run", "not run yet"),
}
PARETO_LABELS = 6
OK_COLOR, BEST_COLOR, FRONT_COLOR, LIMIT_COLOR = "#6baed6", "#08519c", "#e6550d", "#d62728"


def format_metric(metric: str, value: float | None) -> str:
    """A metric value as people read it: ``12.3k`` tokens/s, ``38.4%`` MFU."""
    if value is None or math.isnan(value):
        return "–"
    if metric == "mfu":
        return f"{value:.1%}"
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def memory_unit(values: Iterable[float]) -> tuple[float, str]:
    """GiB for cluster-sized figures, MiB for the CPU demo's."""
    largest = max((v for v in values if not math.isnan(v)), default=0.0)
    return (2**30, "GiB") if largest >= 2**30 else (2**20, "MiB")


def _metric_ticks(axis, metric: str) -> None:
    axis.set_major_formatter(FuncFormatter(lambda value, _pos: format_metric(metric, value)))


def _empty(fig: Figure, ax: Axes, message: str) -> Figure:
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, fontsize=11)
    ax.set_xticks([])
    ax.set_yticks([])
    return fig


def convergence_figure(data: ReportData) -> Figure:
    """Best objective so far against the number of finished trials; failures in a strip."""
    table = convergence(data)
    failed_rows = [state for state in STATE_STYLE if (table["state"] == state).any()]
    fig = Figure(figsize=(8, 4.8), layout="constrained")
    ax, strip = fig.subplots(
        2, 1, sharex=True, height_ratios=[5, max(1, len(failed_rows))], squeeze=True
    )
    ax.set_title(f"Convergence: best {data.objective_label} so far ({data.campaign.name})")
    if table.empty:
        strip.set_visible(False)
        return _empty(fig, ax, "no finished trial yet")
    ok = table[table["value"].notna()]
    ax.scatter(ok["finished"], ok["value"], s=14, color=OK_COLOR, label="ok trial", zorder=2)
    if ok.empty:
        ax.text(0.5, 0.5, "no ok trial yet", ha="center", transform=ax.transAxes)
        ax.set_ylim(0, 1)
    else:
        ax.step(
            table["finished"],
            table["best_so_far"],
            where="post",
            color=BEST_COLOR,
            linewidth=2,
            label="best so far",
            zorder=3,
        )
        best = ok.loc[ok["value"].idxmax()]
        ax.annotate(
            f"best: trial #{int(best['number'])}, {format_metric(data.objective, best['value'])}",
            (best["finished"], best["value"]),
            xytext=(0, 7),
            textcoords="offset points",
            ha="center",
            fontsize=8,
            color=BEST_COLOR,
        )
        ax.set_ylim(0, ok["value"].max() * 1.15)
        ax.legend(loc="best", fontsize=8, framealpha=0.9)
    ax.set_ylabel(data.objective_label)
    _metric_ticks(ax.yaxis, data.objective)
    ax.grid(alpha=0.3)
    # Failures have no objective: one row per kind below the plot, at the same x.
    for row, state in enumerate(failed_rows):
        style = STATE_STYLE[state]
        failed = table[table["state"] == state]
        strip.scatter(
            failed["finished"], [row] * len(failed), marker=style["marker"], color=style["color"]
        )
    strip.set_yticks(
        range(len(failed_rows)),
        [
            f"{STATE_STYLE[state]['label']} ({(table['state'] == state).sum()})"
            for state in failed_rows
        ],
        fontsize=8,
    )
    strip.set_ylim(max(1, len(failed_rows)) - 0.5, -0.5)
    strip.grid(axis="x", alpha=0.3)
    strip.set_xlabel("trials finished (in the order they finished)")
    strip.set_xlim(0, len(table) + 1)
    strip.xaxis.set_major_locator(MaxNLocator(integer=True))
    if not failed_rows:
        strip.set_yticks([0], ["no failures"], fontsize=8)
    return fig


def heatmap_figure(data: ReportData) -> Figure:
    """TP x PP: best objective per cell, and why a cell without one has none."""
    grid = tp_pp_grid(data)
    tps, pps = list(data.space.dimensions["tp"]), list(data.space.dimensions["pp"])
    fig = Figure(
        figsize=(max(6.0, 1.1 * len(tps) + 3), max(4.0, 0.65 * len(pps) + 2.6)),
        layout="constrained",
    )
    ax = fig.add_subplot()
    ok = grid[grid["kind"] == "ok"]
    colormap = matplotlib.colormaps["viridis"]
    norm = Normalize(vmin=ok["best"].min(), vmax=ok["best"].max()) if not ok.empty else None
    best_number = ok.loc[ok["best"].idxmax(), "best_number"] if not ok.empty else None
    for _, cell in grid.iterrows():
        x, y = tps.index(cell["tp"]), pps.index(cell["pp"])
        if cell["kind"] == "ok" and norm is not None:
            shade = norm(cell["best"]) if norm.vmax > norm.vmin else 1.0
            fill, hatch, color = colormap(shade), "", "black" if shade > 0.55 else "white"
            text = f"{format_metric(data.objective, cell['best'])}\n#{cell['best_number']}"
            failures = [
                f"{count} {what}"
                for count, what in ((cell["oom"], "OOM"), (cell["failed"], "failed"))
                if count
            ]
            if failures:
                text += "\n+" + ", ".join(failures)
        else:
            fill, hatch, text, _ = CELL_STYLE[cell["kind"]]
            color = "#333333"
            if cell["kind"] == "not_run" and cell["infeasible"]:
                text += f"\n({cell['infeasible']} infeasible)"
        ax.add_patch(
            Rectangle((x - 0.5, y - 0.5), 1, 1, facecolor=fill, hatch=hatch, edgecolor="#bbbbbb")
        )
        ax.text(x, y, text, ha="center", va="center", fontsize=7.5, color=color)
        if cell["kind"] == "ok" and cell["best_number"] == best_number:
            ax.add_patch(
                Rectangle(
                    (x - 0.46, y - 0.46), 0.92, 0.92, fill=False, edgecolor="red", linewidth=2.2
                )
            )
    ax.set_xlim(-0.5, len(tps) - 0.5)
    ax.set_ylim(len(pps) - 0.5, -0.5)
    ax.set_xticks(range(len(tps)), [str(tp) for tp in tps])
    ax.set_yticks(range(len(pps)), [str(pp) for pp in pps])
    ax.set_xlabel("tensor parallel size (TP)")
    ax.set_ylabel("pipeline parallel size (PP)")
    ax.set_title(
        f"Best {data.objective_label} per TP × PP cell (best over its other dimensions;\n"
        f"#N = the trial that achieved it)",
        fontsize=10,
    )
    if norm is not None:
        bar = fig.colorbar(matplotlib.cm.ScalarMappable(norm=norm, cmap=colormap), ax=ax)
        bar.set_label(f"best {data.objective_label}")
        _metric_ticks(bar.ax.yaxis, data.objective)
    used = set(grid["kind"])
    handles = [
        Patch(facecolor=fill, hatch=hatch, edgecolor="#999999", label=label)
        for kind, (fill, hatch, _text, label) in CELL_STYLE.items()
        if kind in used
    ]
    if best_number is not None:
        handles.append(Patch(fill=False, edgecolor="red", linewidth=2, label="best trial"))
    fig.legend(
        handles=handles,
        loc="outside lower center",
        ncols=min(3, len(handles)),
        fontsize=8,
        frameon=False,
    )
    return fig


def pareto_figure(data: ReportData) -> Figure:
    """Objective against measured peak memory per rank, the Pareto front and the limit."""
    ok = data.ok().dropna(subset=["peak_mem_bytes"])
    front = pareto_front(data)
    fig = Figure(figsize=(8, 4.8), layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(f"{data.objective_label} vs measured peak memory per rank")
    if ok.empty:
        return _empty(fig, ax, "no ok trial with a measured peak memory yet")
    scale, unit = memory_unit([*ok["peak_mem_bytes"], data.memory_limit_bytes])
    ax.scatter(
        ok["peak_mem_bytes"] / scale,
        ok["objective"],
        s=16,
        color=OK_COLOR,
        label=f"ok trial ({len(ok)})",
        zorder=2,
    )
    memory, objective = front["peak_mem_bytes"] / scale, front["objective"]
    ax.step(memory, objective, where="post", color=FRONT_COLOR, linewidth=1.5, zorder=3)
    ax.scatter(
        memory, objective, s=36, color=FRONT_COLOR, label=f"Pareto front ({len(front)})", zorder=4
    )
    # Label the fastest few: the slow end of a long front crowds, and the page lists it all.
    labelled = front.nlargest(PARETO_LABELS, "objective")
    for number, x, y in zip(
        labelled["number"], labelled["peak_mem_bytes"] / scale, labelled["objective"], strict=True
    ):
        ax.annotate(
            f"#{int(number)}",
            (x, y),
            xytext=(-4, 4),
            textcoords="offset points",
            ha="right",
            fontsize=7.5,
            color="#a63603",
        )
    limit = data.memory_limit_bytes / scale
    ax.axvline(
        limit,
        color=LIMIT_COLOR,
        linestyle="--",
        linewidth=1.2,
        label=f"memory limit {limit:.3g} {unit}",
    )
    oom = int((data.trials["state"] == "oom").sum())
    if oom:
        ax.add_line(
            Line2D(
                [],
                [],
                linestyle="",
                marker="x",
                color=LIMIT_COLOR,
                label=f"{oom} OOM trials (no measured memory, not shown)",
            )
        )
    ax.set_xlim(0, max(limit, memory.max(), ok["peak_mem_bytes"].max() / scale) * 1.08)
    ax.set_ylim(0, ok["objective"].max() * 1.12)
    ax.set_xlabel(f"measured peak memory per rank ({unit})")
    ax.set_ylabel(data.objective_label)
    _metric_ticks(ax.yaxis, data.objective)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    return fig


def prediction_figure(data: ReportData) -> Figure:
    """Measured against predicted objective and peak memory, with y = x."""
    fig = Figure(figsize=(10, 4.8), layout="constrained")
    axes = fig.subplots(1, 2)
    fig.suptitle("Analytic estimate vs measurement (ok trials; on the dashed line = exact)")
    panels = ((data.objective, data.objective_label), ("peak_mem_bytes", "peak memory per rank"))
    for ax, (metric, label) in zip(axes, panels, strict=True):
        result = accuracy(data, metric)
        ax.set_title(result.caption(), fontsize=8.5)
        if result.pairs.empty:
            _empty(fig, ax, "nothing to compare yet")
            continue
        memory = metric == "peak_mem_bytes"
        scale, unit = (
            memory_unit([*result.pairs["measured"], *result.pairs["predicted"]])
            if memory
            else (1.0, "")
        )
        x, y = result.pairs["predicted"] / scale, result.pairs["measured"] / scale
        ax.scatter(x, y, s=16, color="#3182bd", zorder=3)
        low, high = min(x.min(), y.min()), max(x.max(), y.max())
        limit = data.memory_limit_bytes / scale
        if memory:  # show how close the trials came to the limit
            high = max(high, limit)
        if high / low > 20:  # orders of magnitude apart: equal ratios, equal distances
            ax.set_xscale("log")
            ax.set_yscale("log")
            for axis in (ax.xaxis, ax.yaxis):
                axis.set_major_locator(LogLocator(subs=(1, 2, 5)))
                axis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
            span = (low / 1.3, high * 1.3)
        else:
            span = (0.0, high * 1.1)
        ax.plot(span, span, color="#636363", linestyle="--", linewidth=1, label="y = x")
        ax.set_xlim(span)
        ax.set_ylim(span)
        suffix = f" ({unit})" if unit else ""
        ax.set_xlabel(f"predicted {label}{suffix}")
        ax.set_ylabel(f"measured {label}{suffix}")
        if memory:
            if span[0] < limit < span[1]:
                ax.axhline(
                    limit,
                    color=LIMIT_COLOR,
                    linestyle=":",
                    linewidth=1,
                    label=f"memory limit {limit:.3g} {unit}",
                )
        else:
            _metric_ticks(ax.xaxis, metric)
            _metric_ticks(ax.yaxis, metric)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    return fig


# File stem -> figure, in the order the report shows them.
FIGURES: dict[str, Callable[[ReportData], Figure]] = {
    "convergence": convergence_figure,
    "tp_pp_heatmap": heatmap_figure,
    "memory_pareto": pareto_figure,
    "predicted_vs_measured": prediction_figure,
}
