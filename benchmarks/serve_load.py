"""Load on ``parsearch serve`` while a campaign writes the same store.

Starts a simulate campaign (the driver in its own process, its write-lock waits timed),
``parsearch serve`` on 127.0.0.1, and N clients that each request the dashboard's data in a
loop without pause (far harsher than browsers polling every 2 s) for D seconds. Prints the
request latency (p50 / p95 / max), errors, throughput, and the driver's write-lock waits
with and without the load (baseline: the same driver alone, measured first in this run).

    .venv/bin/python benchmarks/serve_load.py                 # 50 clients x 20 s
    .venv/bin/python benchmarks/serve_load.py --clients 10 --duration 5
    .venv/bin/python benchmarks/serve_load.py --think 2          # 50 open dashboards

``tests/test_serve.py`` runs a short version (no error, no lock timeout; no latency bound).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPACE = ROOT / "search_spaces" / "gpt-175b-frontier.yaml"
CAMPAIGN = "load"
# What a dashboard asks, in turn: its one poll, and the API calls a script would make.
PATHS = ("dashboard", "status", "trials?state=ok", "best", "top?k=5")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def drive(store: str, seconds: float, out: str) -> None:
    """The child process: a simulate campaign for ``seconds``; the time each write
    transaction waited for the lock (from asking to holding it) goes to ``out``."""
    from parsearch.campaign.session import CampaignSettings, start_campaign
    from parsearch.store.connection import Database

    waits: list[float] = []
    original = Database.transaction

    @contextlib.contextmanager
    def timed(self, action, *, write=True):
        asked = time.perf_counter()
        with original(self, action, write=write) as conn:
            if write:
                waits.append(time.perf_counter() - asked)
            yield conn

    Database.transaction = timed
    settings = CampaignSettings(
        backend="simulate",
        slots=4,
        backend_options={"delay": "0.5", "jitter": "0.5", "mem_factor": "1.1"},
        timeout_s=seconds,
        grace_s=5.0,
    )
    error = None
    try:
        summary = start_campaign(SPACE, store, name=CAMPAIGN, budget=100_000, settings=settings)
        finished = summary.finished
    except Exception as exc:  # a lock timeout is a StoreError: report it, not a traceback
        error, finished = str(exc), None
    Path(out).write_text(json.dumps({"waits": waits, "finished": finished, "error": error}))


def start_driver(store: Path, seconds: float, out: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, __file__, "--drive", str(store), str(seconds), str(out)],
        cwd=ROOT,
        env=env,
    )


@contextlib.contextmanager
def serving(store: Path, port: int, *extra: str, env: dict | None = None):
    """``parsearch serve`` on 127.0.0.1:port until the block ends; waits until it answers."""
    import httpx

    command = [sys.executable, "-m", "parsearch", "serve", "--store", str(store)]
    server = subprocess.Popen(
        [*command, "--port", str(port), *extra],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"parsearch serve exited: {server.communicate()[1]}")
            with contextlib.suppress(httpx.TransportError):
                httpx.get(f"{base}/openapi.json", timeout=2)
                break
            if time.monotonic() > deadline:
                raise RuntimeError("parsearch serve did not answer within 60 s")
            time.sleep(0.2)
        yield base, server
    finally:
        server.terminate()
        try:
            server.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.communicate()


@contextlib.contextmanager
def serving_app(app):
    """``app`` (``parsearch.serve.app.create_app``'s) served by uvicorn in a thread of this
    process on 127.0.0.1 until the block ends: a test that already imported the service
    skips the seconds a ``parsearch serve`` process takes to start."""
    import threading

    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="error")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            assert thread.is_alive(), "uvicorn stopped before it started serving"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@dataclass
class LoadResult:
    latencies_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    # Dashboard polls: bytes on the wire (gzipped: httpx asks for it, as browsers do) and
    # decoded.
    poll_wire_bytes: list[int] = field(default_factory=list)
    poll_bytes: list[int] = field(default_factory=list)

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies_s)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def _client(
    base: str,
    campaign: str,
    until: float,
    result: LoadResult,
    offset: int,
    headers,
    think_s: float,
) -> None:
    import httpx

    paths = PATHS[:1] if think_s else PATHS  # a browser polls the dashboard only
    async with httpx.AsyncClient(base_url=base, timeout=60, headers=headers) as client:
        i = offset
        while time.monotonic() < until:
            if think_s and i > offset:
                await asyncio.sleep(think_s)
            path = f"/api/campaigns/{campaign}/{paths[i % len(paths)]}"
            i += 1
            started = time.perf_counter()
            try:
                response = await client.get(path)
                # Before the first success /best is a 404 by design; anything else is an error.
                if response.status_code != 200 and not (
                    response.status_code == 404 and path.endswith("/best")
                ):
                    result.errors.append(f"{path}: {response.status_code} {response.text[:200]}")
                elif path.endswith("/dashboard"):
                    result.poll_wire_bytes.append(response.num_bytes_downloaded)
                    result.poll_bytes.append(len(response.content))
            except httpx.HTTPError as error:
                result.errors.append(f"{path}: {type(error).__name__} {error}")
            result.latencies_s.append(time.perf_counter() - started)


def load(
    base: str,
    clients: int,
    seconds: float,
    campaign: str = CAMPAIGN,
    token: str | None = None,
    think_s: float = 0.0,
) -> LoadResult:
    """``clients`` concurrent clients, each requesting :data:`PATHS` of ``campaign`` in turn
    for ``seconds`` without pause; with ``think_s``, the dashboard poll only, every
    ``think_s`` seconds, as open browsers do."""
    result = LoadResult()
    headers = {"Authorization": f"Bearer {token}"} if token else None

    async def main() -> None:
        until = time.monotonic() + seconds
        await asyncio.gather(
            *(_client(base, campaign, until, result, i, headers, think_s) for i in range(clients))
        )

    started = time.monotonic()
    asyncio.run(main())
    result.elapsed_s = time.monotonic() - started
    return result


def wait_for_campaign(base: str, timeout_s: float = 120) -> None:
    """Until the driver has created the campaign and finished a trial."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        response = httpx.get(f"{base}/api/campaigns/{CAMPAIGN}/status", timeout=10)
        if response.status_code == 200 and response.json()["finished"] > 0:
            return
        time.sleep(0.3)
    raise RuntimeError("the campaign did not finish a trial in time")


def driver_waits(out: Path) -> dict:
    data = json.loads(out.read_text())
    waits = sorted(data["waits"])
    pick = lambda q: waits[min(len(waits) - 1, int(q * len(waits)))] if waits else float("nan")  # noqa: E731
    return {
        "writes": len(waits),
        "p50_ms": 1000 * pick(0.5),
        "p95_ms": 1000 * pick(0.95),
        "max_ms": 1000 * (waits[-1] if waits else float("nan")),
        "finished": data["finished"],
        "error": data["error"],
    }


def run(clients: int, seconds: float, think_s: float) -> dict:
    import httpx

    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        # Baseline: the driver alone, as long as the loaded run.
        alone = tmp_path / "alone.json"
        start_driver(tmp_path / "alone.db", seconds, alone).wait()
        baseline = driver_waits(alone)
        store, out = tmp_path / "loaded.db", tmp_path / "loaded.json"
        port = free_port()
        from parsearch.store import open_store

        open_store(store).close()  # an empty store, so that the server starts beside the driver
        driver = start_driver(store, seconds + 30, out)
        with serving(store, port) as (base, _):
            wait_for_campaign(base)
            # One page load first: the space's plan, paid once per server.
            httpx.get(f"{base}/api/campaigns/{CAMPAIGN}/dashboard", timeout=600).raise_for_status()
            result = load(base, clients, seconds, think_s=think_s)
        driver.terminate()  # drains: a clean stop, exit 0
        code = driver.wait(timeout=60)
        loaded = driver_waits(out)
    return {"result": result, "baseline": baseline, "loaded": loaded, "driver_exit": code}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of load")
    parser.add_argument(
        "--think",
        type=float,
        default=0.0,
        metavar="S",
        help="each client polls the dashboard every S seconds, as a browser does (default: "
        "every API path in turn, without pause)",
    )
    parser.add_argument(
        "--drive", nargs=3, metavar=("STORE", "SECONDS", "OUT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.drive:
        store, seconds, out = args.drive
        drive(store, float(seconds), out)
        return
    found = run(args.clients, args.duration, args.think)
    result, base, loaded = found["result"], found["baseline"], found["loaded"]
    n = len(result.latencies_s)
    how = f"dashboards polling every {args.think:g} s" if args.think else "clients, no pause"
    print(f"{args.clients} {how}, {args.duration:g} s, against 127.0.0.1 while a campaign writes")
    print(
        f"  requests {n} ({n / result.elapsed_s:.0f}/s), errors {len(result.errors)}; latency "
        f"p50 {1000 * result.percentile(0.5):.0f} ms, p95 {1000 * result.percentile(0.95):.0f} ms, "
        f"max {1000 * max(result.latencies_s, default=float('nan')):.0f} ms"
    )
    if result.latencies_s:
        print(f"  mean {1000 * statistics.fmean(result.latencies_s):.0f} ms")
    if result.poll_bytes:
        print(
            f"  dashboard poll: {statistics.median(result.poll_wire_bytes) / 1024:.0f} KiB on the "
            f"wire (gzip), {statistics.median(result.poll_bytes) / 1024:.0f} KiB decoded (median)"
        )
    for error in result.errors[:5]:
        print(f"  error: {error}")
    for label, waits in (("driver alone", base), ("driver under load", loaded)):
        print(
            f"  {label}: {waits['writes']} write transactions, lock wait p50 "
            f"{waits['p50_ms']:.2f} ms, p95 {waits['p95_ms']:.2f} ms, "
            f"max {waits['max_ms']:.1f} ms; "
            f"{waits['finished']} trials finished; lock timeouts/errors: {waits['error'] or 'none'}"
        )
    print(f"  driver exit code under load: {found['driver_exit']}")


if __name__ == "__main__":
    main()
