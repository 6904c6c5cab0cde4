"""``simulate``: trials answered by the analytic estimate, with noise and out-of-memory.

Rehearses a 1T-scale campaign in seconds and tests the driver without starting a process.
Each trial's outcome depends only on the seed and the layout (not on the order trials run
in), so a trial re-run after an interruption gets the same result.

Options (``--backend-opt key=value``):

* ``delay``: seconds each trial "runs" (default 0);
* ``jitter``: each trial's delay is ``delay`` times a factor drawn in ``[1 - jitter,
  1 + jitter]`` (default 0), so trials started together do not all finish together;
* ``noise``: sigma of the log-normal factor on the step time (default 0.05);
* ``mem_factor``, ``mem_offset``: the "true" peak memory is
  ``predicted * mem_factor + mem_offset`` (bytes or ``2GiB``; defaults 1 and 0), so tests
  can make the estimate wrong by a known amount; above the space's memory limit the trial
  is ``oom``;
* ``seed``: the noise seed (default: the trial's, which is the campaign seed);
* ``fail_rate``: probability that a trial ends in ``error`` (default 0), as crashes do;
* ``release``: seconds a finished trial's slot stays taken after its result is reported
  (default 0), as Ray keeps a placement group until its actors have closed.

A trial whose simulated run (warm-up and measured steps) would exceed its timeout is a
``timeout``.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import math
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from parsearch.backends import Finished, check_options, conclusion_failed, number_option
from parsearch.errors import BackendError, BackendOptionError
from parsearch.result import TrialResult, TrialState
from parsearch.space import SearchSpace
from parsearch.trial import TrialSpec
from parsearch.units import format_bytes, parse_bytes

OPTIONS = (
    "delay", "jitter", "noise", "mem_factor", "mem_offset", "seed", "fail_rate", "release"
)  # fmt: skip


@dataclass(frozen=True)
class SimulateSettings:
    """How far the simulated machine departs from the estimate."""

    delay_s: float = 0.0
    jitter: float = 0.0
    noise: float = 0.05
    mem_factor: float = 1.0
    mem_offset_bytes: float = 0.0
    seed: int | None = None
    fail_rate: float = 0.0
    release_s: float = 0.0

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> SimulateSettings:
        check_options("simulate", options, OPTIONS)
        number = functools.partial(number_option, "simulate", options)
        offset = 0.0
        if "mem_offset" in options:
            text = options["mem_offset"].strip()
            sign = -1.0 if text.startswith("-") else 1.0
            try:
                offset = sign * parse_bytes(text.lstrip("+-"))
            except ValueError as error:
                raise BackendOptionError(f"simulate option mem_offset: {error}") from None
        return cls(
            delay_s=number("delay", 0.0, 0.0),
            jitter=number("jitter", 0.0, 0.0, 1.0),
            noise=number("noise", 0.05, 0.0),
            mem_factor=number("mem_factor", 1.0, 1e-6),
            mem_offset_bytes=offset,
            seed=int(number("seed", 0, 0)) if "seed" in options else None,
            fail_rate=number("fail_rate", 0.0, 0.0, 1.0),
            release_s=number("release", 0.0, 0.0),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "delay": self.delay_s,
            "jitter": self.jitter,
            "noise": self.noise,
            "mem_factor": self.mem_factor,
            "mem_offset": self.mem_offset_bytes,
            "seed": self.seed,
            "fail_rate": self.fail_rate,
            "release": self.release_s,
        }


def simulate_trial(space: SearchSpace, spec: TrialSpec, settings: SimulateSettings) -> TrialResult:
    """What running ``spec`` would report on the simulated machine."""
    layout, timeout_s = spec.layout, spec.timeout_s
    prediction = space.predict(layout)
    rng = _trial_rng(spec, settings, "outcome")
    noise = math.exp(rng.gauss(0.0, settings.noise)) if settings.noise else 1.0
    crashed = rng.random() < settings.fail_rate
    peak = prediction.memory.total * settings.mem_factor + settings.mem_offset_bytes
    limit = space.memory_limit_bytes
    if peak > limit:
        return TrialResult(
            status=TrialState.OOM,
            error=f"simulated out of memory: {format_bytes(peak)} needed per rank, "
            f"limit {format_bytes(limit)}",
        )
    if crashed:
        return TrialResult(status=TrialState.ERROR, error="simulated crash (fail_rate)")
    step = prediction.step_time_s * noise
    steps = int(space.trainer.get("steps", 10)) + int(space.trainer.get("warmup_steps", 0))
    if steps * step > timeout_s:
        return TrialResult(
            status=TrialState.TIMEOUT,
            error=f"simulated run of {steps} steps x {step:.3g} s exceeds {timeout_s:g} s",
        )
    return TrialResult(
        status=TrialState.OK,
        metrics={
            "step_time_s": step,
            "tokens_per_s": prediction.tokens_per_s / noise,
            "tflops_per_device": prediction.tflops_per_device / noise,
            "mfu": prediction.mfu / noise,
            "peak_mem_bytes": peak,
        },
        duration_s=steps * step,
    )


def _trial_rng(spec: TrialSpec, settings: SimulateSettings, purpose: str) -> random.Random:
    """Random numbers that depend on the seed, the layout and their use, nothing else."""
    seed = spec.seed if settings.seed is None else settings.seed
    digest = hashlib.sha256(f"{seed}:{spec.layout.key()}:{purpose}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


class SimulateBackend:
    """Answers each trial from :func:`simulate_trial` after ``delay`` seconds.

    It holds ``slots`` allocations' worth of nodes; a trial takes ``spec.nodes`` of them, so
    proxies smaller than the allocation run several at once.
    """

    name = "simulate"

    def __init__(self, space: SearchSpace, settings: SimulateSettings, slots: int):
        self.space = space
        self.settings = settings
        self._slots = slots
        self._per_trial = space.allocation.nodes
        # (due time, submission number, trial id, nodes, spec): a heap ordered by due time.
        self._running: list[tuple[float, int, str, list[int], TrialSpec]] = []
        self._free = list(range(slots * self._per_trial))
        self._releasing: list[tuple[float, list[int]]] = []  # (free again at, nodes)
        self._submitted = 0

    @property
    def capacity(self) -> int:
        return self._slots

    def free_slots(self) -> int:
        return self.room_for(self._per_trial)

    def room_for(self, nodes: int) -> int:
        """How many more trials of ``nodes`` nodes fit now."""
        now = time.monotonic()
        for at, freed in self._releasing:
            if at <= now:
                self._free += freed
        self._releasing = [(at, freed) for at, freed in self._releasing if at > now]
        return len(self._free) // nodes

    def submit(self, spec: TrialSpec) -> list[str]:
        if not self.room_for(spec.nodes):
            raise BackendError(
                f"simulate backend: too busy for {spec.trial_id}: {len(self._free)} free "
                f"nodes, it needs {spec.nodes}"
            )
        self._free.sort()
        nodes = [self._free.pop() for _ in range(spec.nodes)]
        delay = self.settings.delay_s
        if self.settings.jitter:
            jitter = self.settings.jitter
            delay *= _trial_rng(spec, self.settings, "delay").uniform(1 - jitter, 1 + jitter)
        due = time.monotonic() + delay
        heapq.heappush(self._running, (due, self._submitted, spec.trial_id, nodes, spec))
        self._submitted += 1
        return [f"sim{nodes[0] // self._per_trial}"]

    def poll(self, timeout_s: float) -> list[Finished]:
        if not self._running:
            return []
        wait = self._running[0][0] - time.monotonic()
        if wait > 0:
            time.sleep(min(wait, timeout_s))
        now = time.monotonic()
        done = []
        while self._running and self._running[0][0] <= now:
            _, _, trial_id, nodes, spec = heapq.heappop(self._running)
            self._releasing.append((now + self.settings.release_s, nodes))
            try:
                result = self.outcome(spec)
            except Exception as error:
                result = conclusion_failed(self.name, error)
            result.hosts = [f"sim{nodes[0] // self._per_trial}"]
            done.append(Finished(trial_id, result))
        return done

    def outcome(self, spec: TrialSpec) -> TrialResult:
        """What the trial reports as it ends (a function of seed and layout alone, so taken
        at the end as a real trial's is)."""
        return simulate_trial(self.space, spec, self.settings)

    def cancel(self, trial_id: str) -> None:
        for item in self._running:
            if item[2] == trial_id:
                self._running.remove(item)
                heapq.heapify(self._running)
                self._free += item[3]
                return

    def close(self) -> None:
        self._running.clear()
        self._releasing.clear()
        self._free = list(range(self._slots * self._per_trial))

    def describe(self) -> dict[str, Any]:
        return {"slots": self._slots, **self.settings.to_dict()}


# The simulated nodes the backend keeps track of (each slot's allocation, ~40 B a node),
# checked before the lists are made: 10^7 is ~400 MB.
MAX_SIMULATED_NODES = 10**7


def create(space: SearchSpace, *, slots: int | None, options: Mapping[str, str]) -> SimulateBackend:
    """The simulate backend; ``slots`` defaults to 1."""
    slots = slots or 1
    if slots * space.allocation.nodes > MAX_SIMULATED_NODES:
        raise BackendOptionError(
            f"simulate backend: --slots {slots} x allocation.nodes {space.allocation.nodes} "
            f"is {slots * space.allocation.nodes} simulated nodes, more than the "
            f"{MAX_SIMULATED_NODES} it can keep track of: --slots must lie in "
            f"[1, {max(1, MAX_SIMULATED_NODES // space.allocation.nodes)}] for this space"
        )
    return SimulateBackend(space, SimulateSettings.from_options(options), slots)
