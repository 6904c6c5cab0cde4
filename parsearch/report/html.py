"""``index.html`` and the PNG files of a report, written into one directory.

The page is self-contained (figures embedded as base64 PNG) so it survives being copied off
a cluster or attached to an e-mail; the PNGs are written beside it for slides. Every number
on it carries the trial number it came from, so it can be checked against the store.
"""

from __future__ import annotations

import base64
import html
import io
import math
import time
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from parsearch.errors import ParsearchError
from parsearch.failures import describe_trials
from parsearch.report.data import ReportData, layout_of, pareto_front, top_table
from parsearch.report.figures import FIGURES, format_metric
from parsearch.report.machine import describe_machine
from parsearch.report.scaling import scaling_figure
from parsearch.trainer_flags import EXPORTERS, export
from parsearch.units import count_of, format_bytes

# What each figure answers and how to read it: the captions of the page.
CAPTIONS = {
    "convergence": "Best objective after each finished trial (step line) and every ok trial "
    "(dots); the strip below marks trials that produced no value (out of memory, timeout, "
    "error, or infeasible: recorded as breaking the layout rules, never run). A line still "
    "rising at the right edge means more budget would likely pay off.",
    "tp_pp_heatmap": "For each TP × PP pair, the best objective over every other dimension "
    "(micro-batch, accumulation, ZeRO, recompute, ...), with the trial that reached it. Cells "
    "without a value say why: they ran out of memory, failed, cannot divide the model or "
    "allocation, hold only layouts the memory estimate prunes, or were not tried. The red "
    "frame is the best trial.",
    "memory_pareto": "Objective against measured peak memory per rank. The orange staircase is "
    "the Pareto front: no other trial is both faster and lighter. Pick from it when you need "
    "headroom below the memory limit (dashed), for a longer sequence or a larger model.",
    "predicted_vs_measured": "The analytic estimate (used to prune and seed the search) "
    "against what the trials measured; points on the dashed line were predicted exactly. The "
    "ratios say how far the estimate can be trusted on this machine; the rank correlation "
    "says whether it orders layouts correctly, which is what seeding relies on.",
}
STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th { background: #f3f3f3; } td.text, th.text { text-align: left; }
figure { margin: 1.5em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.85em; color: #555; max-width: 900px; }
pre { background: #f6f8fa; padding: 0.6em; font-size: 0.8em; overflow-x: auto; }
.muted { color: #777; font-size: 0.85em; }
"""


def write_report(data: ReportData, out_dir: str | Path, *, top_k: int = 10) -> Path:
    """Write ``<out_dir>/<figure>.png`` and ``<out_dir>/index.html``; return the page's path."""
    out = Path(out_dir)
    images = {name: _png(draw(data)) for name, draw in FIGURES.items()}
    images.update({f"scaling-{s.mode}": _png(scaling_figure(s)) for s in data.studies})
    page = out / "index.html"
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, png in images.items():
            (out / f"{name}.png").write_bytes(png)
        page.write_text(render_html(data, images, top_k=top_k), encoding="utf-8")
    except OSError as error:
        where = error.filename or out
        raise ParsearchError(f"cannot write the report to {where}: {error.strerror}") from None
    return page


def render_html(data: ReportData, images: dict[str, bytes], *, top_k: int = 10) -> str:
    """The whole page as text, figures embedded from ``images`` (name -> PNG bytes)."""
    campaign, space = data.campaign, data.space
    title = f"parsearch report: {campaign.name}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        _summary(data),
        _best(data),
        _failures(data),
        "<h2>Figures</h2>",
    ]
    for name in FIGURES:
        encoded = base64.b64encode(images[name]).decode("ascii")
        parts.append(
            f'<figure id="{name}"><img alt="{name}" src="data:image/png;base64,{encoded}">'
            f'<figcaption>{_e(CAPTIONS[name])} (<a href="{name}.png">{name}.png</a>)'
            "</figcaption></figure>"
        )
    parts += _studies(data, images)
    parts += [
        f"<h2>Top {top_k} trials by {_e(data.objective_label)}</h2>",
        _table(_formatted(top_table(data, top_k), data)),
        "<h2>Pareto front (objective vs peak memory)</h2>",
        _pareto(data),
        f'<p class="muted">Generated {time.strftime("%Y-%m-%d %H:%M:%S %Z")} from campaign '
        f"{_e(campaign.name)} (space {_e(space.name)}). Trial numbers (#) are those of the "
        "store: <code>parsearch top</code> and <code>parsearch export</code> show the same "
        "trials.</p>",
        "</body></html>",
    ]
    return "\n".join(parts)


def _studies(data: ReportData, images: dict[str, bytes]) -> list[str]:
    """Each scaling study of the campaign: its figure and its table."""
    parts = []
    for study in data.studies:
        name = f"scaling-{study.mode}"
        encoded = base64.b64encode(images[name]).decode("ascii")
        rows = pd.DataFrame(
            {
                "nodes": p.nodes,
                "devices": p.devices,
                "layout": p.layout.short(),
                "global batch": p.layout.global_batch,
                "tokens/s": "–" if p.tokens_per_s is None else f"{p.tokens_per_s:.4g}",
                "efficiency": "–" if p.efficiency is None else f"{p.efficiency:.1%}",
                "state": p.state,
            }
            for p in study.points
        )
        parts += [
            f"<h2>{_e(study.mode.capitalize())} scaling study</h2>",
            f'<figure id="{name}"><img alt="{name}" src="data:image/png;base64,{encoded}">'
            "<figcaption>Throughput per device relative to the smallest size measured "
            f"(bars; 100%: perfect {_e(study.mode)} scaling) and tokens/s per device (line), "
            f'from <code>parsearch scaling</code> (<a href="{name}.png">{name}.png</a>)'
            "</figcaption></figure>",
            _table(rows),
        ]
    return parts


def _summary(data: ReportData) -> str:
    campaign, space = data.campaign, data.space
    model, alloc = space.model, space.allocation
    counts = data.trials["state"].value_counts()
    budget = campaign.budget if campaign.budget is not None else "none"
    rows = [
        ("campaign", f"{campaign.name} ({campaign.status.value}, backend {campaign.backend})"),
        ("space", f"{space.name} ({campaign.space_path or space.source})"),
        (
            "model",
            f"{model.name}: {model.num_layers} layers, hidden {model.hidden_size}, "
            f"{model.num_heads} heads, sequence {model.seq_length}",
        ),
        (
            "allocation",
            f"{alloc.name}: {count_of(alloc.nodes, 'node')} × "
            f"{count_of(alloc.devices_per_node, 'device')} = "
            f"{space.world_size}; memory limit {format_bytes(data.memory_limit_bytes)} per rank",
        ),
        ("objective", f"{data.objective_label} (maximised)"),
        ("estimate", describe_machine(campaign.settings)),
        ("trials", f"{len(data.trials)} recorded, budget {budget}"),
        ("states", ", ".join(f"{state} {count}" for state, count in counts.items()) or "none"),
    ]
    body = "".join(
        f'<tr><th class="text">{_e(k)}</th><td class="text">{_e(v)}</td></tr>' for k, v in rows
    )
    return f"<table>{body}</table>"


def _best(data: ReportData) -> str:
    row = data.answer()
    if row is None:
        return "<h2>Best layout</h2><p>No trial has finished ok yet.</p>"
    layout = layout_of(row)
    value = format_metric(data.objective, row["objective"])
    parts = [
        "<h2>Best layout</h2>",
        f"<p>Trial #{int(row['number'])}: <b>{_e(layout.short())}</b>, "
        f"{_e(value)} {_e(data.objective_label)}, peak memory "
        f"{_e(_bytes(row['peak_mem_bytes']))} per rank. The same settings for each trainer "
        f"(<code>parsearch best --format NAME</code>):</p>",
    ]
    if row["fidelity"] == "proxy":
        parts.insert(
            2,
            f"<p><b>Predicted, not measured:</b> no full-scale trial succeeded; these figures "
            f"are predicted from a proxy at dp{int(row['proxy_dp'])}.</p>",
        )
    for name in EXPORTERS:
        try:
            text = export(name, layout, data.space)
        except ParsearchError as error:
            text = f"(not expressible: {error})"
        parts.append(f"<details><summary>{_e(name)}</summary><pre>{_e(text)}</pre></details>")
    return "\n".join(parts)


def _failures(data: ReportData) -> str:
    """Failed trials grouped by state and reason (``parsearch show --trial N`` has each)."""
    if not data.failures:
        return ""
    rows = "".join(
        f'<tr><td class="text">{_e(group.state.value)}</td><td>{len(group.trials)}</td>'
        f'<td class="text">{_e(describe_trials(group.trials))}</td>'
        f'<td class="text">{_e(group.reason)}</td></tr>'
        for group in data.failures
    )
    return (
        "<h2>Failures</h2><p>Why trials failed, grouped (<code>parsearch show --store S "
        "--trial N</code> prints one whole, with its log tail):</p>"
        '<table><tr><th class="text">state</th><th>trials</th><th class="text">which</th>'
        f'<th class="text">reason (of the first)</th></tr>{rows}</table>'
    )


def _pareto(data: ReportData) -> str:
    front = pareto_front(data)
    if front.empty:
        return "<p>No ok trial with a measured peak memory yet.</p>"
    table = pd.DataFrame(
        {
            "trial": front["number"].astype(int).to_numpy(),
            "layout": [layout_of(row).short() for _, row in front.iterrows()],
            data.objective: front["objective"].to_numpy(),
            "peak_mem_bytes": front["peak_mem_bytes"].to_numpy(),
        }
    )
    return _table(_formatted(table, data))


def _formatted(table: pd.DataFrame, data: ReportData) -> pd.DataFrame:
    """Numbers as people read them; column names with units spelled out."""
    table = table.copy()
    for column in table.columns:
        metric = column.removeprefix("predicted ")
        if metric == "peak_mem_bytes":
            table[column] = table[column].map(_bytes)
        elif metric in TABLE_FORMATS:
            table[column] = table[column].map(lambda value, m=metric: _number(m, value))
    return table


# Tables compare close neighbours, so they print more digits than figure labels.
TABLE_FORMATS = {
    "tokens_per_s": "{:,.0f}",
    "tflops_per_device": "{:.3g}",  # a CPU rehearsal's 0.0014 must not print as 0.0
    "mfu": "{:.1%}",
    "step_time_s": "{:.3f}",
}


def _number(metric: str, value: float) -> str:
    return "–" if value is None or math.isnan(value) else TABLE_FORMATS[metric].format(value)


def _table(table: pd.DataFrame) -> str:
    if table.empty:
        return "<p>No ok trial yet.</p>"
    text_columns = {"layout"}
    head = "".join(
        f'<th class="{"text" if c in text_columns else ""}">{_e(c)}</th>' for c in table.columns
    )
    rows = []
    for _, row in table.iterrows():
        cells = "".join(
            f'<td class="{"text" if c in text_columns else ""}">{_e(row[c])}</td>'
            for c in table.columns
        )
        rows.append(f"<tr>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _bytes(value: float) -> str:
    return "–" if value is None or math.isnan(value) else format_bytes(value)


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    return buffer.getvalue()


def _e(value: object) -> str:
    return html.escape(str(value))
