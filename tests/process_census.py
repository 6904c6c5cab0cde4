"""Which processes a test's trial left alive, read from /proc (the tests' kill -9 and
clean-up checks count real processes, not what the code under test says it started), and
which shared-memory segments no process maps any more."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

SHM = "/dev/shm"
SEGMENT_PREFIX = "mpich_shm_"


def _state(entry: Path) -> str | None:
    """The one-letter state of the process at ``entry`` (``/proc/PID``); None once gone."""
    try:
        return (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def child_pids_alive(pids: list[int]) -> list[int]:
    """The ones of ``pids`` that still exist as live (non-zombie) processes."""
    return [pid for pid in pids if _state(Path(f"/proc/{pid}")) not in (None, "Z")]


def survivors(marker: Path, zombies: bool = False) -> list[int]:
    """Live processes whose command line mentions ``marker`` (a test's own directory), and
    unreaped ones with ``zombies``: a process the guard leaves unreaped would be init's to
    reap."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        state = _state(entry)
        if str(marker).encode() in cmdline and state is not None and (zombies or state != "Z"):
            found.append(int(entry.name))
    return found


def marked(var: str, value: str, exclude: int) -> list[int]:
    """Live processes but ``exclude`` whose environment has ``var=value``: a marker given to
    a driver reaches everything it starts (its fork server and that server's ranks share the
    server's environment block; spawned ranks get the driver's), whatever their command
    line, session or parent, forks an instant old included."""
    needle = f"{var}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in (exclude, os.getpid()):
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue  # ended meanwhile, or not ours to read
        if needle in environ.split(b"\0") and _state(entry) not in (None, "Z"):
            found.append(int(entry.name))
    return found


def orphaned_segments(since: float) -> list[str]:
    """mpich segments in /dev/shm modified since ``since`` that no process maps. mpich
    makes them readable by their owner only, whose processes' mappings this user reads; a
    process whose mappings it cannot read (another user's, a container's init) is not one
    that could map them."""
    candidates = []
    for name in os.listdir(SHM):
        path = os.path.join(SHM, name)
        with contextlib.suppress(OSError):
            if name.startswith(SEGMENT_PREFIX) and os.stat(path).st_mtime >= since:
                candidates.append(path)
    if not candidates:
        return []
    mapped: set[str] = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as maps:
                mapped.update(line.split(maxsplit=5)[-1].strip() for line in maps if SHM in line)
        except OSError:
            continue  # ended meanwhile, or not ours to read
    return [path for path in candidates if path not in mapped]
