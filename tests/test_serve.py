"""``parsearch serve``: the API and the dashboard against a store a real campaign is writing.

One campaign (simulate backend, slowed by ``delay``) runs in its own process for the whole
module while ``parsearch serve`` runs in another, as on a cluster: the tests first follow
the campaign live (with a burst of concurrent clients), then, once it has finished, check
every endpoint against the CLI, then load the page in headless Chromium.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import serve_load

from parsearch.cli import main
from parsearch.commands.serve import GENERATE, is_loopback, resolve_token
from parsearch.report.data import accuracy, convergence, load_report_data, tp_pp_grid
from parsearch.store import open_store

ROOT = Path(__file__).parent.parent
GPT175 = ROOT / "search_spaces" / "gpt-175b-frontier.yaml"

NAME = "live"
BUDGET = 30


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """(store, base URL, driver process): a campaign being written, and a server over it."""
    db = tmp_path_factory.mktemp("serve") / "live.db"
    open_store(db).close()  # an empty store, so that the server starts beside the driver
    driver = subprocess.Popen(
        [sys.executable, "-m", "parsearch", "run", str(GPT175), "--store", str(db),
         "--name", NAME, "--backend", "simulate", "--budget", str(BUDGET), "--slots", "2",
         "--backend-opt", "delay=0.4", "--backend-opt", "mem_factor=1.1",
         "--backend-opt", "fail_rate=0.1", "--quiet"],
        cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        with serve_load.serving(db, serve_load.free_port()) as (base, _):
            yield db, base, driver
    finally:
        if driver.poll() is None:
            driver.terminate()
        driver.communicate(timeout=60)


def _get(base: str, path: str, **kwargs) -> httpx.Response:
    return httpx.get(f"{base}{path}", timeout=60, **kwargs)


def _json(base: str, path: str):
    response = _get(base, path)
    assert response.status_code == 200, (path, response.text)
    return response.json()


def _cli(capsys, *args) -> str:
    code = main(list(args))
    out = capsys.readouterr().out
    assert code == 0
    return out


@pytest.mark.e2e
@pytest.mark.slow
def test_the_dashboard_follows_a_running_campaign_under_load(live, capsys):
    db, base, driver = live
    deadline = time.monotonic() + 90
    while True:
        response = _get(base, f"/api/campaigns/{NAME}/status")
        if response.status_code == 404:  # the driver has not created its campaign yet
            assert "no campaign 'live'" in response.json()["error"]
            status = {"finished": 0}
        else:
            status = response.json()
        if status["finished"] >= 2:
            break
        assert time.monotonic() < deadline and driver.poll() is None, status
        time.sleep(0.3)
    assert status["status"] == "running" and status["driver"]["pid"] == driver.pid
    first = _json(base, f"/api/campaigns/{NAME}/dashboard")
    assert first["status"]["status"] == "running"
    assert first["campaign"]["name"] == NAME and first["objective_label"] == "tokens/s"
    heat = first["heatmap"]
    assert len(heat["cells"]) == len(heat["tp"]) * len(heat["pp"])
    # The CLI, asked right after, has seen at least as much.
    cli = json.loads(_cli(capsys, "status", "--store", str(db), "--format", "json"))
    assert cli["finished"] >= status["finished"] and cli["budget"] == status["budget"] == BUDGET

    # Concurrent clients while the driver writes: no error for them, no lock timeout for it.
    result = serve_load.load(base, clients=12, seconds=3, campaign=NAME)
    assert result.latencies_s and not result.errors, result.errors[:3]
    assert driver.poll() in (None, 0)

    # Live: the figures catch up with new trials while the campaign runs.
    seen = len(first["convergence"])
    while True:
        later = _json(base, f"/api/campaigns/{NAME}/dashboard")
        if len(later["convergence"]) > seen:
            break
        assert time.monotonic() < deadline + 60, "the dashboard did not move"
        time.sleep(0.5)
    assert later["status"]["finished"] >= len(later["convergence"]) > seen


@pytest.mark.e2e
@pytest.mark.slow
def test_every_endpoint_gives_the_cli_figures(live, capsys):
    db, base, driver = live
    _, err = driver.communicate(timeout=180)
    assert driver.returncode == 0, err
    assert "locked" not in err
    store, name = str(db), ["--name", NAME]
    api = f"/api/campaigns/{NAME}"

    status = _json(base, f"{api}/status")
    assert status == json.loads(_cli(capsys, "status", "--store", store, *name, "--format", "json"))
    assert status["status"] == "finished" and status["finished"] == BUDGET

    best = _json(base, f"{api}/best")
    assert best == json.loads(_cli(capsys, "best", "--store", store, "--format", "json"))
    capped = _json(base, f"{api}/best?max_mem=50GiB")
    cli_capped = _cli(capsys, "best", "--store", store, "--max-mem", "50GiB", "--format", "json")
    assert capped == json.loads(cli_capped)
    assert capped["metrics"]["peak_mem_bytes"] <= 50 * 2**30
    exports = _json(base, f"{api}/best/exports")
    assert exports["trial"] == best["trial"]
    for fmt, found in exports["exports"].items():
        expected = _cli(capsys, "best", "--store", store, "--format", fmt).rstrip("\n")
        assert found == {"text": expected, "error": None}, fmt

    assert _json(base, f"{api}/top?k=5") == json.loads(
        _cli(capsys, "top", "--store", store, "-k", "5", "--format", "json")
    )
    assert _json(base, f"{api}/top?k=3&max_mem=50GiB") == json.loads(
        _cli(capsys, "top", "--store", store, "-k", "3", "--max-mem", "50GiB", "--format", "json")
    )

    with open_store(db, readonly=True) as opened:
        campaign = opened.get_campaign(NAME)
        records = opened.trials(campaign.id)
        front = [r.number for r in opened.pareto(campaign.id)]
    assert [t["trial"] for t in _json(base, f"{api}/pareto")] == front and front
    trials = _json(base, f"{api}/trials")
    assert [t["trial"] for t in trials] == [r.number for r in records]
    ok = _json(base, f"{api}/trials?state=ok")
    assert {t["state"] for t in ok} == {"ok"} and len(ok) == status["states"]["ok"]
    failed = _json(base, f"{api}/trials?state=oom,error")
    assert failed and all(t["error"] for t in failed)  # failure reasons are served
    some = _json(base, f"{api}/trials?tp=8&pp=4,8&limit=3")
    expected = [r.number for r in records if r.config["tp"] == 8 and r.config["pp"] in (4, 8)]
    assert [t["trial"] for t in some] == expected[:3]
    whole = _json(base, f"{api}/trials/{failed[0]['trial']}")
    record = next(r for r in records if r.number == failed[0]["trial"])
    assert whole["log_tail"] == record.log_tail and whole["error"] == record.error

    data = load_report_data(db, NAME)
    fidelity = _json(base, f"{api}/fidelity")
    for metric in ("tokens_per_s", "peak_mem_bytes"):
        found = accuracy(data, metric)
        assert fidelity[metric]["n"] == found.n > 0
        assert fidelity[metric]["median_ratio"] == pytest.approx(found.median_ratio)
        assert fidelity[metric]["spearman"] == pytest.approx(found.spearman)
    grid = tp_pp_grid(data)
    cells = _json(base, f"{api}/heatmap")["cells"]
    assert [c["kind"] for c in cells] == list(grid["kind"])
    assert [c["best"] for c in cells if c["kind"] == "ok"] == pytest.approx(
        list(grid[grid["kind"] == "ok"]["best"])
    )
    steps = _json(base, f"{api}/convergence")
    assert [s["number"] for s in steps] == list(convergence(data)["number"])

    # The dashboard's bundle catches up within a poll or two of the campaign's end.
    deadline = time.monotonic() + 30
    while True:
        page = _json(base, f"{api}/dashboard")
        if len(page["trials"]) == len(records) and page["best"] is not None:
            break
        assert time.monotonic() < deadline
        time.sleep(0.5)
    assert page["best"]["trial"] == best["trial"] and page["status"] == status
    assert [t["trial"] for t in page["pareto"]] == front


BAD_REQUESTS = [
    ("/api/campaigns/nope/status", 404, "no campaign 'nope'"),
    (f"/api/campaigns/{NAME}/trials/9999", 404, "no trial #9999"),
    (f"/api/campaigns/{NAME}/trials/abc", 400, "valid integer"),
    (f"/api/campaigns/{NAME}/trials?tp=two", 400, "'tp': expected an integer"),
    (f"/api/campaigns/{NAME}/trials?state=done", 400, "'done' is not one of"),
    (f"/api/campaigns/{NAME}/trials?colour=red", 400, "unknown query parameter(s) colour"),
    (f"/api/campaigns/{NAME}/trials?sequence_parallel=maybe", 400, "true or false"),
    (f"/api/campaigns/{NAME}/trials?limit=0", 400, "'limit' must be >= 1"),
    (f"/api/campaigns/{NAME}/top?k=0", 400, "'k' must be >= 1"),
    (f"/api/campaigns/{NAME}/top?k=many", 400, "k"),
    (f"/api/campaigns/{NAME}/best?max_mem=lots", 400, "'max_mem'"),
    (f"/api/campaigns/{NAME}/best?max_mem=1KiB", 404, "no successful trial within"),
    ("/api/nothing-here", 404, "no such page"),
]


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize(("path", "code", "words"), BAD_REQUESTS)
def test_bad_requests_get_a_4xx_with_a_clear_message(live, path, code, words):
    response = _get(live[1], path)
    assert response.status_code == code
    message = response.json()["error"]
    assert words in message and "Traceback" not in message


@pytest.mark.e2e
@pytest.mark.slow
def test_the_page_draws_in_headless_chromium(live):
    browser = next(
        (found for name in ("chromium", "chromium-browser", "google-chrome")
         if (found := shutil.which(name))),
        None,
    )  # fmt: skip
    if browser is None:
        pytest.skip("no Chromium here: .ci/run installs Debian's chromium package")
    _, base, driver = live
    driver.wait(timeout=180)  # the finished campaign: every panel has something to draw
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--window-size=1280,1750", "--virtual-time-budget=15000",
             "--enable-logging=stderr", "--v=0"]  # fmt: skip
    dom = subprocess.run(
        [*flags, "--dump-dom", f"{base}/"], capture_output=True, text=True, timeout=120
    )
    html = dom.stdout
    body = re.search(r"<body[^>]*>", html).group(0)
    assert 'data-state="ready"' in body, (body, dom.stderr[-2000:])
    assert "data-errors" not in body and 'id="errors" hidden' in html
    # The page writes nothing to the console: any line there is an error or a warning.
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    assert not console, console
    for expected in ("Progress", "Best so far", "Convergence", "TP × PP heat map",
                     "Throughput vs memory", "Predicted vs measured", "Trials"):  # fmt: skip
        assert expected in html
    assert f'data-finished="{BUDGET}"' in body
    assert "cell cell-ok" in html and ("cell cell-oom" in html or "cell-predicted_oom" in html)
    assert html.count('<tr class="state-') == BUDGET  # one table row per trial
    assert "--tensor-model-parallel-size" in html  # the best layout as Megatron-LM flags
    assert "measured/predicted: median" in html
    # Every asset came from this server: nothing links elsewhere.
    assert not re.search(r'(src|href)="(https?:)?//', html)


@pytest.mark.e2e
@pytest.mark.slow
def test_a_token_is_checked_on_every_request(live):
    from parsearch.serve.app import create_app

    with serve_load.serving_app(create_app(live[0], token="s3cret")) as base:
        for path in ("/", "/static/dashboard.js", "/openapi.json", "/api/campaigns"):
            missing = _get(base, path)
            assert missing.status_code == 401 and "requires a token" in missing.json()["error"]
            wrong = _get(base, path, headers={"Authorization": "Bearer guess"})
            assert wrong.status_code == 403 and wrong.json()["error"] == "wrong token"
            good = _get(base, path, headers={"Authorization": "Bearer s3cret"})
            assert good.status_code == 200
        assert _get(base, "/api/campaigns?token=s3cret").status_code == 200
        # A browser opens /?token=...: the page's own assets and API calls ride on a cookie.
        with httpx.Client(base_url=base, timeout=60) as browser:
            assert browser.get("/?token=s3cret").status_code == 200
            assert browser.get("/static/dashboard.css").status_code == 200
            assert browser.get("/api/campaigns").status_code == 200


def test_serve_binds_elsewhere_only_with_a_token(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("PARSEARCH_SERVE_TOKEN", raising=False)
    code = main(["serve", "--store", str(tmp_path / "s.db"), "--host", "0.0.0.0"])
    assert code == 2
    assert "--host 0.0.0.0 would let other machines read the store" in capsys.readouterr().err
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")
    assert resolve_token(None, "127.0.0.1") is None
    made = resolve_token(GENERATE, "0.0.0.0")
    assert made and len(made) >= 24 and made != resolve_token(GENERATE, "0.0.0.0")
    monkeypatch.setenv("PARSEARCH_SERVE_TOKEN", "from-env")
    assert resolve_token(None, "0.0.0.0") == "from-env"
    code = main(["serve", "--store", str(tmp_path / "none.db")])
    assert code == 2 and "no store at" in capsys.readouterr().err  # a usage error


def test_the_cli_stays_light_without_the_serve_and_mlflow_extras():
    probe = (
        "import sys, parsearch, parsearch.cli; parsearch.cli.build_parser(); "
        "print(sorted({m.split('.')[0] for m in sys.modules} "
        "& {'fastapi', 'starlette', 'uvicorn', 'mlflow', 'httpx'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    assert out.strip() == "[]"
