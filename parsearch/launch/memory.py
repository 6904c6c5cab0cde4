"""Peak memory of a trial's processes, measured by the node agent rather than taken from logs.

A program's log says how much memory it used only if someone added a print; a ``memory_cap``
that relies on it caps nothing for the others, and a log can be misread. The agent started
every process of the trial, so it measures them itself (Linux; psutil not needed):

* while they run, each process's high-water resident set (``VmHWM`` in
  ``/proc/<pid>/status``, which the kernel keeps, so a sample taken any time after the peak
  sees it) for the process it started and every descendant (a launcher's workers), a few
  times a second and once more before the survivors are killed.

``wait4``'s ``ru_maxrss`` is not used: it keeps the peak of the memory a process had before
``exec``, i.e. of the forking parent (the agent, a launcher), not of the program.

The figure is per process: the largest rank's peak resident set, which is what a rank of a
CPU trial uses (a device's memory is not in it).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

KIB = 1024


def _children() -> dict[int, list[int]]:
    """Every live process's children, from one read of /proc (empty off Linux)."""
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return children
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat.rsplit(b")", 1)[1].split()  # after the command name: state, ppid
        if fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(name))
    return children


def process_tree(root: int, children: dict[int, list[int]] | None = None) -> list[int]:
    """``root`` and every live process below it (``children``: one :func:`_children`
    read shared by several roots)."""
    children = _children() if children is None else children
    found = [root]
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def high_water_rss(pid: int) -> int:
    """A process's peak resident set in bytes so far (0 when it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as handle:
            for line in handle:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * KIB
    except (OSError, ValueError, IndexError):
        pass
    return 0


def trees(roots: Iterable[int]) -> dict[int, list[int]]:
    """Each root's process tree, from one scan of /proc for all of them (a node's agent
    samples every rank a few times a second)."""
    children = _children()
    return {root: process_tree(root, children) for root in roots}


def peak_rss(found: dict[int, list[int]]) -> dict[int, int]:
    """Each root's largest peak resident set among the processes of its tree, in bytes."""
    return {
        root: max((high_water_rss(pid) for pid in pids), default=0) for root, pids in found.items()
    }
