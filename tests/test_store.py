"""The store's contract, run against an SQLite file, an in-memory SQLite store and a PostgreSQL
store (as optuna's storage tests run against every backend)."""

from __future__ import annotations

import inspect
import math
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from parsearch.config import ParallelLayout
from parsearch.errors import CampaignLockedError, StoreError
from parsearch.result import TrialResult, TrialState
from parsearch.store import Campaign, CampaignStatus, SQLiteStore, Store, TrialRecord, open_store

GIB = 2**30


# Every implementation of the Store protocol, by name, opened from the test's request; a new
# one is added here and the whole contract below runs against it.
IMPLEMENTATIONS: dict[str, Callable[[pytest.FixtureRequest], Store]] = {
    "sqlite-file": lambda request: SQLiteStore(request.getfixturevalue("tmp_path") / "store.db"),
    "sqlite-memory": lambda request: SQLiteStore(":memory:"),
    "postgresql": lambda request: open_store(request.getfixturevalue("postgres_url")),
}
# The parameters: the PostgreSQL one is the ``postgres`` tier (a server of its own).
STORES = [
    pytest.param(name, marks=[pytest.mark.postgres] if name == "postgresql" else [])
    for name in sorted(IMPLEMENTATIONS)
]


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    opened = IMPLEMENTATIONS[request.param](request)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def campaign(store: Store) -> Campaign:
    return store.create_campaign("c1", {"model": {"name": "tiny"}}, seed=3, budget=50)


def layout(tp: int = 1, pp: int = 1, dp: int = 8, mbs: int = 1, gas: int = 4) -> ParallelLayout:
    return ParallelLayout(tp=tp, pp=pp, dp=dp, mbs=mbs, gas=gas)


def run(
    store: Store,
    campaign_id: int,
    trial_layout: ParallelLayout,
    *,
    tokens: float | None = None,
    mem: float | None = None,
    state: TrialState = TrialState.OK,
) -> TrialRecord:
    """Add a trial and take it through running to ``state``."""
    trial = store.add_trial(campaign_id, trial_layout)
    store.mark_running(trial.id, ["node0"], 1)
    metrics = {k: v for k, v in (("tokens_per_s", tokens), ("peak_mem_bytes", mem)) if v}
    objective = tokens if state is TrialState.OK else None
    return store.finish_trial(trial.id, TrialResult(state, metrics), objective)


# -- campaigns ----------------------------------------------------------------------------------


def test_campaign_round_trips(store: Store) -> None:
    space = {"model": {"layers": 4}, "ranges": {"tp": [1, 2]}}
    created = store.create_campaign(
        "c1",
        space,
        space_path="spaces/tiny.yaml",
        seed=7,
        budget=20,
        backend="simulate",
        settings={"parallel_trials": 2},
        objective_metric="tflops_per_device",
    )
    assert created == store.get_campaign("c1")
    assert (created.space, created.space_path, created.seed) == (space, "spaces/tiny.yaml", 7)
    assert (created.budget, created.backend, created.settings) == (
        20,
        "simulate",
        # Settings without a backend read back with the campaign's (a resume never falls
        # back to another backend's default).
        {"parallel_trials": 2, "backend": "simulate"},
    )
    assert created.objective_metric == "tflops_per_device"
    assert created.status is CampaignStatus.CREATED and created.finished_at is None
    assert {"parsearch", "python", "sqlite", "store_schema"} <= set(created.versions)


def test_duplicate_campaign_name_points_to_resume(store: Store, campaign: Campaign) -> None:
    with pytest.raises(StoreError, match=r"'c1' already exists.*parsearch resume"):
        store.create_campaign("c1", {})


def test_get_campaign_without_a_name_is_the_latest(store: Store) -> None:
    with pytest.raises(StoreError, match=r"no campaign yet.*parsearch run"):
        store.get_campaign()
    store.create_campaign("first", {})
    store.create_campaign("second", {})
    assert store.get_campaign().name == "second"
    assert [c.name for c in store.list_campaigns()] == ["first", "second"]


def test_unknown_campaign_lists_the_names(store: Store, campaign: Campaign) -> None:
    with pytest.raises(StoreError, match=r"no campaign 'nope'.*\['c1'\]"):
        store.get_campaign("nope")


def test_update_campaign(store: Store, campaign: Campaign) -> None:
    done = store.update_campaign(campaign.id, status="finished", finished_at=123.0, budget=80)
    assert (done.status, done.finished_at, done.budget) == (CampaignStatus.FINISHED, 123.0, 80)
    resumed = store.update_campaign(campaign.id, status=CampaignStatus.RUNNING, finished_at=None)
    assert (resumed.status, resumed.finished_at, resumed.budget) == ("running", None, 80)
    with pytest.raises(StoreError, match=r"'done' is not one of \['created', 'running'"):
        store.update_campaign(campaign.id, status="done")
    with pytest.raises(StoreError, match="no campaign with id 99"):
        store.update_campaign(99, budget=1)


# -- trials -------------------------------------------------------------------------------------


def test_trials_are_numbered_per_campaign(store: Store, campaign: Campaign) -> None:
    other = store.create_campaign("c2", {})
    numbers = [store.add_trial(campaign.id, layout(gas=g)).number for g in (1, 2, 4)]
    assert numbers == [0, 1, 2]
    assert store.add_trial(other.id, layout(gas=1)).number == 0


def test_a_layout_is_recorded_once_per_campaign(store: Store, campaign: Campaign) -> None:
    first = store.add_trial(campaign.id, layout(tp=2, dp=4))
    assert store.has_key(campaign.id, layout(tp=2, dp=4).key())
    assert not store.has_key(campaign.id, layout().key())
    with pytest.raises(StoreError, match=r"tp2 pp1 dp4 mbs1 gas4 is already trial #0 \(queued\)"):
        store.add_trial(campaign.id, layout(tp=2, dp=4))
    other = store.create_campaign("c2", {})
    assert store.add_trial(other.id, layout(tp=2, dp=4)).key == first.key


def test_add_trial_to_a_missing_campaign(store: Store) -> None:
    with pytest.raises(StoreError, match="no campaign with id 5"):
        store.add_trial(5, layout())


def test_trial_lifecycle(store: Store, campaign: Campaign) -> None:
    predicted = {"step_time_s": 1.5, "peak_mem_bytes": 10 * GIB}
    trial = store.add_trial(campaign.id, layout(pp=2, dp=4), predicted=predicted, origin="initial")
    assert (trial.state, trial.attempt, trial.origin, trial.predicted) == (
        TrialState.QUEUED,
        0,
        "initial",
        predicted,
    )
    assert trial.layout == layout(pp=2, dp=4)
    running = store.mark_running(trial.id, ["node0", "node1"], attempt=1)
    assert (running.state, running.hosts, running.attempt) == (
        TrialState.RUNNING,
        ["node0", "node1"],
        1,
    )
    assert running.started_at is not None and running.finished_at is None

    metrics = {"tokens_per_s": 1234.5, "peak_mem_bytes": 12 * GIB, "mfu": 0.41, "per_rank": [1, 2]}
    result = TrialResult(TrialState.OK, metrics, log_tail="step 10", duration_s=42.0)
    done = store.finish_trial(trial.id, result, objective=1234.5)
    assert done == store.get_trial(trial.id)
    assert (done.state, done.metrics, done.objective) == (TrialState.OK, metrics, 1234.5)
    assert (done.tokens_per_s, done.peak_mem_bytes) == (1234.5, 12 * GIB)
    assert (done.duration_s, done.log_tail, done.hosts) == (42.0, "step 10", ["node0", "node1"])
    assert done.finished_at >= done.started_at >= done.created_at


def test_failed_trial(store: Store, campaign: Campaign) -> None:
    trial = store.add_trial(campaign.id, layout())
    store.mark_running(trial.id, ["node0"], 1)
    oom = TrialResult(TrialState.OOM, {"peak_mem_bytes": 80 * GIB}, error="CUDA out of memory")
    with pytest.raises(StoreError, match="finished oom, so it has no objective"):
        store.finish_trial(trial.id, oom, objective=5.0)
    done = store.finish_trial(trial.id, oom, objective=None)
    assert (done.state, done.objective, done.error) == (TrialState.OOM, None, "CUDA out of memory")
    assert done.peak_mem_bytes == 80 * GIB


def test_trial_judged_without_running(store: Store, campaign: Campaign) -> None:
    trial = store.add_trial(campaign.id, layout(), state=TrialState.INFEASIBLE, origin="estimate")
    assert trial.state is TrialState.INFEASIBLE and trial.finished_at is not None
    with pytest.raises(StoreError, match="a new trial is queued or already finished"):
        store.add_trial(campaign.id, layout(dp=4, tp=2), state=TrialState.RUNNING)


@pytest.mark.parametrize(
    ("before", "move", "message"),
    [
        ("running", "start", "cannot start .* it is running, and must be queued"),
        ("ok", "start", "cannot start .* it is ok"),
        ("ok", "finish", "cannot finish .* it is ok, and must be queued or running"),
        ("queued", "requeue", "cannot re-queue .* it is queued, and must be interrupted"),
        ("ok", "requeue", "cannot re-queue .* it is ok"),
    ],
)
def test_illegal_moves_are_refused(
    store: Store, campaign: Campaign, before: str, move: str, message: str
) -> None:
    trial = store.add_trial(campaign.id, layout())
    if before != "queued":
        store.mark_running(trial.id, ["node0"], 1)
    if before == "ok":
        store.finish_trial(trial.id, TrialResult(TrialState.OK, {"tokens_per_s": 1.0}), 1.0)
    actions = {
        "start": lambda: store.mark_running(trial.id, ["node1"], 2),
        "finish": lambda: store.finish_trial(trial.id, TrialResult(TrialState.ERROR), None),
        "requeue": lambda: store.requeue(trial.id),
    }
    with pytest.raises(StoreError, match=message):
        actions[move]()
    assert store.get_trial(trial.id).state.value == before


@pytest.mark.parametrize("status", [TrialState.QUEUED, TrialState.RUNNING])
def test_a_result_is_an_outcome(store: Store, campaign: Campaign, status: TrialState) -> None:
    trial = store.add_trial(campaign.id, layout())
    with pytest.raises(StoreError, match=f"cannot finish as '{status.value}'"):
        store.finish_trial(trial.id, TrialResult(status), None)


def test_unknown_trial(store: Store) -> None:
    with pytest.raises(StoreError, match="no trial with id 42"):
        store.get_trial(42)


def test_interrupt_and_requeue(store: Store, campaign: Campaign) -> None:
    running = [store.add_trial(campaign.id, layout(gas=g)) for g in (1, 2)]
    for trial in running:
        store.mark_running(trial.id, ["node0"], 1)
    queued = store.add_trial(campaign.id, layout(gas=8))
    finished = run(store, campaign.id, layout(gas=16), tokens=10.0)

    assert store.mark_interrupted(campaign.id) == 3
    assert store.counts(campaign.id)[TrialState.INTERRUPTED] == 3
    assert store.get_trial(finished.id).state is TrialState.OK
    assert store.get_trial(queued.id).state is TrialState.INTERRUPTED

    again = store.requeue(running[0].id)
    assert (again.state, again.attempt, again.started_at, again.metrics) == ("queued", 1, None, {})
    assert store.mark_running(again.id, ["node3"], attempt=2).attempt == 2
    assert store.mark_interrupted(campaign.id) == 1


def test_result_of_a_drained_trial(store: Store, campaign: Campaign) -> None:
    trial = store.add_trial(campaign.id, layout())
    store.mark_running(trial.id, ["node0"], 1)
    drained = TrialResult(TrialState.INTERRUPTED, {"steps_done": 3}, log_tail="SIGTERM")
    interrupted = store.finish_trial(trial.id, drained, None)
    assert (interrupted.state, interrupted.log_tail) == (TrialState.INTERRUPTED, "SIGTERM")
    requeued = store.requeue(trial.id)
    assert (requeued.state, requeued.log_tail, requeued.finished_at) == ("queued", "", None)


def test_hosts_of_a_result_replace_those_of_the_dispatch(store: Store, campaign: Campaign) -> None:
    first, second = (store.add_trial(campaign.id, layout(gas=g)) for g in (1, 2))
    for trial in (first, second):
        store.mark_running(trial.id, ["node0"], 1)
    kept = store.finish_trial(first.id, TrialResult(TrialState.ERROR), None)
    replaced = store.finish_trial(second.id, TrialResult(TrialState.ERROR, hosts=["n7"]), None)
    assert (kept.hosts, replaced.hosts) == (["node0"], ["n7"])


def test_numpy_and_nan_metrics(store: Store, campaign: Campaign) -> None:
    trial = store.add_trial(campaign.id, layout())
    metrics = {
        "tokens_per_s": np.float64("nan"),
        "peak_mem_bytes": np.int64(3),
        "per_rank": np.ones(2),
    }
    done = store.finish_trial(trial.id, TrialResult(TrialState.OK, metrics), None)
    assert math.isnan(done.metrics["tokens_per_s"])
    assert (done.metrics["peak_mem_bytes"], done.metrics["per_rank"]) == (3, [1.0, 1.0])
    assert (done.tokens_per_s, done.peak_mem_bytes) == (None, 3.0)


def test_unstorable_metrics_are_a_store_error(store: Store, campaign: Campaign) -> None:
    trial = store.add_trial(campaign.id, layout())
    result = TrialResult(TrialState.OK, {"handle": object()})
    with pytest.raises(StoreError, match=f"cannot store the metrics of trial {trial.id}"):
        store.finish_trial(trial.id, result, None)
    assert store.get_trial(trial.id).state is TrialState.QUEUED


def test_trials_and_counts(store: Store, campaign: Campaign) -> None:
    run(store, campaign.id, layout(gas=1), tokens=5.0)
    run(store, campaign.id, layout(gas=2), state=TrialState.OOM)
    store.add_trial(campaign.id, layout(gas=4))
    assert [t.number for t in store.trials(campaign.id)] == [0, 1, 2]
    states = [TrialState.OK, TrialState.QUEUED]
    assert [t.number for t in store.trials(campaign.id, states=states)] == [0, 2]
    assert store.trials(campaign.id, states=[]) == []
    counts = store.counts(campaign.id)
    assert set(counts) == set(TrialState)
    assert (counts[TrialState.OK], counts[TrialState.OOM], counts[TrialState.QUEUED]) == (1, 1, 1)
    assert counts[TrialState.RUNNING] == 0


def test_concurrent_threads_share_one_store(store: Store, campaign: Campaign) -> None:
    def add(gas: int) -> None:
        for mbs in range(1, 26):
            store.add_trial(campaign.id, layout(mbs=mbs, gas=gas))

    threads = [threading.Thread(target=add, args=(gas,)) for gas in (1, 2, 4, 8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [t.number for t in store.trials(campaign.id)] == list(range(100))


# -- lease --------------------------------------------------------------------------------------


def test_a_second_driver_is_refused(store: Store, campaign: Campaign) -> None:
    store.acquire_lease(campaign.id, "driver-a", stale_after_s=60)
    store.acquire_lease(campaign.id, "driver-a", stale_after_s=60)  # renewing is fine
    with pytest.raises(
        CampaignLockedError, match=r"'c1' is being run by .* \(pid \d+, owner driver-a\) since"
    ):
        store.acquire_lease(campaign.id, "driver-b", stale_after_s=60)
    store.heartbeat(campaign.id, "driver-a")
    store.release_lease(campaign.id, "driver-b")  # not the holder: nothing happens
    with pytest.raises(CampaignLockedError):
        store.acquire_lease(campaign.id, "driver-b", stale_after_s=60)
    store.release_lease(campaign.id, "driver-a")
    store.release_lease(campaign.id, "driver-a")
    store.acquire_lease(campaign.id, "driver-b", stale_after_s=60)


def test_a_stale_lease_is_taken_over(
    store: Store, campaign: Campaign, caplog: pytest.LogCaptureFixture
) -> None:
    store.acquire_lease(campaign.id, "dead", stale_after_s=0.05)
    time.sleep(0.1)
    store.acquire_lease(campaign.id, "alive", stale_after_s=0.05)
    assert "taking over campaign 'c1' from driver dead" in caplog.text
    with pytest.raises(CampaignLockedError, match=r"dead no longer holds .* driver alive on"):
        store.heartbeat(campaign.id, "dead")
    store.heartbeat(campaign.id, "alive")


def test_heartbeat_without_a_lease(store: Store, campaign: Campaign) -> None:
    with pytest.raises(CampaignLockedError, match="nobody holds it"):
        store.heartbeat(campaign.id, "driver-a")
    with pytest.raises(StoreError, match="no campaign with id 9"):
        store.acquire_lease(9, "driver-a", stale_after_s=60)


# -- queries ------------------------------------------------------------------------------------


def test_best_and_top(store: Store, campaign: Campaign) -> None:
    assert store.best(campaign.id) is None
    fast_big = run(store, campaign.id, layout(gas=1), tokens=300.0, mem=70 * GIB)
    mid = run(store, campaign.id, layout(gas=2), tokens=200.0, mem=30 * GIB)
    run(store, campaign.id, layout(gas=4), tokens=100.0, mem=20 * GIB)
    unmeasured = run(store, campaign.id, layout(gas=8), tokens=250.0)
    run(store, campaign.id, layout(gas=16), state=TrialState.OOM, mem=90 * GIB)
    store.add_trial(campaign.id, layout(gas=32))

    assert store.best(campaign.id) == fast_big
    assert store.best(campaign.id, max_mem_bytes=40 * GIB) == mid
    assert store.best(campaign.id, max_mem_bytes=1 * GIB) is None
    assert [t.objective for t in store.top(campaign.id, 3)] == [300.0, 250.0, 200.0]
    assert unmeasured not in store.top(campaign.id, 10, max_mem_bytes=80 * GIB)
    assert len(store.top(campaign.id, 10)) == 4


def test_ties_go_to_less_memory(store: Store, campaign: Campaign) -> None:
    run(store, campaign.id, layout(gas=1), tokens=100.0, mem=50 * GIB)
    lean = run(store, campaign.id, layout(gas=2), tokens=100.0, mem=40 * GIB)
    assert store.best(campaign.id) == lean


def test_pareto_front(store: Store, campaign: Campaign) -> None:
    points = {  # gas: (objective, peak memory GiB)
        1: (100.0, 10),  # front: least memory
        2: (90.0, 20),  # dominated by 1
        3: (150.0, 20),  # front
        4: (150.0, 20),  # same figures as 3: neither dominates, both on the front
        5: (140.0, 20),  # same memory as 3, lower objective: dominated
        6: (150.0, 30),  # dominated by 3 (same objective, more memory)
        7: (300.0, 60),  # front: the fastest
        8: (999.0, None),  # no memory measured: left out
    }
    trials = {
        gas: run(store, campaign.id, layout(gas=gas), tokens=obj, mem=mem and mem * GIB)
        for gas, (obj, mem) in points.items()
    }
    run(store, campaign.id, layout(gas=9), state=TrialState.OOM, mem=5 * GIB)
    front = store.pareto(campaign.id)
    assert [t.id for t in front] == [trials[g].id for g in (1, 3, 4, 7)]


def test_pareto_of_nothing(store: Store, campaign: Campaign) -> None:
    assert store.pareto(campaign.id) == []


def test_dataframe(store: Store, campaign: Campaign) -> None:
    trial = store.add_trial(campaign.id, layout(tp=2, dp=4), predicted={"step_time_s": 2.0})
    store.mark_running(trial.id, ["n0", "n1"], 1)
    metrics = {"tokens_per_s": 10.0, "state": "warm", "loss": {"first": 9.1}, "per_rank": [1, 2]}
    store.finish_trial(trial.id, TrialResult(TrialState.OK, metrics), 10.0)
    store.add_trial(campaign.id, layout(gas=2))

    frame = store.dataframe(campaign.id)
    assert len(frame) == 2
    first = frame.iloc[0]
    assert (first["tp"], first["dp"], first["recompute"], first["state"]) == (2, 4, "none", "ok")
    assert (first["objective"], first["tokens_per_s"], first["hosts"]) == (10.0, 10.0, "n0,n1")
    assert (first["metric.state"], first["loss.first"], first["per_rank"]) == (
        "warm",
        9.1,
        "[1, 2]",
    )
    assert first["predicted.step_time_s"] == 2.0
    assert isinstance(first["finished_at"], pd.Timestamp)
    assert frame.iloc[1]["state"] == "queued" and pd.isna(frame.iloc[1]["objective"])


def test_dataframe_of_an_empty_campaign(store: Store, campaign: Campaign) -> None:
    frame = store.dataframe(campaign.id)
    assert frame.empty and {"tp", "pp", "dp", "objective", "state"} <= set(frame.columns)


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_export_round_trip(store: Store, campaign: Campaign, tmp_path: Path, suffix: str) -> None:
    for gas, tokens in ((1, 5.0), (2, 7.5)):
        run(store, campaign.id, layout(gas=gas), tokens=tokens, mem=gas * GIB)
    run(store, campaign.id, layout(gas=4), state=TrialState.TIMEOUT)
    store.add_trial(campaign.id, layout(gas=8))
    path = store.export(campaign.id, tmp_path / f"trials{suffix}")
    if suffix == ".csv":
        times = ["created_at", "started_at", "finished_at"]
        back = pd.read_csv(path, parse_dates=times, dtype={"key": "str"})
    else:
        back = pd.read_parquet(path)
    pd.testing.assert_frame_equal(back, store.dataframe(campaign.id), check_dtype=False)


def test_export_refuses_unknown_formats(store: Store, campaign: Campaign, tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=r"must end in one of \['.csv', '.parquet'\]"):
        store.export(campaign.id, tmp_path / "trials.xlsx")
    with pytest.raises(StoreError, match=r"cannot write .*missing"):
        store.export(campaign.id, tmp_path / "missing" / "trials.csv")


def test_open_store_gives_a_store(tmp_path: Path) -> None:
    with open_store(tmp_path / "s.db") as store:
        assert isinstance(store, Store)
        store.create_campaign("c", {})
    with open_store(tmp_path / "s.db", readonly=True) as reader:
        assert reader.readonly and reader.get_campaign().name == "c"


def test_recent_finish_times_are_the_newest_finished_oldest_first(
    store: Store, campaign: Campaign
) -> None:
    finished = [run(store, campaign.id, layout(dp=8, mbs=m), tokens=1.0) for m in range(1, 6)]
    store.add_trial(campaign.id, layout(dp=8, mbs=9))  # queued: not finished
    times = store.recent_finish_times(campaign.id, 3)
    assert times == sorted(t.finished_at for t in finished)[-3:]
    assert store.recent_finish_times(campaign.id, 50) == [t.finished_at for t in finished]


def test_implementation_has_the_protocol_signatures(store: Store) -> None:
    """Each implementation's public methods take exactly the protocol's parameters."""
    for method in [m for m in vars(Store) if not m.startswith("_") and callable(vars(Store)[m])]:
        wanted = list(inspect.signature(getattr(Store, method)).parameters)[1:]
        assert list(inspect.signature(getattr(store, method)).parameters) == wanted, method
