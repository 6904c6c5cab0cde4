"""The ``parsearch serve`` ASGI application: a read-only JSON API and the live dashboard page.

FastAPI documents the API's schema at ``/openapi.json``. Its Swagger and ReDoc pages are
turned off: they load their scripts from a CDN, and the service must work on a login node
that cannot reach one. Every asset of the dashboard ships in ``parsearch/serve/static``.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import os
import threading
from collections.abc import Callable
from importlib import resources
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException

from parsearch.errors import ParsearchError
from parsearch.report.data import ReportData
from parsearch.serve import figures, views
from parsearch.serve.views import BadRequest, NotFound, StoreReader
from parsearch.version import __version__

LOG = logging.getLogger("parsearch.serve")
STATIC = resources.files("parsearch.serve") / "static"
TOKEN_HEADER = "authorization"
TOKEN_COOKIE = "parsearch_token"


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def create_app(store_path: str | os.PathLike[str], token: str | None = None) -> FastAPI:
    """The service for the store at ``store_path``; with ``token``, every request must carry
    it (``Authorization: Bearer TOKEN`` or ``?token=TOKEN``)."""
    reader = StoreReader(store_path)
    cache = figures.FigureCache(reader.open)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        # Plan the stored spaces in the background: the first dashboard poll of a 175B
        # campaign would otherwise wait seconds for it.
        threading.Thread(target=_plan_spaces, args=(reader,), daemon=True).start()
        yield

    app = FastAPI(
        lifespan=lifespan,
        title="parsearch serve",
        version=__version__,
        description="A campaign's progress, best layouts, trials and the estimate's fidelity, "
        "read live from a parsearch store (opened read-only). Errors are JSON objects "
        '`{"error": "..."}` with a 4xx status.',
        docs_url=None,
        redoc_url=None,
        # No OpenTelemetry: checking for a configured provider costs environment lookups
        # on every request (an eighth of the server's time under load), for nothing here.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    _add_token_check(app, token)
    _add_error_handlers(app)

    def read(name: str, answer: Callable[..., Any], *args: Any) -> Any:
        """``answer(store, campaign, *args)`` in one short read-only session."""
        with reader.open() as store:
            found = answer(store, views.find_campaign(store, name), *args)
        # Plain data already: JSONResponse skips FastAPI's per-value encoder.
        return JSONResponse(found)

    @app.get("/api/campaigns", tags=["campaigns"])
    def campaigns() -> list[dict[str, Any]]:
        """Every campaign of the store, newest first."""
        return reader.campaigns()

    @app.get("/api/campaigns/{name}/status", tags=["campaigns"])
    def status(name: str) -> dict[str, Any]:
        """Progress, trials by state, best so far, ETA and the driver: the figures of
        `parsearch status --format json`."""
        return read(name, views.status)

    @app.get("/api/campaigns/{name}/best", tags=["results"])
    def best(
        name: str,
        max_mem: str | None = Query(None, description="peak memory per rank cap: 60GiB, bytes"),
    ) -> dict[str, Any]:
        """The best ok trial (under `max_mem`): `parsearch best --format json`; 404 before
        the first success."""
        return read(name, views.best, max_mem)

    @app.get("/api/campaigns/{name}/best/exports", tags=["results"])
    def best_exports(
        name: str, max_mem: str | None = Query(None, description="as for /best")
    ) -> dict[str, Any]:
        """The best layout in every trainer's format (`parsearch best --format F`)."""

        def answer(store, campaign):
            record = store.best(campaign.id, max_mem_bytes=views.memory_cap(max_mem))
            if record is None:
                raise NotFound(f"campaign '{campaign.name}' has no successful trial yet")
            return {"trial": record.number, "exports": views.best_exports(record, campaign)}

        return read(name, answer)

    @app.get("/api/campaigns/{name}/top", tags=["results"])
    def top(
        name: str,
        k: int = Query(10, description="how many trials"),
        max_mem: str | None = Query(None, description="peak memory per rank cap"),
    ) -> list[dict[str, Any]]:
        """The k best ok trials, measured beside predicted: `parsearch top -k K --format json`."""
        return read(name, views.top, k, max_mem)

    @app.get("/api/campaigns/{name}/trials", tags=["trials"])
    def trials(
        request: Request,
        name: str,
        state: str | None = Query(None, description="comma list: ok,oom,timeout,error,..."),
        tp: str | None = Query(None, description="comma list of integers"),
        pp: str | None = Query(None, description="comma list of integers"),
        dp: str | None = Query(None),
        mbs: str | None = Query(None),
        gas: str | None = Query(None),
        zero_stage: str | None = Query(None),
        vpp: str | None = Query(None),
        recompute: str | None = Query(None, description="none, selective, full"),
        sequence_parallel: str | None = Query(None, description="true or false"),
        limit: str | None = Query(None, description="at most this many trials"),
        offset: str | None = Query(None, description="skip this many first"),
    ) -> list[dict[str, Any]]:
        """The campaign's trials in order of number, with failure reasons, filtered by state
        and layout values. Unknown or malformed parameters are a 400."""
        wanted = views.trial_filter(dict(request.query_params))
        return read(name, views.trials, wanted)

    @app.get("/api/campaigns/{name}/trials/{number}", tags=["trials"])
    def trial(name: str, number: int) -> dict[str, Any]:
        """One trial whole: layout, state, metrics, prediction, error and its log tail."""
        return read(name, views.trial, number)

    @app.get("/api/campaigns/{name}/pareto", tags=["results"])
    def pareto(name: str) -> list[dict[str, Any]]:
        """Ok trials no other beats on both objective and peak memory, by memory."""
        return read(name, views.pareto)

    def figure(name: str, draw: Callable[[ReportData], Any]) -> Any:
        """A figure's table from the store as it is now (the dashboard's may lag a poll)."""
        return read(name, lambda store, campaign: draw(figures.report_data(store, campaign)))

    @app.get("/api/campaigns/{name}/fidelity", tags=["figures"])
    def fidelity(name: str) -> dict[str, Any]:
        """The estimate against the trials, for the objective and peak memory: median
        measured/predicted ratio, IQR, mean error, rank correlation and the pairs."""
        return figure(name, figures.fidelity)

    @app.get("/api/campaigns/{name}/convergence", tags=["figures"])
    def convergence(name: str) -> list[dict[str, Any]]:
        """Best objective after each finished trial, in finish order."""
        return figure(name, figures.convergence_rows)

    @app.get("/api/campaigns/{name}/heatmap", tags=["figures"])
    def heatmap(name: str) -> dict[str, Any]:
        """TP x PP cells: best objective, or why none (oom, failed, no_divide, ...)."""
        return figure(name, figures.heatmap)

    @app.get("/api/campaigns/{name}/dashboard", tags=["figures"])
    def dashboard(name: str) -> dict[str, Any]:
        """Everything the dashboard page draws (status, best in every format, figures,
        trials): what the page polls. The status is read now; the rest is recomputed when
        trials changed, in the background, so it may lag the status by a poll (2 s)."""

        with reader.open() as store:
            campaign = views.find_campaign(store, name)
            status = views.status(store, campaign)
            head = {"campaign": views.campaign_summary(campaign), "status": status}
            members = cache.entry(store, campaign).json_members()
        text = json.dumps(head, allow_nan=False)[:-1] + "," + members + "}"
        return Response(text, media_type="application/json")

    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")

    @app.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(str(STATIC / "index.html"), headers={"Cache-Control": "no-cache"})

    return app


def _plan_spaces(reader: StoreReader) -> None:
    try:
        with reader.open() as store:
            campaigns = store.list_campaigns()
        for campaign in campaigns:
            figures.campaign_space(campaign)
    except Exception:  # the requests that need it will report the problem
        LOG.debug("planning the stored spaces failed", exc_info=True)


def _add_token_check(app: FastAPI, token: str | None) -> None:
    """Every request must carry ``token``: as ``Authorization: Bearer``, ``?token=`` or the
    cookie set when a ``?token=`` URL was opened, which is how the page's own stylesheet,
    script and API calls carry it."""
    if token is None:
        return

    @app.middleware("http")
    async def check_token(request: Request, call_next):
        header = request.headers.get(TOKEN_HEADER, "")
        from_query = request.query_params.get("token")
        given = (
            header[7:].strip()
            if header.lower().startswith("bearer ")
            else from_query or request.cookies.get(TOKEN_COOKIE)
        )
        if not given:
            return _error(
                401,
                "this server requires a token: send 'Authorization: Bearer TOKEN' or add "
                "?token=TOKEN to the URL (the token parsearch serve printed when it started)",
            )
        if not hmac.compare_digest(given.encode(), token.encode()):
            return _error(403, "wrong token")
        response = await call_next(request)
        if from_query:
            response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict")
        return response


def _add_error_handlers(app: FastAPI) -> None:
    """Every failure is ``{"error": message}`` with its status; never a traceback."""

    @app.exception_handler(NotFound)
    async def not_found(request: Request, exc: NotFound) -> JSONResponse:
        return _error(404, str(exc))

    @app.exception_handler(BadRequest)
    async def bad_request(request: Request, exc: BadRequest) -> JSONResponse:
        return _error(400, str(exc))

    @app.exception_handler(ParsearchError)
    async def store_error(request: Request, exc: ParsearchError) -> JSONResponse:
        # The store cannot be read now (missing, locked past the timeout, not a store).
        return _error(503, str(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [
            f"{' '.join(str(part) for part in error.get('loc', ()))}: {error.get('msg')}"
            + (f" (got {error['input']!r})" if "input" in error else "")
            for error in exc.errors()
        ]
        return _error(400, "; ".join(problems))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        message = exc.detail
        if exc.status_code == 404:
            message = f"no such page {request.url.path}; the API is listed at /openapi.json"
        return _error(exc.status_code, str(message))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        LOG.exception("error answering %s", request.url.path)
        return _error(500, f"internal error answering {request.url.path}: {exc}")
