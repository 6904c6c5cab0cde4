"""``parsearch serve`` over a store of many campaigns: the front page lists them all (model,
allocation, state, trials, best) and opens each; ``/best-known`` answers what
``parsearch best --like`` answers for a campaign's own space.

One real store (simulate campaigns, under a second each): three models, one of them on two
node counts, and a campaign whose stored space no longer loads (as one from an older
release), which the list still shows and the cross-campaign answer leaves out.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import serve_load
import yaml
from headless_chromium import browser, find_browser

from parsearch.campaign.session import CampaignSettings, start_campaign
from parsearch.cli import main
from parsearch.store import open_store

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

from parsearch.serve.app import create_app

pytestmark = pytest.mark.e2e
SPACES = Path(__file__).parent.parent / "search_spaces"
# (space, node count): the 22B model on its own 16 nodes and on 8.
CAMPAIGNS = (("tiny-cpu", 1), ("llama3-8b-h200", 2), ("gpt-22b-frontier", 16),
             ("gpt-22b-frontier", 8))  # fmt: skip
BROKEN = "from-an-older-release"
BUDGET = 6


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """(store path, {campaign name: its space file})."""
    tmp = tmp_path_factory.mktemp("campaigns")
    db = tmp / "shared.db"
    settings = CampaignSettings(backend="simulate", slots=4, backend_options={"seed": "1"})
    spaces = {}
    for model, nodes in CAMPAIGNS:
        data = yaml.safe_load((SPACES / f"{model}.yaml").read_text())
        data["allocation"]["nodes"] = nodes
        path = tmp / f"{model}-{nodes}n.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        start_campaign(path, db, name=path.stem, budget=BUDGET, settings=settings)
        spaces[path.stem] = path
    with open_store(db) as store:
        raw = yaml.safe_load((SPACES / "tiny-cpu.yaml").read_text())
        raw["model"]["num_heads"] = 3  # no longer divides the hidden size: it cannot load
        store.create_campaign(BROKEN, raw, budget=4, backend="simulate")
    return db, spaces


@pytest.fixture(scope="module")
def client(shared):
    with TestClient(create_app(shared[0])) as opened:
        yield opened


def _json(client, path: str):
    response = client.get(path)
    assert response.status_code == 200, (path, response.text[:500])
    return response.json()


def test_the_list_says_what_each_campaign_trains_on_what_and_how_far_it_got(shared, client):
    db, spaces = shared
    listed = {c["name"]: c for c in _json(client, "/api/campaigns")}
    assert sorted(listed) == sorted([*spaces, BROKEN])
    with open_store(db, readonly=True) as store:
        for campaign in store.list_campaigns():
            entry = listed[campaign.name]
            best = store.best(campaign.id)
            assert entry["finished"] == sum(
                n for state, n in store.counts(campaign.id).items() if state.finished
            ), entry
            assert entry["best"] == (
                None
                if best is None
                else {
                    "trial": best.number,
                    "layout_short": best.layout.short(),
                    "tokens_per_s": best.tokens_per_s,
                    "fidelity": "full",
                }
            ), entry
    for name, path in spaces.items():
        entry, data = listed[name], yaml.safe_load(path.read_text())
        assert entry["model"]["name"] == data["model"]["name"], entry
        assert entry["allocation"]["nodes"] == data["allocation"]["nodes"], entry
        assert entry["allocation"]["devices_per_node"] == data["allocation"]["devices_per_node"]
        assert entry["finished"] == BUDGET and entry["best"] is not None, entry
    assert listed["gpt-22b-frontier-16n"]["model"]["summary"] == (
        "22.1B params: gpt 48 layers, hidden 6144, 48 heads, vocab 51200, seq 2048"
    )
    broken = listed[BROKEN]
    assert broken["allocation"] is None and broken["model"]["summary"] is None, broken
    assert "num_heads" in broken["space_error"], broken


def _cli(capsys, *args) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("trainer", [None, "builtin", "command"])
def test_best_known_is_what_best_like_the_campaigns_space_answers(shared, client, capsys, trainer):
    db, spaces = shared
    query = f"?trainer={trainer}" if trainer else ""
    extra = ["--trainer", trainer] if trainer else []
    answered = 0
    for name, path in spaces.items():
        response = client.get(f"/api/campaigns/{name}/best-known{query}")
        code, out, err = _cli(
            capsys, "best", "--store", str(db), "--like", str(path), "--format", "json", *extra
        )
        if code == 0:
            assert response.status_code == 200, (name, response.text[:500])
            assert response.json() == json.loads(out), name
            answered += 1
        else:  # nothing compares: the same words, as a 404
            assert response.status_code == 404, (name, response.status_code, response.text)
            assert response.json()["error"] in err, (name, response.json(), err)
    # Every campaign here uses the built-in trainer: each answers but for kind "command".
    assert answered == (0 if trainer == "command" else len(spaces)), answered
    if trainer is None:
        found = _json(client, "/api/campaigns/gpt-22b-frontier-8n/best-known")
        assert found["best"]["campaign"] == "gpt-22b-frontier-8n", found["best"]
        assert found["other_allocations"] == [{"campaign": "gpt-22b-frontier-16n", "nodes": 16}]


def test_best_known_of_a_campaign_whose_space_no_longer_loads_is_a_404(client):
    response = client.get(f"/api/campaigns/{BROKEN}/best-known")
    assert response.status_code == 404, response.text
    assert "stored space no longer loads" in response.json()["error"], response.json()


ROWS = """[...document.querySelectorAll("#campaigns tbody tr")].map((tr) => ({
  name: tr.dataset.campaign,
  href: tr.querySelector("td.name a").getAttribute("href"),
  cells: Object.fromEntries([...tr.children].map((td) => [td.className.split(" ")[0],
    [...td.childNodes].map((n) => n.textContent)])),
}))"""


@pytest.mark.slow
def test_the_front_page_lists_every_campaign_and_a_click_opens_it(shared, client):
    chromium = find_browser()
    if chromium is None:
        pytest.skip("no Chromium here: .ci/run installs Debian's chromium package")
    listed = _json(client, "/api/campaigns")
    with (
        serve_load.serving_app(create_app(shared[0])) as base,
        browser(chromium) as opened,
        opened.page(f"{base}/", 1280, 900) as page,
    ):
        seen = page.evaluate(
            "({view: document.body.dataset.view, main: document.getElementById("
            "'campaign-view').hidden, rows: " + ROWS + "})"
        )
        # Click the second newest campaign's name: its own page opens.
        chosen = listed[1]["name"]
        page.evaluate(
            f"document.querySelector('#campaigns tr[data-campaign=\"{chosen}\"] a').click()"
        )
        page.wait_for(
            "document.body.dataset.view === 'campaign' && document.body.dataset.state === 'ready'"
        )
        opened_view = page.evaluate(
            "({search: location.search, select: document.getElementById('campaign').value,"
            " progress: document.getElementById('progress-text').textContent,"
            " back: !document.getElementById('all-campaigns').hidden})"
        )
        console = page.console()
    assert not console, console
    assert seen["view"] == "list" and seen["main"] is True, seen
    rows = seen["rows"]
    assert [row["name"] for row in rows] == [c["name"] for c in listed], rows
    for row, campaign in zip(rows, listed, strict=True):
        cells, what = row["cells"], f"{campaign['name']}: {row}"
        assert row["href"] == f"?campaign={campaign['name']}", what
        assert cells["name"][0] == campaign["name"], what
        assert cells["model"][0] == campaign["model"]["name"], what
        assert cells["state"] == [campaign["status"]], what
        assert cells["trials"] == [f"{campaign['finished']} / {campaign['budget']}"], what
        allocation = campaign["allocation"]
        if allocation is None:
            assert "no longer loads" in cells["model"][1] and cells["allocation"] == ["–"], what
            assert cells["best"] == ["–"], what
            continue
        assert cells["model"][1] == campaign["model"]["summary"], what
        assert cells["allocation"][0] == (
            f"{allocation['nodes']} × {allocation['devices_per_node']} {allocation['device']}"
        ), what
        best = campaign["best"]
        shown = float(cells["best"][0].rstrip("k")) * (1e3 if cells["best"][0][-1] == "k" else 1)
        assert shown == pytest.approx(best["tokens_per_s"], rel=5e-3), what
        assert cells["best"][1].startswith(best["layout_short"]), what
    assert opened_view["search"] == f"?campaign={chosen}", opened_view
    assert opened_view["select"] == chosen and opened_view["back"], opened_view
    assert opened_view["progress"].startswith(f"{BUDGET} / {BUDGET} trials"), opened_view
