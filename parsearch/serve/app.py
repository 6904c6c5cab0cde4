"""The ``parsearch serve`` ASGI application: a read-only JSON API and the live dashboard page.

FastAPI documents the API's schema at ``/openapi.json``. Its Swagger and ReDoc pages are
turned off: they load their scripts from a CDN, and the service must work on a login node
that cannot reach one. Every asset of the dashboard ships in ``parsearch/serve/static``.
"""

from __future__ import annotations

import contextlib
import hashlib
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
from starlette.middleware.gzip import GZipMiddleware

from parsearch.errors import ParsearchError
from parsearch.serve import figures, views
from parsearch.serve.views import (
    MAX_COUNT,
    BadRequest,
    NotFound,
    SpaceUnloadable,
    StoreReader,
    shown,
)
from parsearch.version import __version__

LOG = logging.getLogger("parsearch.serve")
STATIC = resources.files("parsearch.serve") / "static"
TOKEN_HEADER = "authorization"
TOKEN_COOKIE = "parsearch_token"
# A query string longer than this is refused (414) before anything reads it.
MAX_QUERY_CHARS = 4096
# An error message is cut to this: it never carries a request's (or a file's) bulk back.
MAX_ERROR_CHARS = 600
# Responses smaller than this are sent as they are; larger ones gzipped when the client
# accepts it (a dashboard poll: ~400 KB of JSON, ~60 KB gzipped).
GZIP_MIN_BYTES = 1024


def _error(status: int, message: str) -> JSONResponse:
    if len(message) > MAX_ERROR_CHARS:
        message = message[: MAX_ERROR_CHARS - 1] + "…"
    return JSONResponse({"error": message}, status_code=status)


def create_app(store_path: str | os.PathLike[str], token: str | None = None) -> FastAPI:
    """The service for the store at ``store_path``; with ``token``, every request must carry
    it (``Authorization: Bearer TOKEN`` or ``?token=TOKEN``)."""
    reader = StoreReader(store_path)
    cache = figures.FigureCache(reader.open)
    importances = figures.ImportanceCache()

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
    # Middleware: the last added runs first. The token is checked before anything else;
    # gzip compresses what the ETag was computed on.
    _add_etags(app)
    app.add_middleware(GZipMiddleware, minimum_size=GZIP_MIN_BYTES)
    _add_query_bound(app)
    _add_token_check(app, token)
    _add_error_handlers(app, reader.path)
    app.state.figures = cache  # the figure bundles, keyed on each campaign's trials

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

    @app.get("/api/campaigns/{name}/best-known", tags=["results"])
    def best_known(
        name: str,
        trainer: str | None = Query(None, description="only campaigns of this trainer kind"),
    ) -> dict[str, Any]:
        """The best layout any campaign of the store found for this campaign's model on its
        allocation (same shape, nodes, devices per node, device kind), ranked by tokens/s
        with provenance: `parsearch best --like SPACE --format json` with the campaign's
        space; 404, naming the same model at other node counts, when nothing compares."""
        return read(name, views.best_across, trainer)

    @app.get("/api/campaigns/{name}/top", tags=["results"])
    def top(
        name: str,
        k: int = Query(10, description=f"how many trials, 1 to {MAX_COUNT}"),
        max_mem: str | None = Query(None, description="peak memory per rank cap"),
    ) -> list[dict[str, Any]]:
        """The k best ok trials, measured beside predicted: `parsearch top -k K --format json`."""
        return read(name, views.top, k, max_mem)

    @app.get(
        "/api/campaigns/{name}/trials",
        tags=["trials"],
        openapi_extra={"parameters": views.trial_filter_parameters()},
    )
    def trials(request: Request, name: str) -> list[dict[str, Any]]:
        """The campaign's trials in order of number, with failure reasons, filtered by state
        and layout values (each a comma list), `limit` and `offset`. Unknown or malformed
        parameters are a 400."""
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

    def figure(name: str, member: str) -> Any:
        """A figure's table from the store as it is now (the dashboard's may lag a poll),
        computed once per change of the campaign's trials for every request."""
        with reader.open() as store:
            campaign = views.find_campaign(store, name)
            bundle = cache.entry(store, campaign, current=True).bundle
        if bundle[member] is None and bundle["space_error"]:
            raise SpaceUnloadable(bundle["space_error"])
        return JSONResponse(bundle[member])

    @app.get("/api/campaigns/{name}/fidelity", tags=["figures"])
    def fidelity(name: str) -> dict[str, Any]:
        """The estimate against the trials, for the objective and peak memory: median
        measured/predicted ratio, IQR, mean error, rank correlation and the pairs."""
        return figure(name, "fidelity")

    @app.get("/api/campaigns/{name}/convergence", tags=["figures"])
    def convergence(name: str) -> list[dict[str, Any]]:
        """Best objective after each finished trial, in finish order."""
        return figure(name, "convergence")

    @app.get("/api/campaigns/{name}/heatmap", tags=["figures"])
    def heatmap(name: str) -> dict[str, Any]:
        """TP x PP cells: best objective, or why none (oom, failed, no_divide, ...)."""
        return figure(name, "heatmap")

    @app.get("/api/campaigns/{name}/importance", tags=["figures"])
    def importance(name: str) -> dict[str, Any]:
        """Which searched dimensions the objective depends on among the ok trials:
        permutation importance (scikit-learn) of a random forest fitted to them, with its
        R² and the method in words; computed once per change of the trials."""
        with reader.open() as store:
            campaign = views.find_campaign(store, name)
            return JSONResponse(importances.get(store, campaign))

    @app.get("/api/campaigns/{name}/dashboard", tags=["figures"])
    def dashboard(name: str) -> dict[str, Any]:
        """Everything the dashboard page draws (status, best in every format, figures,
        trials): what the page polls. A campaign whose stored space no longer loads gets
        its status, best, Pareto front and trials, the other figures null and
        `space_error` saying what is missing. The status is read now; the rest is recomputed when
        trials changed, in the background, so it may lag the status by a poll (2 s), and
        never by more than 10 s."""

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


def _add_etags(app: FastAPI) -> None:
    """An ``ETag`` on every API answer, and ``304 Not Modified`` when the client already
    has it (``If-None-Match``): a browser polling a campaign that did not move gets no body.
    ``Cache-Control: no-cache`` makes it ask every time rather than reuse its copy."""

    @app.middleware("http")
    async def etag(request: Request, call_next):
        response = await call_next(request)
        if request.method != "GET" or response.status_code != 200:
            return response
        if not request.url.path.startswith("/api/"):
            return response
        body = b"".join([chunk async for chunk in response.body_iterator])
        tag = f'"{hashlib.blake2b(body, digest_size=12).hexdigest()}"'
        headers = {key: value for key, value in response.headers.items() if key != "content-length"}
        headers.update({"etag": tag, "cache-control": "no-cache"})
        wanted = request.headers.get("if-none-match", "")
        if tag in (part.strip() for part in wanted.split(",")):
            return Response(status_code=304, headers={"etag": tag, "cache-control": "no-cache"})
        return Response(body, status_code=200, headers=headers)


def _add_query_bound(app: FastAPI) -> None:
    """Refuse a query string over :data:`MAX_QUERY_CHARS` outright (414), without parsing
    or echoing it."""

    @app.middleware("http")
    async def bounded(request: Request, call_next):
        length = len(request.scope.get("query_string", b""))
        if length > MAX_QUERY_CHARS:
            return _error(
                414, f"query string of {length} characters; at most {MAX_QUERY_CHARS} allowed"
            )
        return await call_next(request)


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


def _add_error_handlers(app: FastAPI, store_path: str | os.PathLike[str]) -> None:
    """Every failure is ``{"error": message}`` with its status; never a traceback, never
    the server's paths, never more than a short excerpt of what the request sent."""
    store_file = os.path.basename(os.fspath(store_path))
    full_paths = {os.fspath(store_path), os.path.abspath(os.fspath(store_path))}

    def private(message: str) -> str:
        """``message`` with the store's path reduced to its file name."""
        for path in sorted(full_paths, key=len, reverse=True):
            message = message.replace(path, store_file)
        return message

    @app.exception_handler(NotFound)
    async def not_found(request: Request, exc: NotFound) -> JSONResponse:
        return _error(404, str(exc))

    @app.exception_handler(BadRequest)
    async def bad_request(request: Request, exc: BadRequest) -> JSONResponse:
        return _error(400, str(exc))

    @app.exception_handler(SpaceUnloadable)
    async def space_unloadable(request: Request, exc: SpaceUnloadable) -> JSONResponse:
        # Not the store failing (503, try later): the campaign's stored space names a file
        # that is gone or changed, which no retry mends. The message says which.
        return _error(409, private(str(exc)))

    @app.exception_handler(ParsearchError)
    async def store_error(request: Request, exc: ParsearchError) -> JSONResponse:
        # The store cannot be read now (missing, locked past the timeout, not a store).
        return _error(503, private(str(exc)))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [
            f"{' '.join(shown(part, 40) for part in error.get('loc', ()))}: {error.get('msg')}"
            + (f" (got {shown(error['input'])})" if "input" in error else "")
            for error in exc.errors()[:3]
        ]
        return _error(400, "; ".join(problems))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        message = exc.detail
        if exc.status_code == 404:
            message = f"no such page {shown(request.url.path)}; the API is listed at /openapi.json"
        return _error(exc.status_code, str(message))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        LOG.exception("error answering %s", request.url.path)
        return _error(
            500, f"internal error answering {shown(request.url.path)} (the server logged it)"
        )
