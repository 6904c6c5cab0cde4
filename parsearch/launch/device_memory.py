"""Device memory of a trial's processes as NVIDIA's driver sees it (NVML), sampled by the node
agent: what a rank holds on its GPU without the program printing anything.

NVML (``libnvidia-ml.so.1``, installed with the driver) lists every process using a device
and its memory (``nvmlDeviceGetComputeRunningProcesses``): the allocator's reservation plus
the CUDA context, the figure ``nvidia-smi`` shows. It is a current figure, so the agent keeps
the largest sample. Loaded with ctypes, no Python package needed; where the library is
missing (no NVIDIA driver, a CPU machine, ROCm) or a call fails, nothing is measured.

Limits: a process in another PID namespace than the driver's (some containers) is listed
under a pid the agent does not know, and is not counted.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable

NVML_SUCCESS = 0
NVML_ERROR_INSUFFICIENT_SIZE = 7
MAX_PROCESSES = 256


class _ProcessInfo(ctypes.Structure):
    """nvmlProcessInfo_t (v2/v3: with the MIG instance ids)."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class _ProcessInfoV1(ctypes.Structure):
    """nvmlProcessInfo_t before drivers 470 (no instance ids)."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class DeviceMemory:
    """Per-process device memory from NVML; :attr:`available` is false without it."""

    def __init__(self) -> None:
        self._handles: list[ctypes.c_void_p] = []
        self._lib = None
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() != NVML_SUCCESS:
                return
            count = ctypes.c_uint()
            if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != NVML_SUCCESS:
                return
            for index in range(count.value):
                handle = ctypes.c_void_p()
                if lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) == 0:
                    self._handles.append(handle)
        except (OSError, AttributeError):
            return
        self._lib = lib
        for name, struct in (
            ("nvmlDeviceGetComputeRunningProcesses_v3", _ProcessInfo),
            ("nvmlDeviceGetComputeRunningProcesses_v2", _ProcessInfo),
            ("nvmlDeviceGetComputeRunningProcesses", _ProcessInfoV1),
        ):
            if hasattr(lib, name):
                self._query, self._struct = getattr(lib, name), struct
                break
        else:
            self._lib = None

    @property
    def available(self) -> bool:
        return self._lib is not None and bool(self._handles)

    def by_process(self) -> dict[int, int]:
        """Bytes each process holds now, summed over every device (empty without NVML)."""
        used: dict[int, int] = {}
        if not self.available:
            return used
        for handle in self._handles:
            infos = (self._struct * MAX_PROCESSES)()
            count = ctypes.c_uint(MAX_PROCESSES)
            try:
                status = self._query(handle, ctypes.byref(count), infos)
            except OSError:
                continue
            if status != NVML_SUCCESS:
                continue
            for info in infos[: count.value]:
                memory = int(info.usedGpuMemory)
                if memory < 1 << 62:  # NVML_VALUE_NOT_AVAILABLE is all ones
                    used[int(info.pid)] = used.get(int(info.pid), 0) + memory
        return used


_DEVICES: list[DeviceMemory] = []


def devices() -> DeviceMemory:
    """This process's one :class:`DeviceMemory` (NVML is initialised once)."""
    if not _DEVICES:
        _DEVICES.append(DeviceMemory())
    return _DEVICES[0]


def device_use(trees: dict[int, Iterable[int]]) -> dict[int, int]:
    """For each root, the device memory its largest process holds now (a rank is one
    process; a launcher's workers are a rank each); empty without NVML."""
    used = devices().by_process() if devices().available else {}
    if not used:
        return {}
    return {
        root: max((used.get(pid, 0) for pid in pids), default=0) for root, pids in trees.items()
    }
