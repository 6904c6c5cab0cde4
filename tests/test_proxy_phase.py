"""The proxy phase's decisions (parsearch.search.proxy_phase), driven by hand: which layouts
run as proxies and at what size, when one is confirmed at full scale, what a proxy's
out-of-memory means, the correction learnt from confirmations, and a replay that decides as
the interrupted campaign would have."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from parsearch.config import ParallelLayout
from parsearch.estimate.proxy import predict_run
from parsearch.result import TrialResult, TrialState
from parsearch.search.proxy_phase import ProxyPhase, expected_run_s
from parsearch.search.strategy import Placement, Proposal, Strategy
from parsearch.space import SearchSpace, space_from_dict


def cpu_space(
    zero_stage: int = 0, memory: str = "1GiB", tp: list[int] | None = None
) -> SearchSpace:
    return space_from_dict(
        {
            "name": "proxy-phase",
            "model": {
                "num_layers": 2, "hidden_size": 64, "num_heads": 4, "vocab_size": 128,
                "seq_length": 32,
            },
            "allocation": {
                "nodes": 8, "devices_per_node": 1, "device": "cpu", "device_memory": memory,
                "peak_tflops": 0.05,
            },
            "search": {
                "tp": tp or [1], "pp": [1], "mbs": [1, 2, 4],
                "recompute": ["none", "selective", "full"],
                "zero_stage": zero_stage,
            },
            "global_batch": 32,
        }
    )  # fmt: skip


class Listed(Strategy):
    """A strategy that proposes its layouts in the given order and remembers what it was
    told (the wrapped strategy of these tests)."""

    name = "listed"

    def __init__(self, space: SearchSpace, layouts: list[ParallelLayout], n_seeds: int = 2):
        super().__init__(space, seed=0)
        self.layouts = layouts
        self.n_seeds = n_seeds
        self.told: list[tuple[ParallelLayout, object]] = []

    def _propose(self, n: int) -> Iterator[Proposal]:
        return (Proposal(layout, "listed", self.space.predict(layout)) for layout in self.layouts)

    def tell(self, results) -> None:
        self.told += list(results)


@dataclass
class Record:
    """What the phase reads of a stored trial."""

    layout: ParallelLayout
    proxy_dp: int | None
    state: TrialState = TrialState.QUEUED
    objective: float | None = None
    metrics: dict = field(default_factory=dict)
    origin: str = "estimate"


def layouts(space: SearchSpace) -> list[ParallelLayout]:
    return [layout for layout, _ in space.plan().feasible]


def finish(
    phase: ProxyPhase, proposal: Proposal, value: float, ok: bool = True
) -> tuple[Record, TrialResult]:
    """Record ``proposal`` as the driver would: a proxy measures ``value`` seconds a step,
    a full-scale trial ``value`` tokens/s."""
    dp = None if proposal.proxy is None else proposal.proxy.dp
    record = Record(proposal.layout, dp)
    if not ok:
        result = TrialResult(TrialState.OOM, error="out of memory")
    elif dp is None:
        result = TrialResult(TrialState.OK, {"tokens_per_s": value})
    else:
        tokens = dp * proposal.layout.mbs * proposal.layout.gas * phase.space.model.seq_length
        result = TrialResult(TrialState.OK, {"tokens_per_s": tokens / value, "step_time_s": value})
    result = phase.record_result(record, result)
    record.state = result.status
    record.metrics = result.metrics
    record.objective = result.metrics.get("tokens_per_s") if result.ok else None
    phase.finished([(record, result)])
    return record, result


def predicted_run_s(phase: ProxyPhase, proposal: Proposal) -> float:
    assert proposal.proxy is not None
    space = phase.space
    return predict_run(space.model, proposal.proxy.proxy_layout, space.allocation).step_time_s


def first_wave(phase: ProxyPhase, n: int) -> list[Proposal]:
    """The first wave's ``n`` proxies, checked to start longest predicted first, returned
    calibration first, then in the wrapped strategy's order."""
    wave = phase.ask(n)
    assert len(wave) == n
    runs = [predicted_run_s(phase, proposal) for proposal in wave]
    assert runs == sorted(runs, reverse=True)
    order = phase.inner.layouts
    return sorted(wave, key=lambda p: (p.origin != "calibrate", order.index(p.layout)))


def opened(b_step: float) -> tuple[ProxyPhase, Record]:
    """A phase whose opening measured 1000 tokens/s, then its first wave: the opening's
    calibration proxy (step 1 s), a proxy at 1.25 s and ``b`` at ``b_step``, all in: ``b``'s
    record."""
    space = cpu_space()
    listed = layouts(space)
    phase = ProxyPhase(Listed(space, listed, n_seeds=2), budget=20, margin=0.05)
    (opening,) = phase.ask(1)
    assert opening.proxy is None and opening.layout == listed[0] and opening.origin == "listed"
    assert phase.ask(1) == []  # it holds the allocation
    finish(phase, opening, 1000.0)
    assert phase.inner.told == [(opening.layout, 1000.0)]
    calibrate, a, b = first_wave(phase, 3)
    assert calibrate.origin == "calibrate" and calibrate.layout == opening.layout
    assert calibrate.proxy is not None and a.proxy is not None and b.proxy is not None
    assert [a.layout, b.layout] == listed[1:3]
    predicted, _ = finish(phase, calibrate, 1.0)
    assert phase.correction == pytest.approx(1000.0 / predicted.objective)
    assert len(phase.inner.told) == 1  # the opening's calibration is no news to it
    finish(phase, a, 1.25)  # the same global batch, slower than the opening
    assert phase.ask(1) == []  # the first wave is not all in
    return phase, finish(phase, b, b_step)[0]


def test_the_first_pick_runs_at_full_scale_and_proxies_must_beat_it_by_their_error():
    phase, b = opened(b_step=1.25)
    assert b.objective == pytest.approx(800.0, rel=0.01)  # corrected by the calibration
    c, d = phase.ask(2)  # none beats the opening: no confirmation, proxies go on together
    assert c.proxy is not None and d.proxy is not None
    phase, b = opened(b_step=0.5)
    assert b.objective == pytest.approx(2000.0, rel=0.01)
    (confirm,) = phase.ask(1)
    assert confirm.origin == "confirm" and confirm.layout == b.layout and confirm.proxy is None
    assert phase.ask(1) == []  # nothing starts beside the first confirmation
    calibrated = phase.correction
    finish(phase, confirm, b.objective)  # as the calibrated proxy predicted
    assert phase.correction == pytest.approx(calibrated)


def test_the_first_wave_starts_its_longest_proxy_first():
    space = cpu_space()
    listed = layouts(space)  # fastest predicted first, as a strategy ranks them
    phase = ProxyPhase(Listed(space, listed, n_seeds=3), budget=20, open_full_scale=False)
    wave = phase.ask(3)
    assert [p.layout for p in wave] == listed[2::-1]  # slowest first: they end together
    runs = [predicted_run_s(phase, p) for p in wave]
    assert runs[0] > runs[1] > runs[2]
    assert phase.ask(1) == []  # the wave is all started; the first confirmation waits for it


def test_a_pick_waiting_for_nodes_is_overtaken_by_smaller_ones_a_bounded_number_of_times():
    space = cpu_space(tp=[1, 4])  # 8 nodes of 1 device: a tp-4 proxy takes 4, a tp-1 one 1
    wide = [layout for layout in layouts(space) if layout.tp == 4]
    narrow = [layout for layout in layouts(space) if layout.tp == 1]
    order = [narrow[0], wide[0], narrow[1], wide[1], *narrow[2:]]
    phase = ProxyPhase(Listed(space, order, n_seeds=1), budget=30, open_full_scale=False)
    (first,) = phase.ask(1)
    measured, _ = finish(phase, first, 1.0)
    (confirm,) = phase.ask(1)
    assert confirm.origin == "confirm"
    finish(phase, confirm, measured.objective)
    held_back, small = phase.ask(2)  # 4 nodes and 1: 3 left
    assert held_back.layout == wide[0] and small.layout == narrow[1]
    overtaking = phase.ask(5)  # wide[1] waits for 4 nodes; 3 smaller ones start meanwhile
    assert [p.layout for p in overtaking] == narrow[2:5]
    finish(phase, small, 100.0)  # a node frees: a small one would fit, but wide[1] waited
    assert phase.ask(1) == []  # for as many as it may
    finish(phase, held_back, 100.0)
    (waited,) = phase.ask(1)
    assert waited.layout == wide[1] and waited.proxy is not None and waited.proxy.nodes == 4


def test_runs_take_a_start_up_and_a_multiple_of_their_predicted_step():
    assert expected_run_s([(1.0, 310.0)], 2.0) is None  # one run cannot tell the two apart
    assert expected_run_s([(1.0, 310.0), (2.0, 320.0)], 3.0) == pytest.approx(330.0)
    assert expected_run_s([(1.0, 300.0), (1.0, 500.0)], 2.0) == pytest.approx(800.0)
    assert expected_run_s([(1.0, 500.0), (2.0, 300.0)], 4.0) == pytest.approx(400.0)  # no slope


def test_while_the_first_wave_drains_a_proxy_starts_only_if_expected_to_end_before_it():
    space = cpu_space()
    listed = layouts(space)  # predicted steps grow down the list: 0 and 1 ~0.095 s, 8 ~0.49 s
    order = [listed[8], listed[0], *listed[1:8]]
    now = [0.0]

    def wave(clocked: bool = True) -> ProxyPhase:
        phase = ProxyPhase(Listed(space, order, n_seeds=3), budget=20, open_full_scale=False)
        if clocked:
            phase.place(Placement(clock=lambda: now[0]))
        now[0] = 0.0
        slow, *fast = phase.ask(3)
        assert slow.layout == listed[8]
        for proposal in sorted(fast, key=lambda p: predicted_run_s(phase, p)):
            now[0] = 1000 * predicted_run_s(phase, proposal)  # runs take 1000 predicted steps
            finish(phase, proposal, 1.0)
        return phase

    phase = wave()  # at 96.5 s: the slow proxy is expected to end at 486.5 s
    (fill,) = phase.ask(1)
    assert fill.layout == listed[2] and fill.proxy is not None  # 124 s (x1.2) fits
    (fill,) = phase.ask(1)
    assert fill.layout == listed[3]  # 187 s
    now[0] = 400.0
    assert phase.ask(1) == []  # nothing left ends in time: the first confirmation waits
    assert wave(clocked=False).ask(1) == []  # driven by hand: no clock, no expected ends


def test_proposals_run_as_the_smallest_proxy_that_fits():
    space = cpu_space()
    phase = ProxyPhase(Listed(space, layouts(space)), budget=10, open_full_scale=False)
    first = phase.ask(1)[0]
    assert first.proxy is not None and first.proxy.dp == 1 and first.proxy.nodes == 1
    assert first.layout.dp == 8 and first.origin == "listed"
    zero = cpu_space(zero_stage=1)
    proposal = ProxyPhase(Listed(zero, layouts(zero)), budget=10, open_full_scale=False).ask(1)[0]
    assert proposal.proxy is not None and proposal.proxy.dp == 2  # ZeRO shards over >= 2


def test_the_first_wave_is_confirmed_when_all_in_then_only_a_likely_gain():
    space = cpu_space()
    phase = ProxyPhase(
        Listed(space, layouts(space), n_seeds=2), budget=20, margin=0.05, open_full_scale=False
    )
    a, b = first_wave(phase, 2)
    finish(phase, b, 1.0)
    assert phase.ask(1) == []  # no later proxy holds the first confirmation back
    slow, _ = finish(phase, a, 0.5)
    (confirm,) = phase.ask(1)
    assert confirm.origin == "confirm" and confirm.proxy is None and confirm.layout == a.layout
    assert phase.ask(1) == []  # it holds the allocation
    finish(phase, confirm, slow.objective)  # the proxy predicted it right
    assert phase.correction == pytest.approx(1.0)
    c, d = phase.ask(2)
    assert c.proxy is not None and d.proxy is not None
    finish(phase, c, 0.6)  # 17% slower: even two spreads up (19%) are within the margin
    (e,) = phase.ask(1)
    assert e.proxy is not None
    finish(phase, d, 0.25)  # twice as fast: confirmed next
    (again,) = phase.ask(1)
    assert again.origin == "confirm" and again.layout == d.layout
    assert phase.ask(1) == []  # it holds every node
    finish(phase, e, 1.0)
    finish(phase, again, 2 * slow.objective)
    (f,) = phase.ask(1)
    assert f.proxy is not None  # proxies go on after a later confirmation


def test_the_last_trial_of_the_budget_is_a_confirmation():
    space = cpu_space()
    phase = ProxyPhase(Listed(space, layouts(space), n_seeds=4), budget=3)  # too few to open
    a, b = phase.ask(2)
    assert phase.ask(1) == []  # the reserved trial waits for what the proxies find
    finish(phase, b, 1.0)
    assert phase.ask(1) == []  # for all of it
    finish(phase, a, 2.0)
    (last,) = phase.ask(1)
    assert last.origin == "confirm" and last.layout == b.layout and last.proxy is None


@pytest.mark.parametrize("below", [0.05, 0.3])
def test_the_last_trial_confirms_a_proxy_within_two_spreads_of_the_best(below: float):
    space = cpu_space()
    phase = ProxyPhase(Listed(space, layouts(space), n_seeds=1), budget=4, open_full_scale=False)
    (a,) = phase.ask(1)
    measured, _ = finish(phase, a, 1.0)
    (confirm,) = phase.ask(1)
    finish(phase, confirm, measured.objective)  # as predicted: the spread is the 5% prior
    (b,) = phase.ask(1)
    tokens = b.layout.dp * b.layout.mbs * b.layout.gas * space.model.seq_length
    record, _ = finish(phase, b, tokens / ((1 - below) * measured.objective))
    assert record.objective == pytest.approx((1 - below) * measured.objective, rel=0.02)
    (last,) = phase.ask(1)
    if below < 0.1:  # within exp(2 x 5%): the last chance to confirm it
        assert last.origin == "confirm" and last.layout == b.layout
    else:  # far below: a full-scale trial would buy nothing
        assert last.proxy is not None


def test_a_proxy_oom_condemns_the_layout_only_when_nothing_is_sharded():
    plain = cpu_space()
    phase = ProxyPhase(Listed(plain, layouts(plain)), budget=10, open_full_scale=False)
    (proxy,) = phase.ask(1)
    record, result = finish(phase, proxy, 0.0, ok=False)
    assert record.state is TrialState.OOM and "would not fit either" in (result.error or "")
    assert phase.inner.told == [(proxy.layout, "F_oom")]
    assert phase.ask(1)[0].layout != proxy.layout  # not measured again
    sharded = cpu_space(zero_stage=1)
    phase = ProxyPhase(Listed(sharded, layouts(sharded)), budget=10, open_full_scale=False)
    (proxy,) = phase.ask(1)
    _, result = finish(phase, proxy, 0.0, ok=False)
    assert "measured again larger" in (result.error or "")
    assert phase.inner.told == []  # the smaller shard may be why: no verdict
    (retry,) = phase.ask(1)
    assert retry.origin == "retry" and retry.layout == proxy.layout
    assert retry.proxy is not None and proxy.proxy is not None
    assert retry.proxy.dp > proxy.proxy.dp


def test_confirmations_teach_the_correction_that_later_proxies_carry():
    space = cpu_space()
    phase = ProxyPhase(Listed(space, layouts(space), n_seeds=1), budget=20, open_full_scale=False)
    (a,) = phase.ask(1)
    first, _ = finish(phase, a, 1.0)
    (confirm,) = phase.ask(1)
    assert confirm.origin == "confirm"
    finish(phase, confirm, 2 * first.objective)  # the machine is twice what the proxy says
    assert phase.correction == pytest.approx(2.0)
    (b,) = phase.ask(1)
    second, _ = finish(phase, b, 1.0)
    assert b.layout.mbs * b.layout.gas == a.layout.mbs * a.layout.gas  # the same batch
    assert second.objective == pytest.approx(2 * first.objective, rel=0.01)
    assert second.metrics["fidelity"]["correction"] == pytest.approx(2.0)
    assert second.metrics["fidelity"]["measured"]["step_time_s"] == 1.0
    assert second.metrics["step_time_s"] == pytest.approx(0.5, rel=0.01)


def test_a_replay_decides_as_the_interrupted_campaign_would():
    space = cpu_space()
    live = ProxyPhase(Listed(space, layouts(space), n_seeds=2), budget=12)
    (opening,) = live.ask(1)
    history: list[Record] = [finish(live, opening, 1.0)[0]]
    calibrate, *proxies = first_wave(live, 3)
    history.append(finish(live, calibrate, 1.0)[0])
    calibrated = live.correction  # the opening's figure over its proxy's prediction
    for proposal, step in zip(proxies, (2.0, 0.1), strict=True):
        history.append(finish(live, proposal, step)[0])
    (confirm,) = live.ask(1)
    assert confirm.origin == "confirm" and confirm.layout == history[3].layout
    history.append(finish(live, confirm, 3 * history[3].objective)[0])
    running, _ = live.ask(2)  # left queued by a killed driver, and one finished
    history.append(Record(running.layout, running.proxy.dp if running.proxy else None))
    history.append(finish(live, _, 0.7)[0])
    resumed = ProxyPhase(Listed(space, layouts(space), n_seeds=2))
    resumed.start(history, budget=12)
    assert resumed.correction == pytest.approx(live.correction)
    # The confirmation measured 3x its (calibrated) prediction: the geometric mean of both.
    assert live.correction == pytest.approx(calibrated * 3**0.5)
    assert [(p.layout, p.origin, p.proxy) for p in resumed.ask(3)] == [
        (p.layout, p.origin, p.proxy) for p in live.ask(3)
    ]


def test_a_proxy_oom_with_no_larger_proxy_left_waits_for_full_scale_where_it_may_fit():
    space = cpu_space(zero_stage=1)  # dp 8: proxies at dp 2 and 4, ZeRO-1 holds more there
    listed = layouts(space)
    phase = ProxyPhase(Listed(space, listed, n_seeds=1), budget=10, open_full_scale=False)
    (proxy,) = phase.ask(1)
    assert proxy.proxy is not None and proxy.proxy.dp == 2
    finish(phase, proxy, 0.0, ok=False)
    (retry,) = phase.ask(1)
    assert retry.origin == "retry" and retry.proxy is not None and retry.proxy.dp == 4
    finish(phase, retry, 0.0, ok=False)  # no proxy left between it and full scale
    assert phase.inner.told == []  # not told it ran out: full scale holds less per rank
    (full,) = phase.ask(1)  # nothing confirmed yet: the estimate's figure is the best hope
    assert full.origin == "confirm" and full.layout == proxy.layout and full.proxy is None
    finish(phase, full, 1000.0)
    assert phase.inner.told == [(proxy.layout, 1000.0)]  # what full scale measured


def test_proxies_are_sized_by_what_runs_needed_over_the_estimate():
    space = cpu_space(zero_stage=1)
    listed = layouts(space)
    phase = ProxyPhase(Listed(space, listed, n_seeds=1), budget=10, open_full_scale=False)
    (proxy,) = phase.ask(1)
    assert phase.memory_ratio == 1.0
    assert proxy.proxy is not None
    run = predict_run(space.model, proxy.proxy.proxy_layout, space.allocation, space.estimate)
    finish(phase, proxy, 0.0, ok=False)  # it needed more than the device
    assert phase.memory_ratio == pytest.approx(space.memory_limit_bytes / run.peak_mem_bytes)
    (retry,) = phase.ask(1)
    assert retry.proxy is not None and retry.proxy.dp > proxy.proxy.dp
    retried = predict_run(space.model, retry.proxy.proxy_layout, space.allocation, space.estimate)
    assert retried.peak_mem_bytes * phase.memory_ratio <= space.memory_limit_bytes


class Settling(Listed):
    """A wrapped strategy that expects nothing untried to beat the best (``--settle``)."""

    @property
    def settled(self) -> bool:
        return True


def test_settle_does_not_stop_while_a_proxy_may_still_beat_the_best():
    space = cpu_space()
    listed = layouts(space)[:3]
    phase = ProxyPhase(
        Settling(space, listed, n_seeds=2), budget=20, margin=0.05, open_full_scale=False
    )
    a, b = first_wave(phase, 2)
    best, _ = finish(phase, a, 1.0)
    tokens = b.layout.dp * b.layout.mbs * b.layout.gas * space.model.seq_length
    close, _ = finish(phase, b, tokens / (0.86 * best.objective))  # 14% below a's
    (confirm,) = phase.ask(1)
    assert confirm.origin == "confirm" and confirm.layout == a.layout
    finish(phase, confirm, best.objective)
    (c,) = phase.ask(1)  # b, two spreads up (19%), is within the margin: proxies go on
    assert c.proxy is not None and c.layout == listed[2]
    finish(phase, c, 10.0)  # far slower; the wrapped strategy has nothing left
    assert not phase.settled  # b may beat a within two spreads
    (last,) = phase.ask(1)
    assert last.origin == "confirm" and last.layout == close.layout
    assert phase.ask(1) == []
    finish(phase, last, 0.86 * best.objective)
    assert phase.ask(1) == [] and phase.settled


def test_a_confirmation_out_of_memory_is_told_to_the_wrapped_strategy():
    space = cpu_space()
    phase = ProxyPhase(Listed(space, layouts(space), n_seeds=1), budget=10, open_full_scale=False)
    (a,) = phase.ask(1)
    measured, _ = finish(phase, a, 1.0)
    (confirm,) = phase.ask(1)
    assert confirm.origin == "confirm"
    finish(phase, confirm, 0.0, ok=False)  # the proxy fitted; full scale did not
    assert phase.inner.told == [(a.layout, measured.objective), (a.layout, "F_oom")]


def test_an_opening_out_of_memory_is_followed_by_the_next_pick_at_full_scale():
    space = cpu_space()
    listed = layouts(space)
    phase = ProxyPhase(Listed(space, listed, n_seeds=2), budget=20)
    (opening,) = phase.ask(1)
    finish(phase, opening, 0.0, ok=False)  # no bar, nothing to calibrate by
    (again,) = phase.ask(1)
    assert again.proxy is None and again.layout == listed[1]
    assert phase.ask(1) == []  # it holds the allocation, and sets the bar
    finish(phase, again, 1000.0)
    calibrate, a, b = first_wave(phase, 3)
    assert calibrate.origin == "calibrate" and calibrate.layout == again.layout
    assert [a.layout, b.layout] == listed[2:4]
