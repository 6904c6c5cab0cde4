"""Store locations as a user pastes them into a command."""

from __future__ import annotations

import os
import shlex
from urllib.parse import urlsplit, urlunsplit


def without_password(url: str) -> str:
    """``url`` with a PostgreSQL URL's password left out (anything else unchanged), for a
    command a user pastes; the password comes from ``PGPASSWORD`` or ``~/.pgpass``."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres") or parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit(parts._replace(netloc=f"{user}{netloc}"))


def resume_command(store: str | os.PathLike[str], name: str) -> str:
    """``parsearch resume`` for ``name`` in ``store`` as a user can paste it. A URL's
    password is left out, never shown masked (a masked one would not connect): libpq reads
    it from ``PGPASSWORD`` or ``~/.pgpass``."""
    where = without_password(str(store))
    note = " (the password from PGPASSWORD or ~/.pgpass)" if where != str(store) else ""
    return f"parsearch resume --store {shlex.quote(where)} --name {shlex.quote(name)}{note}"
