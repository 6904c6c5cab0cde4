// parsearch serve: the live dashboard. Polls /api/campaigns/NAME/dashboard and draws SVG.
// No library and no CDN: the page works on a login node that reaches nothing but this server.
"use strict";

const POLL_RUNNING_MS = 2000;
const POLL_IDLE_MS = 15000;
const SVG = "http://www.w3.org/2000/svg";
const COLORS = { ok: "#16a34a", oom: "#dc2626", failed: "#d97706", error: "#d97706",
                 timeout: "#d97706", infeasible: "#9ca3af", accent: "#2563eb" };
const params = new URLSearchParams(location.search);
const token = params.get("token");
const view = { campaign: params.get("campaign"), data: null, format: null,
               sort: { key: "trial", asc: true }, stateFilter: "", layoutFilter: {}, timer: null,
               importanceKey: null, memUnit: null, bestKnownKey: null, bestKnownAt: 0 };

function reportError(message) {
  const list = document.getElementById("errors");
  const item = document.createElement("li");
  item.textContent = message;
  list.appendChild(item);
  list.hidden = false;
  document.body.dataset.errors = String(list.children.length);
}
window.addEventListener("error", (event) => reportError(`script error: ${event.message}`));

async function api(path) {
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  const response = await fetch(`api/${path}`, { headers });
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
  return body;
}

// ---- formatting -------------------------------------------------------------------------
// Every number is printed to `digits` significant figures (3 unless an axis needs more to
// tell its ticks apart), never in exponent form; zeros are dropped only after a decimal
// point: 100 -> "100", 469.5 -> "470", 1.50 -> "1.5", 0.0234 -> "0.0234".

function fixed(value, digits = 3) {
  if (value === null || value === undefined || !Number.isFinite(value)) return "–";
  if (value === 0) return "0";
  const decimals = Math.max(0, digits - 1 - Math.floor(Math.log10(Math.abs(value))));
  const text = value.toFixed(Math.min(decimals, 20));
  return text.includes(".") ? text.replace(/\.?0+$/, "") : text;
}
const SI = [["T", 1e12], ["G", 1e9], ["M", 1e6], ["k", 1e3]];
function si(value, digits = 3) {
  if (value === null || value === undefined || !Number.isFinite(value)) return "–";
  const rounded = Number(value.toPrecision(digits));  // 999.6k is 1M, not 1000k
  for (const [unit, size] of SI) {
    if (Math.abs(rounded) >= size) return `${fixed(rounded / size, digits)}${unit}`;
  }
  return fixed(rounded, digits);
}
// Memory: one binary unit for the whole campaign (view.memUnit), so that the axes, the
// table and the best card read alike: MiB for a laptop's trials, GiB or TiB on a cluster.
const MEM_UNITS = [["TiB", 2 ** 40], ["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10], ["B", 1]];
function memUnit(largest) {
  const found = MEM_UNITS.find(([, size]) => Math.abs(largest || 0) >= size) || MEM_UNITS[3];
  return { name: found[0], size: found[1] };
}
function bytes(value, digits = 3) {
  if (value === null || value === undefined || !Number.isFinite(value)) return "–";
  const unit = view.memUnit || memUnit(value);
  return `${fixed(value / unit.size, digits)} ${unit.name}`;
}
// Raw byte counts in a stored failure reason ("25757796 B exceeds the cap of 25165824 B",
// as older trainers wrote them) in the campaign's unit.
const humanBytes = (text) => text.replace(/\b(\d{4,}) ?B\b/g, (_, n) => bytes(Number(n)));
function metricText(name, value) {
  if (value === null || value === undefined) return "–";
  if (name === "mfu") return `${(100 * value).toFixed(1)}%`;
  if (name.includes("mem")) return bytes(value);
  return si(value);
}
function duration(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  const s = Math.round(seconds);
  if (s < 90) return `${s} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
}
function el(tag, attrs = {}, text = null) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  if (text !== null) node.textContent = text;
  return node;
}
// A figure is drawn at its container's width in CSS pixels (one unit of its viewBox a pixel),
// so its text keeps its CSS size on a phone as on a desktop: a figure drawn at a fixed width
// and scaled to fit shrank its labels to 3-7 px at 390 px. `fallback` while not laid out.
function widthOf(node, fallback) {
  const width = Math.floor(node.clientWidth);
  return width > 0 ? width : fallback;
}
function clear(id) {
  const node = document.getElementById(id);
  node.replaceChildren();
  return node;
}
function message(id, text) {
  const node = clear(id);
  const p = document.createElement("p");
  p.className = "muted";
  p.textContent = text;
  node.appendChild(p);
}

// ---- charts -----------------------------------------------------------------------------

// Round tick values over [lo, hi] (steps of 1, 2 or 5 times a power of ten), and how many
// significant figures tell them apart (at least 3).
function ticks(lo, hi, count = 5, integer = false) {
  if (!(hi > lo)) return { values: [lo], digits: 3 };
  const step0 = integer ? Math.max(1, (hi - lo) / count) : (hi - lo) / count;
  const power = Math.floor(Math.log10(step0));
  const mag = 10 ** power;
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= step0 * (1 - 1e-9));
  const values = [];
  const first = Math.ceil(lo / step - 1e-9);
  for (let i = first; i * step <= hi + 1e-9 * step; i++) values.push(Number((i * step).toPrecision(12)));
  const largest = Math.max(...values.map(Math.abs));
  const stepPower = Math.floor(Math.log10(step) + 1e-9);
  const digits = largest > 0 ? Math.max(3, Math.floor(Math.log10(largest) + 1e-9) - stepPower + 1) : 3;
  return { values, digits };
}

// A plot frame: linear scales over [x0, x1] x [y0, y1] with axes, grid and labels.
// xFormat and yFormat take (value, significant digits).
function frame(container, { x, y, xLabel, yLabel, xFormat = si, yFormat = si, width = widthOf(container, 520),
                             height = 300, count = 5, xInteger = false }) {
  const m = { left: 62, right: 14, top: 10, bottom: 42 };
  const svg = el("svg", { viewBox: `0 0 ${width} ${height}`, role: "img" });
  const pad = (lo, hi) => (hi > lo ? [lo, hi] : [lo - Math.abs(lo || 1) * 0.1, hi + Math.abs(hi || 1) * 0.1]);
  const [x0, x1] = pad(x[0], x[1]);
  const [y0, y1] = pad(y[0], y[1]);
  const sx = (v) => m.left + ((v - x0) / (x1 - x0)) * (width - m.left - m.right);
  const sy = (v) => height - m.bottom - ((v - y0) / (y1 - y0)) * (height - m.top - m.bottom);
  const grid = el("g", { class: "grid" });
  const axis = el("g", { class: "axis" });
  const yTicks = ticks(y0, y1, count);
  for (const t of yTicks.values) {
    grid.appendChild(el("line", { x1: m.left, x2: width - m.right, y1: sy(t), y2: sy(t) }));
    axis.appendChild(el("text", { x: m.left - 6, y: sy(t) + 4, "text-anchor": "end", class: "tick y" },
                        yFormat(t, yTicks.digits)));
  }
  const xTicks = ticks(x0, x1, count, xInteger);
  for (const t of xTicks.values) {
    grid.appendChild(el("line", { x1: sx(t), x2: sx(t), y1: m.top, y2: height - m.bottom }));
    axis.appendChild(el("text", { x: sx(t), y: height - m.bottom + 15, "text-anchor": "middle", class: "tick x" },
                        xFormat(t, xTicks.digits)));
  }
  axis.appendChild(el("path", { d: `M${m.left},${m.top}V${height - m.bottom}H${width - m.right}`, fill: "none" }));
  axis.appendChild(el("text", { x: (m.left + width - m.right) / 2, y: height - 6, "text-anchor": "middle",
                                class: "label x" }, xLabel));
  const yl = el("text", { x: 12, y: (m.top + height - m.bottom) / 2, "text-anchor": "middle", class: "label y",
                          transform: `rotate(-90 12 ${(m.top + height - m.bottom) / 2})` }, yLabel);
  axis.appendChild(yl);
  svg.append(grid, axis);
  container.appendChild(svg);
  return { svg, sx, sy, m, width, height };
}
// Tick labels of a memory axis drawn in the campaign's unit.
const memTick = (v, digits) => `${fixed(v, digits)} ${view.memUnit.name}`;
const percentTick = (v, digits) => `${fixed(100 * v, digits)}%`;
const objectiveFormat = (data) => (data.campaign.objective_metric === "mfu" ? percentTick : si);
const objectiveText = (data, value) => metricText(data.campaign.objective_metric, value);

function extent(values) {
  const finite = values.filter((v) => v !== null && v !== undefined && Number.isFinite(v));
  return finite.length ? [Math.min(...finite), Math.max(...finite)] : [0, 1];
}
function dot(plot, x, y, color, title, r = 4) {
  const c = el("circle", { cx: plot.sx(x), cy: plot.sy(y), r, fill: color, "fill-opacity": 0.8 });
  c.appendChild(el("title", {}, title));
  plot.svg.appendChild(c);
}

function drawConvergence(data) {
  const rows = data.convergence;
  if (!rows.length) return message("convergence", "no finished trial yet");
  const node = clear("convergence");
  const [lo, hi] = extent(rows.map((r) => r.value));
  const span = hi > lo ? hi - lo : Math.abs(hi) || 1;
  // Room below the lowest value for the strip of failed trials.
  const plot = frame(node, { x: [1, Math.max(rows.length, 2)], y: [lo - 0.15 * span, hi + 0.05 * span],
                             xLabel: "finished trials", yLabel: data.objective_label, xInteger: true,
                             yFormat: objectiveFormat(data) });
  let path = "";
  for (const r of rows) {
    if (r.best_so_far === null) continue;
    const x = plot.sx(r.finished);
    const y = plot.sy(r.best_so_far);
    path += path ? `H${x}V${y}` : `M${x},${y}`;
  }
  if (path) {
    path += `H${plot.sx(Math.max(rows.length, 2))}`;
    plot.svg.appendChild(el("path", { d: path, fill: "none", stroke: COLORS.accent, "stroke-width": 2 }));
  }
  const strip = plot.height - plot.m.bottom - 4;
  for (const r of rows) {
    if (r.value !== null) {
      dot(plot, r.finished, r.value, COLORS.ok, `#${r.number}: ${objectiveText(data, r.value)}`, 3.5);
    } else {
      const mark = el("rect", { x: plot.sx(r.finished) - 2, y: strip - 6, width: 4, height: 8,
                                fill: COLORS[r.state] || COLORS.failed });
      mark.appendChild(el("title", {}, `#${r.number}: ${r.state}`));
      plot.svg.appendChild(mark);
    }
  }
}

const CELL_TEXT = { oom: "OOM", failed: "failed", no_divide: "invalid", predicted_oom: "pred. OOM",
                    not_run: "not run" };
const CELL_FILL = { oom: "#fecaca", failed: "#fde68a", no_divide: "#f3f4f6", predicted_oom: "#fee2e2",
                    not_run: "#ffffff" };

function drawHeatmap(data) {
  const map = data.heatmap;
  const node = clear("heatmap");
  const width = widthOf(node, 520);
  const left = 46, top = 8, bottom = 38;
  const cw = (width - left - 8) / map.tp.length;
  const ch = Math.min(42, Math.max(26, 260 / map.pp.length));
  const height = top + ch * map.pp.length + bottom;
  const svg = el("svg", { viewBox: `0 0 ${width} ${height}`, role: "img" });
  const values = map.cells.filter((c) => c.kind === "ok").map((c) => c.best);
  const [lo, hi] = extent(values);
  const shade = (v) => {
    const t = hi > lo ? (v - lo) / (hi - lo) : 1;
    const light = 92 - 52 * t;
    return `hsl(215, 80%, ${light}%)`;
  };
  map.cells.forEach((cell) => {
    const col = map.tp.indexOf(cell.tp);
    const row = map.pp.indexOf(cell.pp);
    const x = left + col * cw;
    const y = top + row * ch;
    const best = map.best && map.best.tp === cell.tp && map.best.pp === cell.pp;
    const rect = el("rect", { x: x + 1, y: y + 1, width: cw - 2, height: ch - 2, rx: 3,
                              fill: cell.kind === "ok" ? shade(cell.best) : CELL_FILL[cell.kind],
                              stroke: best ? "#dc2626" : "#e5e7eb", "stroke-width": best ? 2.5 : 1,
                              class: `cell cell-${cell.kind}` });
    const why = cell.kind === "ok" ? `${objectiveText(data, cell.best)} (#${cell.best_number})` : CELL_TEXT[cell.kind];
    rect.appendChild(el("title", {}, `tp ${cell.tp} × pp ${cell.pp}: ${why}; ${cell.trials} trial(s)`));
    svg.appendChild(rect);
    const label = cell.kind === "ok" ? objectiveText(data, cell.best) : CELL_TEXT[cell.kind];
    const dark = cell.kind === "ok" && hi > lo && (cell.best - lo) / (hi - lo) > 0.55;
    svg.appendChild(el("text", { x: x + cw / 2, y: y + ch / 2, class: "cell-label", "data-tp": cell.tp, "data-pp": cell.pp,
                                 fill: dark ? "#fff" : cell.kind === "oom" ? "#991b1b" : "#374151" }, label));
  });
  map.tp.forEach((tp, i) => svg.appendChild(el("text", { x: left + (i + 0.5) * cw, y: height - bottom + 15,
                                                         "text-anchor": "middle" }, tp)));
  map.pp.forEach((pp, i) => svg.appendChild(el("text", { x: left - 8, y: top + (i + 0.5) * ch + 4,
                                                         "text-anchor": "end" }, pp)));
  svg.appendChild(el("text", { x: (left + width) / 2, y: height - 6, "text-anchor": "middle" }, "TP"));
  svg.appendChild(el("text", { x: 10, y: top + (ch * map.pp.length) / 2, "text-anchor": "middle",
                               transform: `rotate(-90 10 ${top + (ch * map.pp.length) / 2})` }, "PP"));
  node.appendChild(svg);
}

function drawPareto(data) {
  const ok = data.trials.filter((t) => t.state === "ok" && t.metrics.peak_mem_bytes && t.objective.value !== null);
  if (!ok.length) return message("pareto", "no ok trial with a measured memory yet");
  const node = clear("pareto");
  const unit = view.memUnit.size;
  const mems = ok.map((t) => t.metrics.peak_mem_bytes / unit);
  const limit = data.memory_limit_bytes / unit;
  const [, m1] = extent([...mems, limit]);
  const [o0, o1] = extent(ok.map((t) => t.objective.value));
  const plot = frame(node, { x: [0, m1 * 1.05], y: [o0 * 0.9, o1 * 1.05], xLabel: "peak memory per rank",
                             yLabel: data.objective_label, xFormat: memTick, yFormat: objectiveFormat(data) });
  const front = data.pareto.map((t) => t.trial);
  for (const t of ok) {
    const on = front.includes(t.trial);
    dot(plot, t.metrics.peak_mem_bytes / unit, t.objective.value, on ? COLORS.accent : "#94a3b8",
        `#${t.trial} ${t.layout_short}: ${objectiveText(data, t.objective.value)}, ${bytes(t.metrics.peak_mem_bytes)}`,
        on ? 5 : 3.5);
  }
  const pts = data.pareto.map((t) => `${plot.sx(t.metrics.peak_mem_bytes / unit)},${plot.sy(t.objective.value)}`);
  if (pts.length > 1) {
    plot.svg.appendChild(el("polyline", { points: pts.join(" "), fill: "none", stroke: COLORS.accent,
                                          "stroke-width": 1.5, "stroke-dasharray": "4 3" }));
  }
  if (limit) {
    const x = plot.sx(limit);
    plot.svg.appendChild(el("line", { x1: x, x2: x, y1: plot.m.top, y2: plot.height - plot.m.bottom,
                                      stroke: COLORS.oom, "stroke-dasharray": "5 4" }));
    plot.svg.appendChild(el("text", { x: x - 4, y: plot.height - plot.m.bottom - 6, "text-anchor": "end",
                                      fill: COLORS.oom, class: "limit" }, `limit ${bytes(data.memory_limit_bytes)}`));
  }
}

function drawFidelity(data, metric, id, label) {
  const fit = data.fidelity[metric];
  const caption = document.getElementById(`${id}-caption`);
  caption.textContent = fit ? fit.caption : "";
  if (!fit || !fit.n) return message(id, `${label}: nothing to compare yet`);
  const node = clear(id);
  const memory = metric.includes("mem");
  const unit = memory ? view.memUnit.size : 1;
  const pairs = fit.pairs.map((p) => ({ ...p, predicted: p.predicted / unit, measured: p.measured / unit }));
  const [lo, hi] = extent(pairs.flatMap((p) => [p.predicted, p.measured]));
  const fmt = memory ? memTick : metric === "mfu" ? percentTick : si;
  const plot = frame(node, { x: [lo * 0.9, hi * 1.05], y: [lo * 0.9, hi * 1.05], xLabel: `predicted ${label}`,
                             yLabel: "measured", xFormat: fmt, yFormat: fmt, height: 250, count: 4 });
  plot.svg.appendChild(el("line", { x1: plot.sx(lo * 0.9), y1: plot.sy(lo * 0.9), x2: plot.sx(hi * 1.05),
                                    y2: plot.sy(hi * 1.05), stroke: "#9ca3af", "stroke-dasharray": "4 3" }));
  for (const p of pairs) {
    dot(plot, p.predicted, p.measured, COLORS.accent, `#${p.number}: ratio ${p.ratio.toFixed(2)}`, 3);
  }
}

// ---- parallel coordinates, importance, timeline -----------------------------------------

const shadeOf = (lo, hi) => (v) => `hsl(${215 - 175 * (hi > lo ? (v - lo) / (hi - lo) : 1)}, 75%, 45%)`;

// One vertical axis per searched dimension (its values evenly spaced, in the space's order)
// and one for the objective; each ok trial a line across them.
function drawParallel(data) {
  const names = Object.keys(data.dimensions || {});
  const ok = data.trials.filter((t) => t.state === "ok" && t.objective.value !== null);
  if (!names.length) return message("parallel", "the space searches no dimension");
  if (!ok.length) return message("parallel", "no ok trial yet");
  const node = clear("parallel");
  const width = widthOf(node, 1000), height = 300, top = 24, bottom = 30, left = 40, right = 60;
  const axes = [...names, "objective"];
  const ax = (i) => left + (i * (width - left - right)) / (axes.length - 1);
  const svg = el("svg", { viewBox: `0 0 ${width} ${height}`, role: "img" });
  const [lo, hi] = extent(ok.map((t) => t.objective.value));
  const yOf = (name, t) => {
    if (name === "objective") {
      const f = hi > lo ? (t.objective.value - lo) / (hi - lo) : 0.5;
      return height - bottom - f * (height - top - bottom);
    }
    const values = data.dimensions[name];
    const i = values.indexOf(t.layout[name]);
    const f = values.length > 1 ? i / (values.length - 1) : 0.5;
    return height - bottom - f * (height - top - bottom);
  };
  const shade = shadeOf(lo, hi);
  const lines = el("g", { class: "pc-lines" });
  for (const t of [...ok].sort((a, b) => a.objective.value - b.objective.value)) {
    const points = axes.map((name, i) => `${ax(i)},${yOf(name, t)}`).join(" ");
    const line = el("polyline", { points, class: "pc-line", stroke: shade(t.objective.value), "data-trial": t.trial });
    line.appendChild(el("title", {}, `#${t.trial} ${t.layout_short}: ${objectiveText(data, t.objective.value)}`));
    lines.appendChild(line);
  }
  svg.appendChild(lines);
  axes.forEach((name, i) => {
    const g = el("g", { class: "pc-axis" });
    g.appendChild(el("line", { x1: ax(i), x2: ax(i), y1: top, y2: height - bottom }));
    g.appendChild(el("text", { x: ax(i), y: height - 8, "text-anchor": "middle", class: "label" },
                     name === "objective" ? data.objective_label : name));
    const labels = name === "objective" ? [lo, hi] : data.dimensions[name];
    labels.forEach((value, j) => {
      const f = labels.length > 1 ? j / (labels.length - 1) : 0.5;
      const text = name === "objective" ? objectiveText(data, value) : String(value);
      g.appendChild(el("text", { x: ax(i) + 5, y: height - bottom - f * (height - top - bottom) + 4,
                                 class: "tick", "data-axis": name }, text));
    });
    svg.appendChild(g);
  });
  node.appendChild(svg);
}

// Permutation importance from /importance (fetched apart: it takes a second to compute).
function drawImportance(found) {
  const caption = document.getElementById("importance-caption");
  const node = document.getElementById("importance");
  view.importance = found;  // drawn again when the page's width changes
  if (!found.dimensions.length) {
    message("importance", found.note || "nothing to rank yet");
    caption.textContent = found.method;
    node.dataset.state = "ready";
    return;
  }
  const rows = found.dimensions;
  const width = widthOf(clear("importance"), 520), rowH = 26, left = 110, right = 70;
  const height = rows.length * rowH + 10;
  const svg = el("svg", { viewBox: `0 0 ${width} ${height}`, role: "img" });
  const top = Math.max(...rows.map((r) => r.importance || 0), 1e-9);
  rows.forEach((r, i) => {
    const y = 5 + i * rowH;
    const w = (Math.max(0, r.importance || 0) / top) * (width - left - right);
    svg.appendChild(el("text", { x: left - 8, y: y + rowH / 2 + 4, "text-anchor": "end" }, r.name));
    const bar = el("rect", { x: left, y: y + 4, width: Math.max(w, 1), height: rowH - 8, rx: 3,
                             fill: COLORS.accent, class: "importance-bar", "data-name": r.name });
    bar.appendChild(el("title", {}, `${r.name}: ${fixed(r.importance)} ± ${fixed(r.std)} (${r.values_tried} values tried)`));
    svg.appendChild(bar);
    svg.appendChild(el("text", { x: left + Math.max(w, 1) + 6, y: y + rowH / 2 + 4, class: "bar-label" },
                       fixed(r.importance)));
  });
  node.appendChild(svg);
  caption.textContent = `${found.method}; ${found.n} trials, forest R² ${fixed(found.r2)}` +
    (found.r2 !== null && found.r2 < 0.5 ? " (a poor fit: read the ranking loosely)" : "");
  node.dataset.state = "ready";
}

// Asked again when the trials changed, at most every 20 s for the same campaign (the server
// recomputes it at most every 30 s anyway).
async function refreshImportance(data) {
  const key = `${view.campaign}/${data.status.finished}/${data.trials_total}`;
  if (view.importanceKey === key) return;
  const sameCampaign = (view.importanceKey || "").startsWith(`${view.campaign}/`);
  if (sameCampaign && Date.now() - (view.importanceAt || 0) < 20000) return;
  view.importanceKey = key;
  view.importanceAt = Date.now();
  try {
    drawImportance(await api(`campaigns/${encodeURIComponent(view.campaign)}/importance`));
  } catch (error) {
    view.importanceKey = null;
    message("importance", `importance: ${error.message}`);
  }
}

// When each trial ran on the timeline's clock, as [start, end] seconds from its origin, by
// trial number. A simulate campaign's clock is the trials' own time: the backend answers a
// trial from the estimate in milliseconds of wall time, so each trial is laid on its nodes
// for its simulated duration, starting when the trials before it there ended (in the
// order they started). Any other campaign's clock is the wall clock from the first start.
function timelineSpans(data, ran, now) {
  const spans = new Map();
  if (data.campaign.backend === "simulate") {
    const free = {};
    const order = [...ran].sort((a, b) => a.started_at - b.started_at || a.trial - b.trial);
    for (const t of order) {
      const start = Math.max(0, ...t.hosts.map((h) => free[h] || 0));
      const end = start + (t.duration_s || 0);
      for (const h of t.hosts) free[h] = end;
      spans.set(t.trial, [start, end]);
    }
    return { spans, label: "simulated time: the trials' own durations" };
  }
  const t0 = Math.min(...ran.map((t) => t.started_at));
  for (const t of ran) spans.set(t.trial, [t.started_at - t0, (t.finished_at || now) - t0]);
  return { spans, label: "time since the first trial started" };
}

// Each node a row, each trial a bar from its start to its end (still running: to now), on
// every node it ran on: idle nodes show as gaps.
function drawTimeline(data) {
  const ran = data.trials.filter((t) => t.started_at && (t.hosts || []).length);
  if (!ran.length) return message("timeline", "no trial has started yet");
  const node = clear("timeline");
  const hosts = [...new Set(ran.flatMap((t) => t.hosts))].sort((a, b) => a.localeCompare(b, undefined, { numeric: true }));
  const { spans, label } = timelineSpans(data, ran, Date.now() / 1000);
  const rowH = Math.max(1, Math.min(18, 300 / hosts.length));  // at most ~300 px tall
  // The axis in one unit of time, chosen by the span: s, min or h.
  const span = Math.max(...[...spans.values()].map(([, end]) => end), 1);
  const [size, unit] = span < 120 ? [1, "s"] : span < 7200 ? [60, "min"] : [3600, "h"];
  const plot = frame(node, { x: [0, span / size], y: [0, hosts.length], xLabel: label,
                             yLabel: "", xFormat: (v, digits) => `${fixed(v, digits)} ${unit}`, yFormat: () => "",
                             height: 52 + rowH * hosts.length, count: 6 });
  const at = (seconds) => plot.sx(seconds / size);
  const row = Object.fromEntries(hosts.map((h, i) => [h, i]));
  const y = (i) => plot.m.top + i * rowH;
  if (hosts.length <= 40) {
    hosts.forEach((h, i) => plot.svg.appendChild(el("text", { x: plot.m.left - 6, y: y(i) + rowH / 2 + 4,
                                                              "text-anchor": "end", class: "host" }, h)));
  }
  for (const t of ran) {
    const [start, end] = spans.get(t.trial);
    const x0 = at(start);
    const x1 = at(end);
    for (const h of t.hosts) {
      const bar = el("rect", { x: x0, y: y(row[h]) + 1, width: Math.max(1, x1 - x0), height: Math.max(1, rowH - 2),
                               fill: COLORS[t.state] || (t.state === "running" ? COLORS.accent : COLORS.failed),
                               class: "run", "data-trial": t.trial, "data-host": h, "data-start-s": start,
                               "data-end-s": end });
      bar.appendChild(el("title", {}, `#${t.trial} ${t.state} on ${h}: ${t.layout_short}, ${duration(end - start)}`));
      plot.svg.appendChild(bar);
    }
  }
}

// ---- cards and table --------------------------------------------------------------------

// What the campaign is doing: its stored status, except that one left "running" by a driver
// that was killed (no live driver holds its lease) is "not running".
const activity = (s) => (s.status === "running" && s.live === false ? "not running" : s.status);

function drawProgress(data) {
  const s = data.status;
  const pill = document.getElementById("campaign-status");
  pill.textContent = activity(s);
  pill.className = `pill ${activity(s).replace(" ", "-")}`;
  const share = s.budget ? Math.min(1, s.finished / s.budget) : 0;
  document.getElementById("progress-bar").style.width = `${(100 * share).toFixed(1)}%`;
  document.getElementById("progress-text").textContent =
    `${s.finished} / ${s.budget ?? "?"} trials (${Math.round(100 * share)}%)`;
  const chips = clear("states");
  for (const [state, n] of Object.entries(s.states)) {
    if (!n) continue;
    const chip = document.createElement("span");
    chip.className = `chip ${state}`;
    chip.textContent = state;
    const count = document.createElement("b");
    count.textContent = n;
    chip.appendChild(count);
    chips.appendChild(chip);
  }
  document.getElementById("eta").textContent =
    s.eta_s !== null ? `ETA ${duration(s.eta_s)} at the recent rate`
      : activity(s) === "running" ? "ETA after a few trials"
      : s.finish_reason ? `ended before its budget: ${s.finish_reason}` : "";
  const d = s.driver;
  const gone = activity(s) === "not running";
  document.getElementById("driver").textContent = d
    ? `driver pid ${d.pid} on ${d.host}, heartbeat ${duration(d.silent_s)} ago` +
      (gone ? " — it seems dead (killed?): parsearch resume continues the campaign" : "")
    : gone ? "no driver runs it: the last one stopped without finishing; parsearch resume continues the campaign"
    : s.stop_reason ? `stopped: ${humanBytes(s.stop_reason)}` : `backend ${s.backend}`;
}

function drawBest(data) {
  const best = data.best;
  const tabs = clear("export-tabs");
  const text = document.getElementById("export-text");
  if (!best) {
    document.getElementById("best-value").textContent = "no successful trial yet";
    document.getElementById("best-layout").textContent = "";
    document.getElementById("best-detail").textContent = "";
    text.textContent = "";
    return;
  }
  document.getElementById("best-value").textContent =
    `${metricText(best.objective.metric, best.objective.value)} ${data.objective_label}`;
  document.getElementById("best-layout").textContent = `${best.layout_short}  (trial #${best.trial})`;
  const m = best.metrics;
  const p = best.predicted || {};
  document.getElementById("best-detail").textContent =
    `MFU ${metricText("mfu", m.mfu)} · step ${si(m.step_time_s)} s · memory/rank ${bytes(m.peak_mem_bytes)} ` +
    `(predicted ${bytes(p.peak_mem_bytes)})`;
  const names = Object.keys(data.exports);
  if (!names.includes(view.format)) view.format = names.includes("megatron") ? "megatron" : names[0];
  for (const name of names) {
    const button = document.createElement("button");
    button.textContent = name;
    button.className = name === view.format ? "active" : "";
    button.addEventListener("click", () => { view.format = name; drawBest(view.data); });
    tabs.appendChild(button);
  }
  const chosen = data.exports[view.format];
  text.textContent = chosen.text ?? `not expressible: ${chosen.error}`;
}

// The best layout any campaign of the store found for this campaign's model on its
// allocation (/best-known: `parsearch best --like` with this campaign's space), with where it
// came from and whether it was measured or only predicted. `found` null: the server's reason
// (nothing comparable was measured, or this campaign's space no longer loads) in `why`.
function drawBestKnown(found, why = null, failed = false) {
  const card = document.getElementById("best-known-card");
  const value = document.getElementById("best-known-value");
  const layout = document.getElementById("best-known-layout");
  const detail = clear("best-known-detail");
  const like = document.getElementById("best-known-like");
  if (!found) {
    card.dataset.state = failed ? "error" : "none";
    value.textContent = failed ? "cannot be read now"
      : view.data && view.data.space_error ? "cannot be compared" : "nothing comparable measured";
    layout.textContent = "";
    detail.textContent = why;
    like.textContent = "";
    return;
  }
  card.dataset.state = "ready";
  const b = found.best;
  const tokens = b.metrics.tokens_per_s ?? (b.objective.metric === "tokens_per_s" ? b.objective.value : null);
  value.textContent = `${si(tokens)} tokens/s`;
  layout.textContent = `${b.layout_short}  (trial #${b.trial})`;
  const here = b.campaign === view.campaign;
  const link = document.createElement("a");
  link.href = pageHref(b.campaign);
  link.className = "campaign";
  link.textContent = b.campaign;
  const finished = b.finished_at ? `, finished ${new Date(b.finished_at * 1000).toLocaleString()}` : "";
  detail.append(here ? "this campaign " : "campaign ", link,
                `, trial #${b.trial}${finished} · ${b.provenance} · trainer ${b.trainer}`);
  const allocations = found.other_allocations.map((o) => `${o.campaign} (${o.nodes} nodes)`);
  const total = found.campaigns_in_store;
  like.textContent = `${found.like} · ${found.ranked.length} of the store's ${total} ` +
    `campaign${total === 1 ? "" : "s"} compare` +
    (allocations.length ? ` · the same model at other node counts: ${allocations.join(", ")}` : "");
}

// Asked when the campaign opens, and again every 30 s (other campaigns of the store move it
// too, and the answer reads every campaign's space).
async function refreshBestKnown() {
  const key = view.campaign;
  if (view.bestKnownKey === key && Date.now() - view.bestKnownAt < 30000) return;
  view.bestKnownKey = key;
  view.bestKnownAt = Date.now();
  const path = `campaigns/${encodeURIComponent(key)}/best-known`;
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  try {
    const response = await fetch(`api/${path}`, { headers });
    const body = await response.json();
    if (view.campaign !== key) return;  // another campaign was chosen meanwhile
    if (response.ok) drawBestKnown(body);
    else drawBestKnown(null, body.error || `HTTP ${response.status}`, response.status !== 404);
  } catch (error) {
    view.bestKnownKey = null;
    drawBestKnown(null, error.message, true);
  }
}

const COLUMNS = [
  ["trial", "#", (t) => t.trial, true],
  ["state", "state", (t) => t.state, false],
  ["layout", "layout", (t) => t.layout_short, false],
  ["objective", "objective", (t) => t.objective.value, true],
  ["predicted", "predicted", (t) => (t.predicted || {})[t.objective.metric] ?? null, true],
  ["mfu", "MFU", (t) => t.metrics.mfu ?? null, true],
  ["mem", "memory/rank", (t) => t.metrics.peak_mem_bytes ?? null, true],
  ["duration", "duration", (t) => t.duration_s, true],
  ["reason", "failure reason", (t) => t.error || "", false],
];

function drawTrials(data) {
  const head = document.querySelector("#trials thead tr");
  if (!head.children.length) {
    for (const [key, title] of COLUMNS) {
      const th = document.createElement("th");
      th.textContent = title;
      th.dataset.key = key;
      th.addEventListener("click", () => {
        view.sort = { key, asc: view.sort.key === key ? !view.sort.asc : key === "trial" };
        drawTrials(view.data);
      });
      head.appendChild(th);
    }
  }
  for (const th of head.children) {
    th.className = th.dataset.key === view.sort.key ? `sorted ${view.sort.asc ? "asc" : ""}` : "";
  }
  const column = COLUMNS.find(([key]) => key === view.sort.key);
  drawLayoutFilters(data);
  const wanted = Object.entries(view.layoutFilter).filter(([, value]) => value !== "");
  const rows = data.trials.filter((t) => (!view.stateFilter || t.state === view.stateFilter) &&
    wanted.every(([name, value]) => String(t.layout[name]) === value));
  rows.sort((a, b) => {
    const va = column[2](a);
    const vb = column[2](b);
    if (va === vb) return a.trial - b.trial;
    if (va === null || va === undefined) return 1;
    if (vb === null || vb === undefined) return -1;
    const order = va < vb ? -1 : 1;
    return view.sort.asc ? order : -order;
  });
  const body = document.querySelector("#trials tbody");
  const fragment = document.createDocumentFragment();
  for (const t of rows) {
    const tr = document.createElement("tr");
    tr.className = `state-${t.state}`;
    const cells = [
      [t.trial, "num"], [t.state, "state"], [t.layout_short, "mono"],
      [metricText(t.objective.metric, t.objective.value), "num"],
      [metricText(t.objective.metric, (t.predicted || {})[t.objective.metric]), "num"],
      [metricText("mfu", t.metrics.mfu), "num"], [bytes(t.metrics.peak_mem_bytes ?? null), "num"],
      [duration(t.duration_s), "num"], [humanBytes(t.error || ""), "reason"],
    ];
    for (const [value, cls] of cells) {
      const td = document.createElement("td");
      td.textContent = value;
      td.className = cls;
      tr.appendChild(td);
    }
    tr.addEventListener("click", () => showTrial(t.trial));
    fragment.appendChild(tr);
  }
  body.replaceChildren(fragment);
  document.getElementById("trials-note").textContent = data.trials_total > data.trials.length
    ? `the newest ${data.trials.length} of ${data.trials_total}; /api/campaigns/NAME/trials has all`
    : "";
  const filter = document.getElementById("state-filter");
  const states = [...new Set(data.trials.map((t) => t.state))].sort();
  const have = [...filter.options].map((o) => o.value);
  for (const state of states) {
    if (!have.includes(state)) filter.appendChild(new Option(state, state));
  }
}

// A select per searched dimension ("tp: all", "tp 2", ...), kept across polls.
function drawLayoutFilters(data) {
  const holder = document.getElementById("layout-filters");
  const names = Object.keys(data.dimensions || {});
  const key = names.map((n) => `${n}=${data.dimensions[n].join(",")}`).join(";");
  if (holder.dataset.key === key) return;
  holder.dataset.key = key;
  holder.replaceChildren();
  view.layoutFilter = {};
  for (const name of names) {
    const select = document.createElement("select");
    select.setAttribute("aria-label", `${name} filter`);
    select.dataset.name = name;
    select.appendChild(new Option(`${name}: all`, ""));
    for (const value of data.dimensions[name]) select.appendChild(new Option(`${name} ${value}`, String(value)));
    select.addEventListener("change", () => {
      view.layoutFilter[name] = select.value;
      drawTrials(view.data);
    });
    view.layoutFilter[name] = "";
    holder.appendChild(select);
  }
}

async function showTrial(number) {
  try {
    const t = await api(`campaigns/${encodeURIComponent(view.campaign)}/trials/${number}`);
    document.getElementById("trial-detail").hidden = false;
    document.getElementById("trial-detail-title").textContent =
      `trial #${t.trial}: ${t.state} · ${t.layout_short}${t.error ? ` · ${humanBytes(t.error)}` : ""}`;
    document.getElementById("trial-detail-log").textContent = t.log_tail || "(no log)";
  } catch (error) {
    reportError(`trial #${number}: ${error.message}`);
  }
}

// ---- the loop ---------------------------------------------------------------------------

// The campaign's memory unit: that of its largest measured or predicted peak (the limit
// before any trial reported one).
function campaignMemUnit(data) {
  let largest = 0;
  for (const t of data.trials) {
    largest = Math.max(largest, t.metrics.peak_mem_bytes || 0, (t.predicted || {}).peak_mem_bytes || 0);
  }
  return memUnit(largest || data.memory_limit_bytes);
}

// The figures that need the campaign's space (its dimensions, its plan, the estimate): a
// campaign whose stored space no longer loads gets none of them, and says why once, above.
const SPACE_CHARTS = ["convergence", "heatmap", "fidelity-objective", "fidelity-memory", "parallel", "importance"];

// The figures, each at its container's width.
function drawCharts(data) {
  if (data.space_error) {
    for (const id of SPACE_CHARTS) message(id, "not drawn: it needs the campaign's space, which no longer loads (above)");
    for (const id of ["fidelity-objective-caption", "fidelity-memory-caption", "importance-caption"]) {
      document.getElementById(id).textContent = "";
    }
  } else {
    drawConvergence(data);
    drawHeatmap(data);
    drawFidelity(data, data.campaign.objective_metric, "fidelity-objective", data.objective_label);
    drawFidelity(data, "peak_mem_bytes", "fidelity-memory", "memory/rank");
    drawParallel(data);
  }
  drawPareto(data);
  drawTimeline(data);
}

// Why the campaign's figures are missing, naming what no longer loads (a deleted machine
// profile, a space from an older release); its trials are listed all the same.
function drawSpaceError(data) {
  const card = document.getElementById("space-error");
  card.hidden = !data.space_error;
  document.getElementById("space-error-text").textContent = data.space_error || "";
}

function draw(data) {
  view.memUnit = campaignMemUnit(data);
  view.chartsWidth = document.querySelector("main").clientWidth;
  drawSpaceError(data);
  drawProgress(data);
  drawBest(data);
  drawCharts(data);
  drawTrials(data);
  if (!data.space_error) refreshImportance(data);
  refreshBestKnown();
}

// A change of the page's width (a phone turned, a window resized) redraws the figures at
// their new widths; a change of height alone (a phone's address bar) does not.
window.addEventListener("resize", () => {
  clearTimeout(view.resizeTimer);
  view.resizeTimer = setTimeout(() => {
    const width = document.querySelector("main").clientWidth;
    if (!view.data || width === view.chartsWidth) return;
    view.chartsWidth = width;
    drawCharts(view.data);
    if (!view.data.space_error && view.importance && view.importance.dimensions.length) drawImportance(view.importance);
  }, 150);
});

async function refresh() {
  clearTimeout(view.timer);
  let wait = POLL_IDLE_MS;
  try {
    const data = await api(`campaigns/${encodeURIComponent(view.campaign)}/dashboard`);
    view.data = data;
    const option = [...document.getElementById("campaign").options].find((o) => o.value === view.campaign);
    if (option) option.textContent = `${view.campaign} (${activity(data.status)})`;
    draw(data);
    document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    document.body.dataset.state = "ready";
    document.body.dataset.finished = String(data.status.finished);
    if (activity(data.status) === "running" || data.status.status === "created") wait = POLL_RUNNING_MS;
  } catch (error) {
    document.getElementById("updated").textContent = `update failed: ${error.message}`;
    wait = POLL_RUNNING_MS;
  }
  view.timer = setTimeout(refresh, wait);
}

// ---- the list of a store's campaigns ----------------------------------------------------

// This page for `campaign` (the list without one), keeping the token it was opened with.
function pageHref(campaign) {
  const query = new URLSearchParams();
  if (campaign) query.set("campaign", campaign);
  if (token) query.set("token", token);
  return `?${query}`;
}

// A table cell: its figure (a text or a node) over a line of detail.
function listCell(key, main, detail = null) {
  const td = document.createElement("td");
  td.className = key;
  td.append(main);
  if (detail) {
    const line = document.createElement("div");
    line.className = "detail";
    line.textContent = detail;
    td.append(line);
  }
  return td;
}

// One row per campaign: what it trains on what, how far it got and its best trial; the
// campaign's name opens its page.
function drawCampaignList(campaigns) {
  const fragment = document.createDocumentFragment();
  for (const c of campaigns) {
    const tr = document.createElement("tr");
    tr.dataset.campaign = c.name;
    const link = document.createElement("a");
    link.href = pageHref(c.name);
    link.textContent = c.name;
    const state = document.createElement("span");
    state.className = `pill ${activity(c).replace(" ", "-")}`;
    state.textContent = activity(c);
    const a = c.allocation;
    const best = c.best;
    tr.append(
      listCell("name", link, `${c.backend} backend, objective ${c.objective_metric}`),
      listCell("model", c.model.name, c.model.summary ?? `its stored space no longer loads: ${c.space_error}`),
      a ? listCell("allocation", `${a.nodes} × ${a.devices_per_node} ${a.device}`,
                   `${bytes(a.device_memory_bytes)}, ${fixed(a.peak_flops_per_device / 1e12, 4)} TFLOP/s peak · ${a.name}`)
        : listCell("allocation", "–"),
      listCell("state", state),
      listCell("trials num", `${c.finished} / ${c.budget ?? "?"}`),
      best ? listCell("best num", si(best.tokens_per_s),
                      `${best.layout_short} (#${best.trial}${best.fidelity === "proxy" ? ", predicted from a proxy" : ""})`)
        : listCell("best num", "–"),
    );
    fragment.appendChild(tr);
  }
  document.querySelector("#campaigns tbody").replaceChildren(fragment);
  document.getElementById("campaign-count").textContent =
    `${campaigns.length} in this store, newest first`;
}

// The list, polled as often as the liveliest campaign in it.
function showList(campaigns) {
  drawCampaignList(campaigns);
  document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  document.body.dataset.state = "ready";
  const moving = campaigns.some((c) => activity(c) === "running" || c.status === "created");
  view.timer = setTimeout(refreshList, moving ? POLL_RUNNING_MS : POLL_IDLE_MS);
}

async function refreshList() {
  try {
    showList(await api("campaigns"));
  } catch (error) {
    document.getElementById("updated").textContent = `update failed: ${error.message}`;
    view.timer = setTimeout(refreshList, POLL_RUNNING_MS);
  }
}

async function start() {
  if (token) document.getElementById("openapi-link").href = `openapi.json?token=${encodeURIComponent(token)}`;
  const campaigns = await api("campaigns");
  const select = document.getElementById("campaign");
  for (const c of campaigns) select.appendChild(new Option(`${c.name} (${activity(c)})`, c.name));
  if (!campaigns.length) {
    document.body.dataset.state = "empty";
    reportError("the store holds no campaign yet");
    return;
  }
  const named = campaigns.some((c) => c.name === view.campaign);
  // A store of many campaigns opens on their list; a store of one, or a URL naming one of
  // them, on that campaign's page.
  if (!named && campaigns.length > 1) {
    if (view.campaign) reportError(`no campaign "${view.campaign}" in this store: pick one below`);
    document.body.dataset.view = "list";
    for (const id of ["campaign-view", "campaign", "campaign-status"]) document.getElementById(id).hidden = true;
    document.getElementById("campaign-list").hidden = false;
    showList(campaigns);
    return;
  }
  document.body.dataset.view = "campaign";
  const back = document.getElementById("all-campaigns");
  back.href = pageHref(null);
  back.hidden = campaigns.length < 2;
  if (!named) view.campaign = campaigns[0].name;
  select.value = view.campaign;
  select.addEventListener("change", () => {
    view.campaign = select.value;
    history.replaceState(null, "", pageHref(view.campaign));
    view.importance = null;
    view.bestKnownKey = null;
    document.getElementById("trial-detail").hidden = true;
    refresh();
  });
  document.getElementById("state-filter").addEventListener("change", (event) => {
    view.stateFilter = event.target.value;
    if (view.data) drawTrials(view.data);
  });
  await refresh();
}

start().catch((error) => reportError(`cannot load the campaigns: ${error.message}`));
