"""Peak memory of a trial's processes, measured by the node agent rather than taken from logs.

A program's log says how much memory it used only if someone added a print; a ``memory_cap``
that relies on it caps nothing for the others, and a log can be misread. The agent started
every process of the trial, so it measures them itself (Linux; psutil not needed):

* while they run, each process's high-water resident set (``VmHWM`` in
  ``/proc/<pid>/status``, which the kernel keeps, so a sample taken any time after the peak
  sees it) for the process it started and every descendant (a launcher's workers), a few
  times a second and once more before the survivors are killed.

A compiler the program starts is not the program: DeepSpeed builds its ops with ``ninja`` and
``g++`` at first use (``cc1plus`` alone can hold a gigabyte), torch extensions and Triton call
``nvcc``, ``ptxas``, ``hipcc`` or ``clang``. Such a process, with everything below it, is left
out (:data:`BUILD_TOOLS`, by the kernel's name of the process): a layout must not be capped or
ranked by what building its kernels once took, which a cached build does not take again.

``wait4``'s ``ru_maxrss`` is not used: it keeps the peak of the memory a process had before
``exec``, i.e. of the forking parent (the agent, a launcher), not of the program.

The figure is per process: the largest rank's peak resident set, which is what a rank of a
CPU trial uses (a device's memory is not in it).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

KIB = 1024
# Process names (``/proc/<pid>/stat``'s, at most 15 characters) of build tools and compilers
# that a rank may start to compile kernels: not counted, nor anything they start.
BUILD_TOOLS = frozenset(
    {
        "ninja", "cc", "c++", "gcc", "g++", "cc1", "cc1plus", "collect2",
        "as", "ld", "ld.gold", "ld.lld", "clang", "clang++", "nvcc", "cicc", "ptxas",
        "fatbinary", "nvlink", "hipcc", "amdclang", "amdclang++", "lld",
    }
)  # fmt: skip


def _children() -> dict[int, list[int]]:
    """Every live process's children but the :data:`BUILD_TOOLS`, from one read of /proc
    (empty off Linux)."""
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
        head, rest = stat.rsplit(b")", 1)
        command = head.split(b"(", 1)[-1].decode(errors="replace")
        fields = rest.split()  # after the command name: state, ppid
        if fields[0] != b"Z" and command not in BUILD_TOOLS:
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
