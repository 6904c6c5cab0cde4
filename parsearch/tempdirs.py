"""Temporary directories that a later parsearch removes if their owner was killed.

A driver killed with ``kill -9`` cannot remove its temporary directories (the backend's trial
directories, the optimiser's logs); repeated kills fill ``TMPDIR``. Each directory made here
records its owner's pid in its name and the owner's identity in a marker file, and every new
one first removes those whose owner is provably dead (see :mod:`parsearch.store.liveness`):
the next ``run`` or ``resume`` cleans what a dead driver left. A directory whose owner may be
alive, or that another host or container made, is never touched.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from pathlib import Path

from parsearch.store.liveness import process_identity, provably_dead

_OWNER_FILE = ".parsearch-owner"
_NAME = re.compile(r"^parsearch-[a-z]+-p(\d+)-")


def remove_dead_owners(root: Path | None = None) -> list[Path]:
    """Remove the directories under ``root`` (TMPDIR) whose owner has exited; return them."""
    root = Path(root or tempfile.gettempdir())
    removed = []
    with contextlib.suppress(OSError):
        for entry in root.iterdir():
            match = _NAME.match(entry.name)
            if match is None or not entry.is_dir():
                continue
            try:
                identity = (entry / _OWNER_FILE).read_text().strip() or None
            except OSError:
                continue
            if provably_dead(int(match.group(1)), identity):
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
    return removed


def owned_tempdir(kind: str) -> Path:
    """A new directory ``TMPDIR/parsearch-<kind>-p<pid>-XXXX``, after cleaning dead ones."""
    remove_dead_owners()
    path = Path(tempfile.mkdtemp(prefix=f"parsearch-{kind}-p{os.getpid()}-"))
    (path / _OWNER_FILE).write_text(process_identity() or "")
    return path


def owned_path(kind: str, tag: str) -> Path:
    """``TMPDIR/parsearch-<kind>-p<pid>-<tag>``: where this process will make a directory
    with :func:`make_owned`, known before it exists (a name a command template can hold).
    ``tag`` must be unique within the process (e.g. a trial id and node rank)."""
    return Path(tempfile.gettempdir()) / f"parsearch-{kind}-p{os.getpid()}-{tag}"


def make_owned(path: Path) -> Path:
    """Make ``path`` (from :func:`owned_path`) afresh, empty but for its owner marker, after
    cleaning dead owners' directories; a leftover of an earlier attempt is removed first."""
    remove_dead_owners(path.parent)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    (path / _OWNER_FILE).write_text(process_identity() or "")
    return path
