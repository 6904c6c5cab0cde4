"""Whether a lease holder on this host is provably dead, so its lease need not go stale first.

A driver killed with ``kill -9`` never releases its lease; waiting the whole lease timeout
(60 s by default) before ``resume`` may continue is only needed when the holder might still
be alive somewhere. On the same host the kernel can say for sure: the lease records the
holder's pid with an identity (boot id, pid namespace, process start time), and the holder is
dead when its pid no longer exists or now belongs to a process that started at another time
(the pid was reused). Anything that cannot be read (another OS, another pid namespace,
``/proc`` hidden) proves nothing, and the lease then goes stale as before.
"""

from __future__ import annotations

import os
from pathlib import Path

_PROC = Path("/proc")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22);
    ``None`` when there is no such process, or only its zombie (it has exited)."""
    stat = _read(_PROC / str(pid) / "stat")
    if stat is None:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = stat.rpartition(")")[2].split()
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return fields[19]


def _namespace() -> str | None:
    """This host's boot and this process's pid namespace: a pid means one process within."""
    boot = _read(_PROC / "sys" / "kernel" / "random" / "boot_id")
    try:
        pid_ns = os.readlink(_PROC / "self" / "ns" / "pid")
    except OSError:
        return None
    return f"{boot}/{pid_ns}" if boot else None


def process_identity(pid: int | None = None) -> str | None:
    """What identifies process ``pid`` (this one by default) beyond its number, or ``None``."""
    namespace = _namespace()
    started = _start_time(os.getpid() if pid is None else pid)
    if namespace is None or started is None:
        return None
    return f"{namespace}/{started}"


def provably_dead(pid: int, identity: str | None) -> bool:
    """Whether the process recorded as ``pid`` with ``identity`` has certainly exited.

    Call only for a holder on this host. ``False`` whenever the answer is not certain.
    """
    namespace = _namespace()
    if identity is None or namespace is None:
        return False
    recorded_namespace, _, recorded_start = identity.rpartition("/")
    if recorded_namespace != namespace:
        return False  # another boot or pid namespace: this pid number means nothing here
    if not (_PROC / "self" / "stat").exists():
        return False
    started = _start_time(pid)
    return started is None or started != recorded_start
