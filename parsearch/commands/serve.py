"""``parsearch serve --store FILE.db``: the live dashboard and JSON API of a campaign store."""

from __future__ import annotations

import argparse
import ipaddress
import os
import secrets
import socket

from parsearch.commands import COMMANDS
from parsearch.commands._arguments import add_store_option
from parsearch.errors import ParsearchError

TOKEN_ENV = "PARSEARCH_SERVE_TOKEN"
GENERATE = "generate"


class ServeError(ParsearchError):
    """The service cannot start as asked."""

    exit_code = 2


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help=COMMANDS["serve"],
        description="Serve a dashboard page (progress, best layout in every format, "
        "convergence, TP x PP heat map, Pareto front, predicted vs measured, trials) and a "
        "JSON API (schema at /openapi.json) that follow a campaign as it runs. The store is "
        "opened read-only for each request, so the driver is never held up. Binds 127.0.0.1 "
        "unless told otherwise; any other address needs a token.",
    )
    add_store_option(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    parser.add_argument("--port", type=int, default=8050, help="port (8050)")
    parser.add_argument(
        "--token",
        nargs="?",
        const=GENERATE,
        metavar="TOKEN",
        help="require this token on every request (Authorization: Bearer TOKEN, or "
        f"?token=TOKEN); --token alone makes a random one; default: ${TOKEN_ENV}. Required "
        "when --host is not a loopback address",
    )
    parser.set_defaults(func=run)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) only reaches this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(
                ipaddress.ip_address(info[4][0]).is_loopback
                for info in socket.getaddrinfo(host, None)
            )
        except (OSError, ValueError):
            return False


def resolve_token(given: str | None, host: str) -> str | None:
    """The token the server checks: ``--token``, else the environment; refuse to expose
    the store beyond this machine without one."""
    token = given or os.environ.get(TOKEN_ENV) or None
    if token == GENERATE:
        token = secrets.token_urlsafe(24)
    if token is None and not is_loopback(host):
        raise ServeError(
            f"--host {host} would let other machines read the store: give a token "
            f"(--token TOKEN, --token alone for a random one, or ${TOKEN_ENV}), or bind "
            "127.0.0.1 and reach it through an SSH tunnel"
        )
    return token


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise ServeError(f"--port must be in 0..65535, got {args.port}")
    token = resolve_token(args.token, args.host)
    from parsearch.store import open_store

    open_store(args.store, readonly=True).close()  # a missing store fails before the imports
    try:
        import uvicorn

        from parsearch.serve.app import create_app
        from parsearch.serve.http import BoundedH11Protocol
    except ImportError as error:
        raise ServeError(
            f"parsearch serve needs FastAPI and uvicorn ({error}); install them with "
            "pip install 'parsearch[serve]'"
        ) from None
    from parsearch.serve.views import StoreReader

    StoreReader(args.store).campaigns()  # a missing or foreign store fails here, by name
    app = create_app(args.store, token=token)
    shown = socket.gethostname() if args.host in ("0.0.0.0", "::") else args.host
    shown = f"[{shown}]" if ":" in shown else shown
    url = f"http://{shown}:{args.port}/" + (f"?token={token}" if token else "")
    print(f"parsearch serve: {args.store} at {url} (Ctrl-C stops)", flush=True)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        http=BoundedH11Protocol,
        log_level="warning",
        access_log=False,
    )
    return 0
