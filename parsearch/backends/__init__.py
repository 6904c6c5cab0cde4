"""Where trials run: one protocol, backends chosen by name and imported only when used.

A backend runs :class:`~parsearch.trial.TrialSpec` s on groups of devices and reports their
:class:`~parsearch.result.TrialResult` s. The campaign driver is its only caller, from one
thread, in this order: :meth:`Backend.free_slots` → :meth:`Backend.submit` (as many as fit)
→ :meth:`Backend.poll` (repeatedly) → :meth:`Backend.cancel` (trials a drain gives up on) →
:meth:`Backend.close`.

The protocol is in trials, not devices: the backend knows how many nodes a trial spans
(``spec.nodes``) and how many it has, so the same driver works for

* ``local``: this machine as one node, trials as groups of local processes;
* ``simulate``: no processes, the estimate with noise (rehearsals and tests);
* ``mpi``: one worker rank per node; a trial takes ``spec.nodes`` free workers;
* ``ray``: one placement group of ``spec.nodes`` bundles per trial.

A backend that raises while concluding one trial (reading its ranks' results, merging them)
reports that trial as an ``error`` naming the exception (:func:`conclusion_failed`): the
fault is the trial's, and the campaign goes on. An exception out of :meth:`Backend.poll`
itself names no trial: the driver takes the backend for broken and stops the campaign,
marked stopped and resumable.

A module ``parsearch.backends.<name>`` provides ``create(space, *, slots, options)``;
``options`` are the ``--backend-opt key=value`` strings, which the module validates (naming
the valid keys). A backend whose processes all run the ``parsearch`` command (``mpi`` under
``mpiexec``) may also define ``serve_if_worker() -> bool``: it is called before the store is
opened, and returns ``True`` after serving as a worker, so that only the driver touches the
store.
"""

from __future__ import annotations

import importlib
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from parsearch.errors import BackendError, BackendOptionError
from parsearch.result import TrialResult, TrialState
from parsearch.trial import TrialSpec

if TYPE_CHECKING:
    from parsearch.space import SearchSpace

BACKENDS: dict[str, str] = {
    "local": "parsearch.backends.local",
    "simulate": "parsearch.backends.simulate",
    "mpi": "parsearch.backends.mpi",
    "ray": "parsearch.backends.ray",
}


@dataclass(frozen=True)
class Finished:
    """A trial the backend is done with: its id (``spec.trial_id``) and outcome."""

    trial_id: str
    result: TrialResult


@runtime_checkable
class Backend(Protocol):
    """What the driver needs from a place that runs trials."""

    name: str

    @property
    def capacity(self) -> int:
        """How many trials can run at once when nothing is running."""

    def free_slots(self) -> int:
        """How many more trials :meth:`submit` accepts now."""

    def submit(self, spec: TrialSpec) -> list[str]:
        """Start ``spec`` without waiting for it; return the hosts it runs on.

        Raises :class:`BackendError` if there is no free slot. A trial that fails to start
        is not an exception: it is reported by :meth:`poll` as an ``error`` result.
        """

    def poll(self, timeout_s: float) -> list[Finished]:
        """Trials finished since the last call; waits up to ``timeout_s`` for the first one."""

    def cancel(self, trial_id: str) -> None:
        """Stop a running trial now (a drain that ran out of grace); it is not reported."""

    def close(self) -> None:
        """Stop whatever still runs and release the backend's resources; idempotent."""

    def describe(self) -> dict[str, Any]:
        """The settings worth recording with the campaign (slots, options, hosts...)."""


def conclusion_failed(backend: str, error: Exception) -> TrialResult:
    """The result of a trial whose backend raised while concluding it: an ``error`` that
    names the exception, so that the trial fails alone instead of the campaign."""
    return TrialResult(
        status=TrialState.ERROR,
        error=f"backend '{backend}' failed while concluding the trial: "
        f"{type(error).__name__}: {error}",
    )


def room_for(backend: Backend, nodes: int) -> int:
    """How many more trials of ``nodes`` nodes ``backend`` accepts now.

    Backends that place trials on nodes (``mpi``, ``ray``, ``simulate``) define
    ``room_for(nodes)``, so trials smaller than the allocation (proxies) share its nodes;
    for the others a slot holds a trial whatever its size (``local`` runs every node of a
    trial on this machine, ``--slots`` at once), and this is :meth:`Backend.free_slots`.
    """
    sized = getattr(backend, "room_for", None)
    return int(sized(nodes)) if sized is not None else backend.free_slots()


def clock_of(backend: Backend) -> Callable[[], float]:
    """The time trials run on, in seconds: a backend that keeps its own (a virtual clock,
    as the node-hour benchmark's does) defines ``clock()``; the others run on this
    machine's monotonic clock."""
    return getattr(backend, "clock", time.monotonic)


def parse_options(pairs: Iterable[str]) -> dict[str, str]:
    """``["delay=0.5", "noise=0"]`` → ``{"delay": "0.5", "noise": "0"}``."""
    options: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise BackendOptionError(f"--backend-opt takes key=value, got {pair!r}")
        options[key.strip()] = value.strip()
    return options


def check_options(backend: str, options: Mapping[str, str], valid: Iterable[str]) -> None:
    """Refuse an option the backend does not know, naming the ones it does."""
    valid = sorted(valid)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise BackendOptionError(
            f"backend '{backend}' has no option {', '.join(unknown)}; valid: "
            f"{', '.join(valid) if valid else 'none'}"
        )


def number_option(
    backend: str,
    options: Mapping[str, str],
    key: str,
    default: float,
    low: float,
    high: float = math.inf,
) -> float:
    """A ``--backend-opt`` number in ``[low, high]`` (``default`` when absent)."""
    value = _option_number(backend, options, key, "a number")
    if value is None:
        return default
    if not (low <= value <= high and math.isfinite(value)):  # inf would wait forever
        raise BackendOptionError(
            f"{backend} option {key} must lie in [{low:g}, {high:g}] and be finite, "
            f"got {options[key]}"
        )
    return value


def positive_option(
    backend: str, options: Mapping[str, str], key: str, default: float, unit: str = ""
) -> float:
    """A ``--backend-opt`` that must be a positive finite number (``default`` when absent)."""
    what = f"a positive number{' of ' + unit if unit else ''}"
    value = _option_number(backend, options, key, what)
    if value is None:
        return default
    if not 0 < value < math.inf:
        raise BackendOptionError(f"{backend} option {key} must be {what}, got {options[key]!r}")
    return value


def _option_number(backend: str, options: Mapping[str, str], key: str, what: str) -> float | None:
    text = options.get(key)
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        raise BackendOptionError(f"{backend} option {key} must be {what}, got {text!r}") from None


def _module(name: str) -> Any:
    if name not in BACKENDS:
        raise BackendError(f"unknown backend {name!r}; valid: {', '.join(BACKENDS)}")
    try:
        return importlib.import_module(BACKENDS[name])
    except ModuleNotFoundError as error:
        if error.name == BACKENDS[name]:
            raise BackendError(f"backend '{name}' is not available in this version") from None
        raise BackendError(
            f"backend '{name}' needs the package '{error.name}', which is not installed "
            f"(pip install 'parsearch[{name}]')"
        ) from None


def serve_if_worker(name: str) -> bool:
    """Let a multi-process backend divert its worker processes; ``False`` for the driver."""
    hook = getattr(_module(name), "serve_if_worker", None)
    return bool(hook()) if hook is not None else False


def create_backend(
    name: str,
    space: SearchSpace,
    *,
    slots: int | None = None,
    options: Mapping[str, str] | None = None,
) -> Backend:
    """The backend called ``name``, ready to run trials of ``space``.

    ``slots`` caps how many trials run at once (``None``: what the backend has room for).
    """
    if slots is not None and slots < 1:
        raise BackendOptionError(f"--slots must be >= 1, got {slots}")
    return _module(name).create(space, slots=slots, options=dict(options or {}))


__all__ = [
    "BACKENDS",
    "Backend",
    "Finished",
    "check_options",
    "conclusion_failed",
    "create_backend",
    "number_option",
    "parse_options",
    "positive_option",
    "room_for",
    "serve_if_worker",
]
