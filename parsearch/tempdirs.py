"""Temporary directories that a later parsearch removes if their owner was killed.

A driver killed with ``kill -9`` cannot remove its temporary directories (the backend's trial
directories, the optimiser's logs); repeated kills fill ``TMPDIR``. Each directory made here
records its owner's pid in its name and the owner's identity in a marker file, and every new
one first removes those whose owner is provably dead (see :mod:`parsearch.store.liveness`):
the next ``run`` or ``resume`` cleans what a dead driver left. A directory whose owner may be
alive, or that another host or container made, is never touched.

A directory appears under its name already marked: it is made under a staging name that
itself encodes the owner's identity, marked, then renamed. A kill between ``mkdir`` and the
marker's write would otherwise leave a directory that names no owner, which nothing may
ever remove; a staging leftover names its owner and goes like any other.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import secrets
import shutil
import tempfile
from pathlib import Path

from parsearch.store.liveness import process_identity, provably_dead

_OWNER_FILE = ".parsearch-owner"
_NAME = re.compile(r"^parsearch-[a-z]+-p(\d+)-")
_STAGING = re.compile(r"^\.parsearch-staging-p(\d+)-([0-9a-f]{12})-(\d+)-")


def _digest(namespace: str) -> str:
    """A file-name-safe stand-in for an identity's boot and pid namespace (it holds ``/``)."""
    return hashlib.sha256(namespace.encode()).hexdigest()[:12]


def _staging_prefix(identity: str | None) -> str:
    """The name a directory is made under before it is marked: its owner's pid, namespace
    digest and start time, so that a leftover is judged without a marker."""
    if identity is None:
        return f".parsearch-staging-p{os.getpid()}-unknown-"
    namespace, _, started = identity.rpartition("/")
    return f".parsearch-staging-p{os.getpid()}-{_digest(namespace)}-{started}-"


def _owner_of(entry: Path) -> tuple[int, str | None] | None:
    """The pid and identity that ``entry`` records (in its marker, or a staging name), or
    ``None`` when it is not a parsearch directory."""
    staging = _STAGING.match(entry.name)
    if staging is not None:
        pid, digest, started = staging.groups()
        namespace = (process_identity() or "").rpartition("/")[0]
        same_namespace = bool(namespace) and _digest(namespace) == digest
        return int(pid), f"{namespace}/{started}" if same_namespace else None
    match = _NAME.match(entry.name)
    if match is None:
        return None
    try:
        identity = (entry / _OWNER_FILE).read_text().strip() or None
    except OSError:
        return None
    return int(match.group(1)), identity


def _marked_directory(parent: Path) -> Path:
    """A new directory under ``parent`` holding its owner marker, under a staging name."""
    identity = process_identity()
    staging = Path(tempfile.mkdtemp(prefix=_staging_prefix(identity), dir=parent))
    (staging / _OWNER_FILE).write_text(identity or "")
    return staging


def remove_dead_owners(root: Path | None = None) -> list[Path]:
    """Remove the directories under ``root`` (TMPDIR) whose owner has exited; return them."""
    root = Path(root or tempfile.gettempdir())
    removed = []
    with contextlib.suppress(OSError):
        for entry in root.iterdir():
            owner = _owner_of(entry) if entry.is_dir() else None
            if owner is not None and provably_dead(*owner):
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
    return removed


def owned_tempdir(kind: str) -> Path:
    """A new directory ``TMPDIR/parsearch-<kind>-p<pid>-XXXX``, after cleaning dead ones."""
    remove_dead_owners()
    root = Path(tempfile.gettempdir())
    staging = _marked_directory(root)
    while True:
        path = root / f"parsearch-{kind}-p{os.getpid()}-{secrets.token_hex(4)}"
        try:
            os.rename(staging, path)  # onto a taken name it fails: ours are never empty
        except OSError as error:
            if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
        else:
            return path


def owned_path(kind: str, tag: str) -> Path:
    """``TMPDIR/parsearch-<kind>-p<pid>-<tag>``: where this process will make a directory
    with :func:`make_owned`, known before it exists (a name a command template can hold).
    ``tag`` must be unique within the process (e.g. a trial id and node rank)."""
    return Path(tempfile.gettempdir()) / f"parsearch-{kind}-p{os.getpid()}-{tag}"


def make_owned(path: Path) -> Path:
    """Make ``path`` (from :func:`owned_path`) afresh, empty but for its owner marker, after
    cleaning dead owners' directories; a leftover of an earlier attempt is removed first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_owners(path.parent)
    shutil.rmtree(path, ignore_errors=True)
    os.rename(_marked_directory(path.parent), path)
    return path
