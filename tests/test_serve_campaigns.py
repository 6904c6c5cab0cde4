"""``parsearch serve`` over a store of many campaigns: the front page lists them all (model,
allocation, state, trials, best) and opens each; ``/best-known`` answers what
``parsearch best --like`` answers for a campaign's own space.

One real store (simulate campaigns, under a second each): three models, one of them on two
node counts and one measured twice on the same allocation, and a campaign whose stored space
no longer loads (as one from an older release), which the list still shows and the
cross-campaign answer leaves out. A campaign's page shows the best layout known for its model
and allocation across the store, with its provenance. A campaign whose machine profile was
deleted after it ran opens on its trials and says what is missing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import serve_load
import yaml
from headless_chromium import browser, find_browser

from parsearch.campaign.session import CampaignSettings, start_campaign
from parsearch.cli import main
from parsearch.config import ParallelLayout
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
# The llama campaign measured again on the same allocation, with another seed: the two
# compare, and one's page names the other when the other's layout is the faster.
AGAIN = "llama3-8b-h200-2n-again"
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
    again = CampaignSettings(backend="simulate", slots=4, backend_options={"seed": "2"})
    start_campaign(spaces["llama3-8b-h200-2n"], db, name=AGAIN, budget=BUDGET, settings=again)
    spaces[AGAIN] = spaces["llama3-8b-h200-2n"]
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


BEST_KNOWN = """({
  state: document.getElementById('best-known-card').dataset.state,
  value: document.getElementById('best-known-value').textContent,
  layout: document.getElementById('best-known-layout').textContent,
  detail: document.getElementById('best-known-detail').textContent,
  href: document.querySelector('#best-known-detail a')?.getAttribute('href') ?? null,
  like: document.getElementById('best-known-like').textContent,
})"""
PANEL_READY = "document.getElementById('best-known-card').dataset.state !== 'loading'"


def _assert_panel_says(seen: dict, answer: dict, here: str) -> None:
    """The panel shows ``answer`` (the API's best-known): tokens/s to three figures, the
    layout as the store writes it, the campaign and trial it came from, how it was got."""
    best, what = answer["best"], f"panel {seen} for the answer {answer['best']}"
    assert seen["state"] == "ready", what
    number, unit = seen["value"].removesuffix(" tokens/s"), 1.0
    if number[-1] in "kM":
        number, unit = number[:-1], {"k": 1e3, "M": 1e6}[number[-1]]
    assert float(number) * unit == pytest.approx(best["metrics"]["tokens_per_s"], rel=5e-3), what
    layout = ParallelLayout(**best["layout"]).short()
    assert seen["layout"] == f"{layout}  (trial #{best['trial']})", what
    prefix = "this campaign " if best["campaign"] == here else "campaign "
    assert seen["detail"].startswith(f"{prefix}{best['campaign']}, trial #{best['trial']}"), what
    assert best["provenance"] in seen["detail"] and best["trainer"] in seen["detail"], what
    assert seen["href"] == f"?campaign={best['campaign']}", what
    assert seen["like"].startswith(answer["like"]), what
    assert f"{len(answer['ranked'])} of the store's {answer['campaigns_in_store']}" in seen["like"]


@pytest.mark.slow
def test_a_campaigns_page_shows_the_best_layout_known_across_the_store(shared, client):
    """The two llama campaigns on one allocation: the page of the slower one names the
    other's layout, trial and provenance (simulated), and its link opens that campaign,
    whose page calls the answer its own; the 22B campaign on 8 nodes names the same model
    at 16 nodes; the panel reads as the API answers, which is `parsearch best --like`."""
    chromium = find_browser()
    if chromium is None:
        pytest.skip("no Chromium here: .ci/run installs Debian's chromium package")
    llama = _json(client, f"/api/campaigns/{AGAIN}/best-known")
    assert len(llama["ranked"]) == 2, llama["ranked"]
    winner = llama["best"]["campaign"]
    loser = ({AGAIN, "llama3-8b-h200-2n"} - {winner}).pop()
    assert _json(client, f"/api/campaigns/{loser}/best-known") == llama
    gpt = _json(client, "/api/campaigns/gpt-22b-frontier-8n/best-known")
    with (
        serve_load.serving_app(create_app(shared[0])) as base,
        browser(chromium) as opened,
        opened.page(f"{base}/?campaign={loser}", 1280, 900) as page,
    ):
        page.wait_for(PANEL_READY)
        on_loser = page.evaluate(BEST_KNOWN)
        page.evaluate("document.querySelector('#best-known-detail a').click()")
        page.wait_for(
            f"location.search === '?campaign={winner}' && document.body.dataset.state === "
            f"'ready' && {PANEL_READY}"
        )
        on_winner = page.evaluate(BEST_KNOWN)
        console = page.console()
        with opened.page(f"{base}/?campaign=gpt-22b-frontier-8n", 1280, 900) as other:
            other.wait_for(PANEL_READY)
            on_gpt = other.evaluate(BEST_KNOWN)
            console += other.console()
    assert not console, console
    _assert_panel_says(on_loser, llama, here=loser)
    _assert_panel_says(on_winner, llama, here=winner)
    _assert_panel_says(on_gpt, gpt, here="gpt-22b-frontier-8n")
    assert "other node counts: gpt-22b-frontier-16n (16 nodes)" in on_gpt["like"], on_gpt


@pytest.fixture
def profile_deleted(tmp_path):
    """(store, campaign name, the profile's path): a simulate campaign whose space names a
    machine profile beside it, which was deleted once the campaign had run."""
    profile = tmp_path / "our-h200.yaml"
    shutil.copy(Path(__file__).parent.parent / "parsearch/profiles/h200-sxm-hgx.yaml", profile)
    data = yaml.safe_load((SPACES / "llama3-8b-h200.yaml").read_text())
    data["allocation"]["nodes"] = 2
    data["estimate"]["machine"] = profile.name  # relative to the space file
    path = tmp_path / "ours.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    db = tmp_path / "ours.db"
    settings = CampaignSettings(backend="simulate", slots=4, backend_options={"seed": "1"})
    start_campaign(path, db, name="ours", budget=BUDGET, settings=settings)
    saved = profile.read_bytes()
    profile.unlink()
    return db, "ours", profile, saved


def test_a_campaign_whose_profile_was_deleted_answers_its_trials_and_says_what_is_missing(
    profile_deleted,
):
    """The dashboard's poll answers 200: status, best, trials and the Pareto front, with
    `space_error` naming the campaign, its space file and the missing profile; each figure
    that needs the space is a 409 saying the same (not a 503: no retry mends it); once the
    profile is back, the figures are drawn again without a restart."""
    db, name, profile, saved = profile_deleted
    with TestClient(create_app(db)) as opened:
        board = _json(opened, f"/api/campaigns/{name}/dashboard")
        error = board["space_error"]
        assert error and f"campaign '{name}'" in error, board.get("space_error")
        assert f"{profile}: machine profile not found" in error, error
        assert "ours.yaml" in error and "trials still read" in error, error
        trials = _json(opened, f"/api/campaigns/{name}/trials")
        assert len(trials) == BUDGET and [t["trial"] for t in board["trials"]] == [
            t["trial"] for t in trials
        ], (board["trials"], trials)
        assert board["best"] is not None and board["pareto"], board["best"]
        assert board["status"]["finished"] == BUDGET, board["status"]
        for figure in ("heatmap", "convergence", "fidelity", "importance"):
            response = opened.get(f"/api/campaigns/{name}/{figure}")
            assert response.status_code == 409, (figure, response.status_code, response.text)
            said = response.json()["error"]  # the API cuts a long message with an ellipsis
            assert error.startswith(said.removesuffix("…")), (figure, said, error)
        profile.write_bytes(saved)
        assert opened.get(f"/api/campaigns/{name}/heatmap").status_code == 200
        again = _json(opened, f"/api/campaigns/{name}/dashboard")
        if again["space_error"] is not None:  # served while the redone bundle was made
            again = _json(opened, f"/api/campaigns/{name}/dashboard")
        assert again["space_error"] is None and again["heatmap"] is not None, again["space_error"]


@pytest.mark.slow
def test_the_page_of_such_a_campaign_lists_its_trials_and_says_what_is_missing(profile_deleted):
    """No "update failed": the page shows why the figures are missing (the profile's path
    in the words of the API), lists every trial, draws what needs only the store, and its
    best-known panel says why nothing can be compared with it."""
    chromium = find_browser()
    if chromium is None:
        pytest.skip("no Chromium here: .ci/run installs Debian's chromium package")
    db, name, profile, _ = profile_deleted
    app = create_app(db)
    with TestClient(app) as opened:
        error = _json(opened, f"/api/campaigns/{name}/dashboard")["space_error"]
        known = opened.get(f"/api/campaigns/{name}/best-known").json()["error"]
    with (
        serve_load.serving_app(app) as base,
        browser(chromium) as opened,
        opened.page(f"{base}/?campaign={name}", 1280, 900) as page,
    ):
        page.wait_for(f"document.body.dataset.state === 'ready' && {PANEL_READY}")
        seen = page.evaluate(
            "({banner: !document.getElementById('space-error').hidden,"
            " text: document.getElementById('space-error-text').textContent,"
            " updated: document.getElementById('updated').textContent,"
            " rows: [...document.querySelectorAll('#trials tbody tr')].map("
            "   (r) => +r.children[0].textContent),"
            " heatmap: document.getElementById('heatmap').textContent,"
            " pareto: document.querySelectorAll('#pareto svg circle').length,"
            " timeline: document.querySelectorAll('#timeline rect.run').length,"
            " progress: document.getElementById('progress-text').textContent,"
            " errors: document.getElementById('errors').textContent,"
            " panel: " + BEST_KNOWN + "})"
        )
        console = page.console()
    assert not console, console
    assert seen["banner"] and seen["text"] == error, seen
    assert str(profile) in seen["text"], seen["text"]
    assert "failed" not in seen["updated"] and seen["updated"].startswith("updated"), seen
    assert sorted(seen["rows"]) == list(range(BUDGET)), seen["rows"]
    assert seen["progress"].startswith(f"{BUDGET} / {BUDGET} trials"), seen
    assert "needs the campaign's space" in seen["heatmap"], seen["heatmap"]
    assert seen["pareto"] > 0 and seen["timeline"] > 0, seen
    assert not seen["errors"], seen["errors"]
    panel = seen["panel"]
    assert panel["state"] == "none" and panel["detail"] == known, (panel, known)
    assert "stored space no longer loads" in panel["detail"], panel
