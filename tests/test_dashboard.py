"""The dashboard page in headless Chromium: the numbers it prints are the API's, at every scale,
and it fits a phone's screen.

Three campaigns written through the store API (``dashboard_stores``): objective values
around 1, 100 and 1e5, memory in MiB and in hundreds of GiB, 5, 150 and 500 trials. The page
is read over the DevTools protocol (``headless_chromium``): each number in the trials table,
the heat map, the best card and on the charts' axes is parsed back and compared with what the
API serves, to the three significant figures the page prints.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import replace

import httpx
import pytest
import serve_load
from dashboard_stores import SCALES, write_campaign, write_store
from headless_chromium import browser, find_browser

from parsearch.store import CampaignStatus, open_store

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PHONE = (390, 844)
DESKTOP = (1280, 900)
SI = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
MEMORY = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
NUMBER = re.compile(r"(-?\d+(?:\.\d+)?)\s*(%|[kMGT]|B|KiB|MiB|GiB|TiB)?")
MEMORY_UNIT = {"small": "MiB", "mid": "GiB", "huge": "GiB"}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """(base URL, browser) over a store of the three campaigns."""
    chromium = find_browser()
    if chromium is None:
        pytest.skip("no Chromium here: .ci/run installs Debian's chromium package")
    db = write_store(tmp_path_factory.mktemp("dashboard") / "scales.db")
    with open_store(db) as store:
        # Left "running" by a driver killed with -9: its lease goes stale at once.
        write_campaign(store, replace(SCALES[0], name="killed"))
        killed = store.get_campaign("killed")
        store.update_campaign(killed.id, status=CampaignStatus.RUNNING, finished_at=None)
        store.acquire_lease(killed.id, "killed-driver", stale_after_s=0.05)
        # Ran out of untried layouts 5 trials into a budget of 50.
        write_campaign(store, replace(SCALES[0], name="exhausted"))
        store.update_campaign(store.get_campaign("exhausted").id, budget=50)
    with serve_load.serving(db, serve_load.free_port()) as (base, _), browser(chromium) as opened:
        yield base, opened


def parse(text: str) -> tuple[float, float, str]:
    """``"470"``, ``"73.8k"``, ``"556 GiB"``, ``"43.3%"`` as (number as printed, its unit's
    size, the unit)."""
    match = NUMBER.fullmatch(text.strip())
    assert match, f"not a number as the page prints one: {text!r}"
    number, unit = float(match.group(1)), match.group(2) or ""
    size = MEMORY[unit] if unit in MEMORY else 0.01 if unit == "%" else SI[unit]
    return number, size, unit


def value_of(text: str) -> float:
    number, size, _ = parse(text)
    return number * size


def assert_shows(text: str, value: float, what: str, digits: int = 3) -> None:
    """``text`` is ``value`` rounded to ``digits`` significant figures in the unit it is
    printed in (a percentage: to a tenth of a point), neither 10x nor 100x off."""
    number, size, unit = parse(text)
    exact = value / size
    if unit == "%":
        assert abs(number - exact) <= 0.05 + 1e-9, (what, text, value)
        return
    half = 0.5 * 10 ** (math.floor(math.log10(abs(exact))) - (digits - 1)) if exact else 0
    assert abs(number - exact) <= half * (1 + 1e-9) + 1e-12, (what, text, value)


def assert_axis(labels: list[str], values: list[float], what: str) -> None:
    """Tick labels increase in equal steps, and the axis covers ``values``."""
    ticks = [value_of(label) for label in labels]
    assert len(ticks) >= 2, (what, labels)
    steps = [b - a for a, b in itertools.pairwise(ticks)]
    assert all(step > 0 for step in steps), (what, labels)
    assert max(steps) - min(steps) <= 1e-6 * max(steps), (what, labels)
    low, high = ticks[0] - steps[0], ticks[-1] + steps[0]
    finite = [v for v in values if v is not None]
    assert finite and low <= min(finite) and max(finite) <= high, (what, labels, min(finite))


def api(base: str, path: str):
    response = httpx.get(f"{base}/api/{path}", timeout=60)
    assert response.status_code == 200, (path, response.text)
    return response.json()


PAGE_NUMBERS = """(() => {
  const all = (selector) => [...document.querySelectorAll(selector)];
  const texts = (selector) => all(selector).map((n) => n.textContent);
  const text = (id) => document.getElementById(id).textContent;
  const charts = ["convergence", "pareto", "fidelity-objective", "fidelity-memory"];
  return {
    progress: text("progress-text"),
    bestValue: text("best-value"),
    bestDetail: text("best-detail"),
    rows: all("#trials tbody tr").map((r) => [...r.children].map((c) => c.textContent)),
    heat: all("#heatmap .cell-label").map((t) => [+t.dataset.tp, +t.dataset.pp, t.textContent]),
    axes: Object.fromEntries(charts.map((id) =>
      [id, { x: texts(`#${id} .tick.x`), y: texts(`#${id} .tick.y`) }])),
  };
})()"""


@pytest.mark.parametrize("scale", SCALES, ids=[s.name for s in SCALES])
def test_every_number_on_the_page_is_the_apis_at_every_scale(site, scale):
    base, chromium = site
    name = scale.name
    with chromium.page(f"{base}/?campaign={name}", *DESKTOP) as page:
        shown = page.evaluate(PAGE_NUMBERS)
        console = page.console()
    assert not console, console
    status = api(base, f"campaigns/{name}/status")
    trials = {t["trial"]: t for t in api(base, f"campaigns/{name}/trials")}
    best = api(base, f"campaigns/{name}/best")
    metric = best["objective"]["metric"]
    assert len(trials) == scale.trials == status["finished"]

    assert shown["progress"].startswith(f"{status['finished']} / {status['budget']} trials")
    assert_shows(shown["bestValue"].split(" ")[0], best["objective"]["value"], "best")
    memory = re.search(r"memory/rank (\S+ \S+)", shown["bestDetail"]).group(1)
    assert_shows(memory, best["metrics"]["peak_mem_bytes"], "best memory")

    # The table: one row per trial, each figure the API's.
    assert len(shown["rows"]) == len(trials)
    units = set()
    for row in shown["rows"]:
        trial = trials[int(row[0])]
        assert row[1] == trial["state"]
        if trial["objective"]["value"] is not None:
            assert_shows(row[3], trial["objective"]["value"], f"#{row[0]} objective")
        predicted = (trial["predicted"] or {}).get(metric)
        if predicted is not None:
            assert_shows(row[4], predicted, f"#{row[0]} predicted")
        if trial["metrics"].get("mfu") is not None:
            assert_shows(row[5], trial["metrics"]["mfu"], f"#{row[0]} MFU")
        if trial["metrics"].get("peak_mem_bytes") is not None:
            assert_shows(row[6], trial["metrics"]["peak_mem_bytes"], f"#{row[0]} memory")
            units.add(parse(row[6])[2])
        # Failure reasons carry sizes in the campaign's unit, not raw bytes.
        assert not re.search(r"\d{4,} ?B\b", row[8]), row[8]
        if trial["state"] == "oom":
            assert MEMORY_UNIT[name] in row[8], row[8]

    # The heat map's cells: each the API's best of its (tp, pp).
    cells = {(c["tp"], c["pp"]): c for c in api(base, f"campaigns/{name}/heatmap")["cells"]}
    assert len(shown["heat"]) == len(cells)
    for tp, pp, text in shown["heat"]:
        cell = cells[(tp, pp)]
        if cell["kind"] == "ok":
            assert_shows(text, cell["best"], f"cell tp{tp} pp{pp}")

    # The axes: ticks in equal steps that cover what the API says the chart plots.
    axes = shown["axes"]
    steps = api(base, f"campaigns/{name}/convergence")
    assert_axis(axes["convergence"]["x"], [s["finished"] for s in steps], "convergence x")
    assert all(re.fullmatch(r"\d+", label) for label in axes["convergence"]["x"])
    assert_axis(axes["convergence"]["y"], [s["value"] for s in steps], "convergence y")
    ok = [t for t in trials.values() if t["state"] == "ok"]
    assert_axis(axes["pareto"]["x"], [t["metrics"]["peak_mem_bytes"] for t in ok], "memory x")
    assert_axis(axes["pareto"]["y"], [t["objective"]["value"] for t in ok], "pareto y")
    fidelity = api(base, f"campaigns/{name}/fidelity")
    for axis, key in (("fidelity-objective", metric), ("fidelity-memory", "peak_mem_bytes")):
        pairs = fidelity[key]["pairs"]
        for side in ("x", "y"):
            column = "predicted" if side == "x" else "measured"
            assert_axis(axes[axis][side], [p[column] for p in pairs], f"{axis} {side}")

    # One memory unit across the page: the table, the memory axes, the best card.
    for label in axes["pareto"]["x"] + axes["fidelity-memory"]["x"] + axes["fidelity-memory"]["y"]:
        units.add(parse(label)[2])
    units.add(parse(memory)[2])
    assert units == {MEMORY_UNIT[name]}, units


# The smallest rendered size (CSS px) of each figure's text: its font size times the scale
# its SVG is drawn at (a figure drawn 1000 units wide into 348 px shrinks 11 px text to 3.8).
TEXT_SIZES = """(() => Object.fromEntries([...document.querySelectorAll(".chart")].map((chart) => {
  const sizes = [...chart.querySelectorAll("svg text")].map((t) => {
    const m = t.getScreenCTM();
    return parseFloat(getComputedStyle(t).fontSize) * Math.hypot(m.a, m.b);
  });
  return [chart.id, sizes.length ? Math.min(...sizes) : null];
})))()"""
MIN_TEXT_PX = 10
# The right margin of a plot frame in dashboard.js (frame()'s m.right): where an x axis ends.
FRAME_RIGHT_PX = 14


@pytest.mark.parametrize("scale", SCALES, ids=[s.name for s in SCALES])
def test_a_phone_screen_shows_the_page_without_sideways_scrolling(site, scale):
    base, chromium = site
    width, height = PHONE
    with chromium.page(f"{base}/?campaign={scale.name}", width, height, mobile=True) as page:
        page.wait_for("document.getElementById('importance').dataset.state === 'ready'", 120)
        text = page.evaluate(TEXT_SIZES)
        objective = page.evaluate(
            "(() => { const r = document.querySelector('#trials th[data-key=objective]')"
            ".getBoundingClientRect(); return [r.left, r.right]; })()"
        )
        layout = page.evaluate("""(() => {
          const right = (n) => n.getBoundingClientRect().right;
          return {
            scroll: document.documentElement.scrollWidth,
            header: Math.max(...[...document.querySelectorAll("header > *")].map(right)),
            cards: Math.max(...[...document.querySelectorAll(".card")].map(right)),
            charts: Math.max(...[...document.querySelectorAll(".chart svg")].map(right)),
            pill: right(document.getElementById("campaign-status")),
          };
        })()""")
        console = page.console()
    assert not console, console
    for what, right in layout.items():
        assert right <= width + 0.5, (what, layout)
    # The figures reflow to the screen's width: their labels keep a readable size.
    drawn = {chart: size for chart, size in text.items() if size is not None}
    seen = f"smallest text of each figure, px: {text}"
    assert {"convergence", "heatmap", "parallel", "timeline"} <= set(drawn), seen
    assert all(size >= MIN_TEXT_PX for size in drawn.values()), seen
    # The trials table's objective column is on the screen without scrolling the table.
    assert objective[0] >= 0 and objective[1] <= width, f"objective column at x {objective}"


SEARCH_VIEWS = """(() => {
  const all = (selector) => [...document.querySelectorAll(selector)];
  return {
    lines: all("#parallel .pc-line").map((l) => +l.dataset.trial),
    axes: all("#parallel .pc-axis .label").map((t) => t.textContent),
    runs: all("#timeline rect.run").map((r) => [+r.dataset.trial, r.dataset.host]),
    spans: all("#timeline rect.run").map((r) => ({ trial: +r.dataset.trial, host: r.dataset.host,
      start: +r.dataset.startS, end: +r.dataset.endS, x: +r.getAttribute("x"),
      width: +r.getAttribute("width") })),
    timeAxis: document.querySelector("#timeline .label.x").textContent,
    timeSvgWidth: document.querySelector("#timeline svg").viewBox.baseVal.width,
    hosts: all("#timeline .host").map((t) => t.textContent),
    filters: all("#layout-filters select").map((s) => s.dataset.name),
  };
})()"""

FILTER_TP_2 = """(() => {
  const select = document.querySelector('#layout-filters select[data-name="tp"]');
  select.value = "2";
  select.dispatchEvent(new Event("change"));
  return [...document.querySelectorAll("#trials tbody tr")].map((r) => +r.children[0].textContent);
})()"""


@pytest.mark.parametrize("scale", SCALES, ids=[s.name for s in SCALES])
def test_parallel_coordinates_timeline_filters_and_importance_match_the_api(site, scale):
    base, chromium = site
    name = scale.name
    with chromium.page(f"{base}/?campaign={name}", *DESKTOP) as page:
        page.wait_for("document.getElementById('importance').dataset.state === 'ready'", 120)
        shown = page.evaluate(SEARCH_VIEWS)
        bars = page.evaluate(
            "[...document.querySelectorAll('#importance .importance-bar')].map(b => b.dataset.name)"
        )
        caption = page.evaluate("document.getElementById('importance-caption').textContent")
        filtered = page.evaluate(FILTER_TP_2)
        console = page.console()
    assert not console, console
    bundle = api(base, f"campaigns/{name}/dashboard")
    dimensions = list(bundle["dimensions"])
    trials = api(base, f"campaigns/{name}/trials")

    # Parallel coordinates: an axis per searched dimension and the objective, a line per ok
    # trial.
    assert shown["axes"] == [*dimensions, bundle["objective_label"]]
    ok = [t["trial"] for t in trials if t["state"] == "ok"]
    assert sorted(shown["lines"]) == sorted(ok)

    # The timeline: a bar for each trial on each of its nodes, a row per node.
    expected = sorted((t["trial"], host) for t in trials if t["started_at"] for host in t["hosts"])
    assert sorted(map(tuple, shown["runs"])) == expected
    assert shown["hosts"] == sorted({host for _, host in expected})
    _assert_drawn_in_the_trials_own_time(shown, {t["trial"]: t for t in trials})

    # Filtering the table by a layout value gives what the API's filter gives.
    assert shown["filters"] == dimensions
    assert filtered == [t["trial"] for t in api(base, f"campaigns/{name}/trials?tp=2")]
    assert filtered  # every scale has some tp=2 trial

    # Importance: the API's ranking, drawn in its order, with the method named.
    found = api(base, f"campaigns/{name}/importance")
    assert "permutation importance (scikit-learn) of a random forest" in caption
    assert bars == [d["name"] for d in found["dimensions"]]
    if found["n"] >= 10:
        assert sorted(bars) == sorted(dimensions) and found["r2"] is not None
    else:
        assert not bars and found["note"].startswith("needs 10 successful trials")


def _assert_drawn_in_the_trials_own_time(shown: dict, trials: dict[int, dict]) -> None:
    """A simulate campaign's timeline (every campaign here is one) is drawn on the trials'
    own clock: each bar as long as its trial's duration, the trials on a node back to back
    from 0, the axis spanning them; not the wall clock, in which they all ran within a
    second."""
    assert shown["timeAxis"] == "simulated time: the trials' own durations", shown["timeAxis"]
    spans = shown["spans"]
    for span in spans:
        assert span["end"] - span["start"] == pytest.approx(
            trials[span["trial"]]["duration_s"], rel=1e-9, abs=1e-9
        ), span
    assert min(span["start"] for span in spans) == 0, spans[:3]
    for host in {span["host"] for span in spans}:
        on = sorted((span["start"], span["end"]) for span in spans if span["host"] == host)
        assert all(b[0] >= a[1] - 1e-6 for a, b in itertools.pairwise(on)), (host, on[:5])
    # Pixels per second are the same for every bar (but those widened to the 1 px a bar
    # takes at least), and the latest end is the axis' end.
    rates = [s["width"] / (s["end"] - s["start"]) for s in spans if s["width"] > 1.5]
    assert max(rates) == pytest.approx(min(rates), rel=1e-6), (min(rates), max(rates))
    right = max(s["x"] + s["width"] for s in spans)
    assert right == pytest.approx(shown["timeSvgWidth"] - FRAME_RIGHT_PX, abs=0.5), right


PROGRESS = """(() => Object.fromEntries(["campaign-status", "progress-text", "eta", "driver"].map(
  (id) => [id, document.getElementById(id).textContent])))()"""


def test_a_killed_driver_and_an_exhausted_space_read_as_such(site):
    base, chromium = site
    with chromium.page(f"{base}/?campaign=killed", *DESKTOP) as page:
        killed = page.evaluate(PROGRESS)
    assert api(base, "campaigns/killed/status")["live"] is False
    listed = {c["name"]: c for c in api(base, "campaigns")}
    assert listed["killed"]["live"] is False and listed["killed"]["status"] == "running"
    assert killed["campaign-status"] == "not running" and "ETA" not in killed["eta"]
    assert "it seems dead" in killed["driver"] and "parsearch resume" in killed["driver"]
    with chromium.page(f"{base}/?campaign=exhausted", *DESKTOP) as page:
        exhausted = page.evaluate(PROGRESS)
    assert exhausted["campaign-status"] == "finished"
    assert exhausted["progress-text"].startswith("5 / 50 trials")
    assert (
        exhausted["eta"] == "ended before its budget: no untried layout left: every layout "
        "of the space that can run was tried"
    )
