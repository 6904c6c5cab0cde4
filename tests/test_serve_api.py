"""``parsearch serve``'s API in process (Starlette's test client): bounds on what a request
may ask and on what an error says back, the figure cache, gzip and ETags, and how a
campaign whose driver was killed or that ran out of layouts is reported."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import serve_load
from dashboard_stores import SCALES, write_campaign
from store_polling import campaign_trials

from parsearch.cli import main
from parsearch.config import ParallelLayout
from parsearch.result import TrialResult, TrialState
from parsearch.store import open_store

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

from parsearch.serve.app import MAX_ERROR_CHARS, create_app

ROOT = Path(__file__).parent.parent
TINY = ROOT / "search_spaces" / "tiny-cpu.yaml"
SMALL = next(scale for scale in SCALES if scale.name == "small")


@pytest.fixture
def served(tmp_path):
    """(client, app, store path) over a store holding the 5-trial ``small`` campaign."""
    db = tmp_path / "api.db"
    with open_store(db) as store:
        write_campaign(store, SMALL)
    app = create_app(db)
    with TestClient(app) as client:
        yield client, app, db


def _error(response, status: int) -> str:
    assert response.status_code == status, (response.status_code, response.text[:300])
    message = response.json()["error"]
    assert len(message) <= MAX_ERROR_CHARS and "Traceback" not in message
    return message


def test_counts_beyond_any_budget_are_a_400_not_a_500(served):
    client = served[0]
    huge = "99999999999999999999999"
    message = _error(client.get(f"/api/campaigns/small/top?k={huge}"), 400)
    assert "'k' must be >= 1 and <= 1000000" in message
    for query in (f"limit={huge}", f"offset={huge}", "offset=-1"):
        _error(client.get(f"/api/campaigns/small/trials?{query}"), 400)
    assert len(client.get("/api/campaigns/small/top?k=1000000").json()) == 4  # the ok trials


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ("recompute=bogus", ["'recompute'", "'bogus' is not one of ['none', 'selective', 'full']"]),
        ("recompute=full,bogus", ["'recompute'", "'bogus'", "'none', 'selective', 'full'"]),
        ("state=bogus", ["'state'", "'bogus' is not one of", "'ok'"]),
        ("sequence_parallel=bogus", ["'sequence_parallel'", "true or false"]),
        ("zero_stage=4", ["'zero_stage' must be >= 0 and <= 3", "out of range"]),
        ("tp=0", ["'tp' must be >= 1 and <= 1000000000000", "out of range"]),
        (f"tp={'9' * 29}", ["'tp' must be >= 1 and <= 1000000000000", "out of range"]),
        (f"pp=-{'9' * 29}", ["'pp' must be >= 1", "out of range"]),
        (f"limit={'9' * 3000}", ["'limit' must be >= 1 and <= 1000000", "out of range"]),
        ("tp=-+2", ["'tp': expected an integer from 1 to 1000000000000"]),
        ("offset=1.5", ["'offset': expected an integer from 0 to 1000000"]),
    ],
    ids=lambda value: value[:24] if isinstance(value, str) else "",
)
def test_a_filter_value_no_trial_can_have_is_a_400_naming_what_is_valid(served, query, words):
    """Not a 200 with no trials: a filter that can never match is a mistake the caller
    should hear about, with the parameter and its valid values or range."""
    message = _error(served[0].get(f"/api/campaigns/small/trials?{query}"), 400)
    for word in words:
        assert word in message, (query[:40], message)
    if "out of range" in message:  # an integer, only too large or small: not "no integer"
        assert "expected an integer" not in message, message


def test_valid_filters_still_select_trials(served):
    client = served[0]
    every = client.get("/api/campaigns/small/trials").json()
    for query in ("recompute=none,full", "zero_stage=0,1,2,3", "sequence_parallel=false"):
        assert client.get(f"/api/campaigns/small/trials?{query}").json() == every, query
    assert client.get("/api/campaigns/small/trials?recompute=full").json() == []


def test_an_error_never_echoes_a_long_request(served):
    client = served[0]
    bulk = "7" * 60_000  # (httpx refuses URLs over 64 KiB)
    message = _error(client.get(f"/api/campaigns/small/trials?tp={bulk}"), 414)
    assert "query string of 60003 characters" in message and "777777" not in message
    long = "x" * 3000  # under the query bound: a 400 that quotes an excerpt only
    for query in (f"tp={long}", f"state={long}", f"max_mem={long}", f"{long}=1",
                  f"sequence_parallel={long}", f"k={long}"):  # fmt: skip
        path = "top" if query.startswith(("k=", "max_mem")) else "trials"
        message = _error(client.get(f"/api/campaigns/small/{path}?{query}"), 400)
        assert "x" * 100 not in message, (query[:20], message)
    message = _error(client.get(f"/api/campaigns/{long}/status"), 404)
    assert "3000 characters" in message and "x" * 100 not in message
    message = _error(client.get(f"/nothing/{long}"), 404)
    assert "x" * 100 not in message


def test_an_unknown_campaign_names_neither_the_store_path_nor_the_campaigns(served):
    client, _, db = served
    message = _error(client.get("/api/campaigns/nope/status"), 404)
    assert message == "no campaign 'nope' in this store; GET /api/campaigns lists them"
    assert str(db) not in message and db.name not in message and "small" not in message


def test_figures_are_computed_once_per_change_of_the_trials(served):
    client, app, db = served
    cache = app.state.figures
    first = client.get("/api/campaigns/small/heatmap").json()
    computed = cache.computed
    for path in ("heatmap", "convergence", "fidelity", "dashboard", "heatmap"):
        assert client.get(f"/api/campaigns/small/{path}").status_code == 200
    assert cache.computed == computed  # nothing moved: every answer from the one bundle
    assert client.get("/api/campaigns/small/heatmap").json() == first

    # A new trial: the next figure request is of the store as it is now, computed once.
    with open_store(db) as store:
        campaign = store.get_campaign("small")
        layout = ParallelLayout(tp=1, pp=1, dp=4, mbs=8, gas=1)
        record = store.add_trial(campaign.id, layout)
        store.finish_trial(record.id, TrialResult(TrialState.OOM, error="oom"), None)
    steps = client.get("/api/campaigns/small/convergence").json()
    assert len(steps) == SMALL.trials + 1 and cache.computed == computed + 1
    client.get("/api/campaigns/small/heatmap")
    assert cache.computed == computed + 1


def test_the_first_view_after_a_quiet_spell_is_current(served):
    """The page's poll gets the last bundle at once while it is young, but one older than
    the cache's bound is recomputed before it answers: no 46-finished card over a 7-row
    table."""
    client, app, db = served
    app.state.figures.max_lag_s = 0.5
    before = client.get("/api/campaigns/small/dashboard").json()
    assert len(before["trials"]) == SMALL.trials
    with open_store(db) as store:
        campaign = store.get_campaign("small")
        record = store.add_trial(campaign.id, ParallelLayout(tp=1, pp=1, dp=4, mbs=8, gas=1))
        store.finish_trial(record.id, TrialResult(TrialState.ERROR, error="crash"), None)
    time.sleep(0.6)  # the quiet spell
    after = client.get("/api/campaigns/small/dashboard").json()
    assert after["status"]["finished"] == len(after["trials"]) == SMALL.trials + 1


def test_answers_are_gzipped_and_an_unchanged_one_is_a_304(served):
    client = served[0]
    path = "/api/campaigns/small/dashboard"
    first = client.get(path, headers={"Accept-Encoding": "gzip"})
    assert first.status_code == 200 and first.headers["content-encoding"] == "gzip"
    assert first.json()["campaign"]["name"] == "small"
    assert first.num_bytes_downloaded * 3 < len(first.content)  # on the wire vs decoded
    tag = first.headers["etag"]
    assert first.headers["cache-control"] == "no-cache"  # a browser asks again each poll
    again = client.get(path, headers={"If-None-Match": tag, "Accept-Encoding": "gzip"})
    assert again.status_code == 304 and not again.content and again.headers["etag"] == tag
    other = client.get("/api/campaigns/small/trials", headers={"If-None-Match": tag})
    assert other.status_code == 200 and other.headers["etag"] != tag


@pytest.mark.e2e
def test_a_killed_driver_is_not_running_and_has_no_eta(tmp_path, capsys):
    db = tmp_path / "killed.db"
    driver = subprocess.Popen(
        [sys.executable, "-m", "parsearch", "run", str(TINY), "--store", str(db), "--budget",
         "30", "--backend", "simulate", "--backend-opt", "delay=2", "--slots", "2", "--quiet"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while sum(r.state.finished for r in campaign_trials(db)) < 2:
            assert driver.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.communicate()
    app = create_app(db)
    with TestClient(app) as client:
        status = client.get("/api/campaigns/tiny-cpu/status").json()
        page = client.get("/api/campaigns/tiny-cpu/dashboard").json()
    assert status["status"] == "running" and status["live"] is False
    assert status["eta_s"] is None and status["driver"]["pid"] == driver.pid
    assert page["status"]["live"] is False
    assert main(["status", "--store", str(db)]) == 0
    text = capsys.readouterr().out
    assert "marked running, but no driver runs it" in text and "it seems dead" in text
    assert "ETA" not in text


@pytest.mark.e2e
def test_a_campaign_that_ran_out_of_layouts_says_so(tmp_path, capsys):
    db = tmp_path / "all.db"
    assert main(["run", str(TINY), "--store", str(db), "--budget", "100", "--backend",
                 "simulate", "--quiet"]) == 0  # fmt: skip
    capsys.readouterr()
    with TestClient(create_app(db)) as client:
        status = client.get("/api/campaigns/tiny-cpu/status").json()
    assert status["status"] == "finished" and status["finished"] < 100
    assert status["finish_reason"].startswith("no untried layout left")
    assert main(["status", "--store", str(db)]) == 0
    assert "ended    before its budget: no untried layout left" in capsys.readouterr().out


def _raw_request(port: int, request: bytes) -> bytes:
    """What the server answers ``request`` sent whole on a fresh connection, read to its
    close (a reset raises)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
        connection.sendall(request)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    return answer


@pytest.mark.e2e
def test_a_huge_request_head_is_answered_414_or_431_not_reset(tmp_path):
    """uvicorn closed the connection on a request head over 16 KiB while the client still
    sent it: the client got a connection reset. ``parsearch serve`` answers and reads the
    rest before it closes."""
    db = tmp_path / "empty.db"
    open_store(db).close()
    port = serve_load.free_port()
    with serve_load.serving(db, port):
        for size in (300_000, 3_000_000):
            answer = _raw_request(port, b"GET /" + b"a" * size + b" HTTP/1.1\r\nHost: x\r\n\r\n")
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 414 URI Too Long\r\n"), (size, answer[:300])
            assert len(body) < 200 and b"aaaa" not in body, body
            assert "request line (the URL) is over 16384 bytes" in json.loads(body)["error"]
        answer = _raw_request(port, b"GET / HTTP/1.1\r\nX-Big: " + b"b" * 300_000 + b"\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"), answer[:300]
        # Under the bound, the request reaches the app (a 404 quoting an excerpt), and the
        # server goes on answering.
        answer = _raw_request(
            port, b"GET /" + b"a" * 15_000 + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        assert answer.startswith(b"HTTP/1.1 404 "), answer[:300]
        answer = _raw_request(
            port, b"GET /api/campaigns HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"[]"), answer[:300]
