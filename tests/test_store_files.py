"""The store as a file: schema upgrades, bad paths, read-only readers and other processes."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from parsearch.config import ParallelLayout
from parsearch.errors import StoreError
from parsearch.result import TrialResult, TrialState
from parsearch.store import SCHEMA_VERSION, SQLiteStore
from parsearch.store.schema import MIGRATIONS

GIB = 2**30
ROOT = Path(__file__).resolve().parents[1]


def layout(gas: int) -> ParallelLayout:
    return ParallelLayout(tp=2, pp=1, dp=4, mbs=1, gas=gas)


def make_store(path: Path, ok_trials: int = 3) -> int:
    """A store with one campaign and ``ok_trials`` finished trials; the campaign's id."""
    with SQLiteStore(path) as store:
        campaign_id = store.create_campaign("c1", {}).id
        for gas in range(1, ok_trials + 1):
            trial = store.add_trial(campaign_id, layout(gas))
            metrics = {"tokens_per_s": 100.0 * gas, "peak_mem_bytes": gas * GIB}
            store.finish_trial(trial.id, TrialResult(TrialState.OK, metrics), 100.0 * gas)
    return campaign_id


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def python(code: str) -> subprocess.Popen[str]:
    """Start another Python process running ``code`` (so it has its own SQLite locks)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


# -- schema -------------------------------------------------------------------------------------


def test_migrations_are_numbered_from_one() -> None:
    assert [m.version for m in MIGRATIONS] == list(range(1, SCHEMA_VERSION + 1))


def test_a_new_store_has_the_current_schema_and_a_rollback_journal(tmp_path: Path) -> None:
    make_store(tmp_path / "s.db")
    conn = sqlite3.connect(tmp_path / "s.db")
    versions = [v for (v,) in conn.execute("SELECT version FROM schema_version ORDER BY 1")]
    assert versions == list(range(1, SCHEMA_VERSION + 1))
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    assert not (tmp_path / "s.db-wal").exists()


V1_SCHEMA = """
CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL);
CREATE TABLE campaigns (
    id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, space TEXT NOT NULL, space_path TEXT,
    seed INTEGER NOT NULL, budget INTEGER, backend TEXT NOT NULL, settings TEXT NOT NULL,
    versions TEXT NOT NULL, created_at REAL NOT NULL, finished_at REAL, status TEXT NOT NULL);
CREATE TABLE trials (
    id INTEGER PRIMARY KEY,
    campaign_id INTEGER NOT NULL REFERENCES campaigns (id) ON DELETE CASCADE,
    number INTEGER NOT NULL, key TEXT NOT NULL, config TEXT NOT NULL, state TEXT NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 0, origin TEXT NOT NULL, created_at REAL NOT NULL,
    started_at REAL, finished_at REAL, duration_s REAL, hosts TEXT NOT NULL DEFAULT '[]',
    metrics TEXT NOT NULL DEFAULT '{}', predicted TEXT, error TEXT,
    log_tail TEXT NOT NULL DEFAULT '',
    UNIQUE (campaign_id, key), UNIQUE (campaign_id, number));
CREATE INDEX trials_by_state ON trials (campaign_id, state);
CREATE TABLE leases (
    campaign_id INTEGER PRIMARY KEY REFERENCES campaigns (id) ON DELETE CASCADE,
    owner TEXT NOT NULL, host TEXT NOT NULL, pid INTEGER NOT NULL,
    acquired_at REAL NOT NULL, heartbeat_at REAL NOT NULL);
INSERT INTO schema_version VALUES (1, 1700000000.0);
"""


def make_v1_store(path: Path) -> None:
    """A store as version 1 wrote it, by hand: metrics only as JSON, no query columns."""
    conn = sqlite3.connect(path)
    conn.executescript(V1_SCHEMA)
    conn.execute(
        "INSERT INTO campaigns VALUES (1, 'old', '{\"model\": \"gpt\"}', 'old.yaml', 4, 30, "
        "'local', ?, '{\"parsearch\": \"0.0.1\"}', 1700000000.0, NULL, 'stopped')",
        (json.dumps({"objective_metric": "tflops_per_device", "parallel_trials": 2}),),
    )
    trials = [  # number, gas, state, metrics
        (0, 1, "ok", {"tflops_per_device": 50.0, "tokens_per_s": 900.0, "peak_mem_bytes": 9e9}),
        (1, 2, "ok", {"tflops_per_device": 70.0, "tokens_per_s": 800.0, "peak_mem_bytes": 8e9}),
        (2, 4, "oom", {"peak_mem_bytes": 9.9e10}),
        (3, 8, "queued", {}),
    ]
    for number, gas, state, metrics in trials:
        trial_layout = layout(gas)
        conn.execute(
            "INSERT INTO trials (campaign_id, number, key, config, state, attempt, origin, "
            "created_at, hosts, metrics, log_tail) VALUES (1, ?, ?, ?, ?, 1, 'initial', "
            "1700000001.0, '[\"n0\"]', ?, 'tail')",
            (
                number,
                trial_layout.key(),
                json.dumps(trial_layout.to_dict()),
                state,
                json.dumps(metrics),
            ),
        )
    conn.commit()
    conn.close()


def test_a_version_1_store_is_upgraded_with_its_data(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    make_v1_store(path)
    with SQLiteStore(path) as store:
        campaign = store.get_campaign("old")
        assert campaign.objective_metric == "tflops_per_device"
        assert (campaign.space, campaign.budget, campaign.status) == (
            {"model": "gpt"},
            30,
            "stopped",
        )
        trials = store.trials(campaign.id)
        assert [(t.number, t.state.value) for t in trials] == [
            (0, "ok"),
            (1, "ok"),
            (2, "oom"),
            (3, "queued"),
        ]
        assert [t.layout for t in trials] == [layout(g) for g in (1, 2, 4, 8)]
        assert [t.objective for t in trials] == [50.0, 70.0, None, None]
        assert [t.tokens_per_s for t in trials] == [900.0, 800.0, None, None]
        assert [t.peak_mem_bytes for t in trials] == [9e9, 8e9, 9.9e10, None]
        assert (trials[0].hosts, trials[0].log_tail, trials[0].origin) == (
            ["n0"],
            "tail",
            "initial",
        )
        assert store.best(campaign.id).number == 1
        assert store.best(campaign.id, max_mem_bytes=8.5e9).number == 1
        # The upgraded store keeps working: a layout is still recorded once.
        with pytest.raises(StoreError, match="already trial #3"):
            store.add_trial(campaign.id, layout(8))
        assert store.add_trial(campaign.id, layout(16)).number == 4
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT MAX(version) FROM schema_version").fetchone() == (SCHEMA_VERSION,)
    indexes = {n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert {"trials_by_objective", "trials_by_memory"} <= indexes
    assert "trials_by_state" not in indexes


def test_read_only_commands_do_not_upgrade(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    make_v1_store(path)
    before = digest(path)
    needs = rf"schema version 1 .* needs {SCHEMA_VERSION}.*parsearch resume"
    with pytest.raises(StoreError, match=needs):
        SQLiteStore(path, readonly=True)
    assert digest(path) == before


@pytest.mark.parametrize("readonly", [False, True])
def test_a_newer_store_is_refused(tmp_path: Path, readonly: bool) -> None:
    path = tmp_path / "s.db"
    make_store(path)
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO schema_version VALUES (?, 0)", (SCHEMA_VERSION + 7,))
    with pytest.raises(
        StoreError, match=rf"schema version {SCHEMA_VERSION + 7}.*upgrade parsearch"
    ):
        SQLiteStore(path, readonly=readonly)


# -- bad files and paths ------------------------------------------------------------------------


@pytest.mark.parametrize("readonly", [False, True])
def test_a_file_that_is_not_a_database(tmp_path: Path, readonly: bool) -> None:
    path = tmp_path / "results.db"
    path.write_bytes(b"tp,pp,dp\n" * 1000)
    with pytest.raises(StoreError, match=rf"{path} is not a parsearch store"):
        SQLiteStore(path, readonly=readonly)
    assert path.read_bytes() == b"tp,pp,dp\n" * 1000


def test_another_programs_database_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "optuna.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE studies (id INTEGER)")
    before = digest(path)
    with pytest.raises(StoreError, match=r"not a parsearch store \(its tables are \['studies'\]\)"):
        SQLiteStore(path)
    assert digest(path) == before


def test_an_empty_database_is_not_a_store_to_read(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    with pytest.raises(StoreError, match="empty database, not a parsearch store"):
        SQLiteStore(path, readonly=True)


@pytest.mark.parametrize("readonly", [False, True])
def test_bad_paths_are_explained(tmp_path: Path, readonly: bool) -> None:
    with pytest.raises(StoreError, match=rf"directory {tmp_path / 'nope'} does not exist"):
        SQLiteStore(tmp_path / "nope" / "s.db", readonly=readonly)
    with pytest.raises(StoreError, match=rf"{tmp_path} is a directory; .*{tmp_path}/parsearch.db"):
        SQLiteStore(tmp_path, readonly=readonly)
    (tmp_path / "file").touch()
    with pytest.raises(StoreError, match=r"file is not a directory"):
        SQLiteStore(tmp_path / "file" / "s.db", readonly=readonly)


def test_reading_a_missing_store(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=rf"no store at {tmp_path / 's.db'}"):
        SQLiteStore(tmp_path / "s.db", readonly=True)
    assert not (tmp_path / "s.db").exists()


def test_a_directory_nobody_may_write(tmp_path: Path) -> None:
    # Tests run as root, whom chmod does not stop; sysfs refuses new files even to root.
    if not Path("/sys").is_dir() or _can_create(Path("/sys/parsearch-probe.db")):
        pytest.skip("no directory here refuses root")
    with pytest.raises(StoreError, match=r"cannot open store /sys/s.db: permission denied"):
        SQLiteStore("/sys/s.db")


def _can_create(path: Path) -> bool:
    try:
        path.touch()
    except OSError:
        return False
    path.unlink()
    return True


def test_an_in_memory_store_cannot_be_read_only() -> None:
    with pytest.raises(StoreError, match="in-memory store cannot be opened read-only"):
        SQLiteStore(":memory:", readonly=True)


# -- read-only readers --------------------------------------------------------------------------


def test_a_reader_cannot_write(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    campaign_id = make_store(path)
    before = digest(path)
    with SQLiteStore(path, readonly=True) as reader:
        trial = reader.trials(campaign_id)[0]
        writes = [
            lambda: reader.create_campaign("c2", {}),
            lambda: reader.update_campaign(campaign_id, budget=3),
            lambda: reader.acquire_lease(campaign_id, "me", stale_after_s=1),
            lambda: reader.heartbeat(campaign_id, "me"),
            lambda: reader.release_lease(campaign_id, "me"),
            lambda: reader.add_trial(campaign_id, layout(99)),
            lambda: reader.mark_running(trial.id, ["n0"], 1),
            lambda: reader.finish_trial(trial.id, TrialResult(TrialState.ERROR), None),
            lambda: reader.mark_interrupted(campaign_id),
            lambda: reader.requeue(trial.id),
        ]
        for write in writes:
            with pytest.raises(StoreError, match=r"open read-only; .* needs a command that writes"):
                write()
        assert reader.best(campaign_id).number == 2
        assert len(reader.pareto(campaign_id)) == 3
        assert reader.counts(campaign_id)[TrialState.OK] == 3
        assert len(reader.dataframe(campaign_id)) == 3
        reader.export(campaign_id, tmp_path / "out.csv")
    assert digest(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.csv", "s.db"]


def test_a_reader_sees_what_another_process_committed(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    campaign_id = make_store(path, ok_trials=1)
    writer = python(
        f"""
        import sqlite3, sys
        from parsearch.config import ParallelLayout
        from parsearch.result import TrialResult, TrialState
        from parsearch.store import SQLiteStore

        store = SQLiteStore({str(path)!r})
        for gas in (16, 32):
            trial = store.add_trial({campaign_id}, ParallelLayout(2, 1, 4, 1, gas))
            store.mark_running(trial.id, ["n9"], 1)
            result = TrialResult("ok", {{"tokens_per_s": 1e4 * gas}})
            store.finish_trial(trial.id, result, 1e4 * gas)
        print("committed", flush=True)
        sys.stdin.readline()
        # A transaction left open: its change must stay invisible to readers.
        raw = sqlite3.connect({str(path)!r}, isolation_level=None)
        raw.execute("BEGIN IMMEDIATE")
        raw.execute("UPDATE trials SET state = 'error'")
        print("uncommitted", flush=True)
        sys.stdin.readline()
        raw.execute("ROLLBACK")
        """
    )
    with SQLiteStore(path, readonly=True, timeout_s=5) as reader:
        assert reader.counts(campaign_id)[TrialState.OK] == 1
        try:
            assert writer.stdout.readline().strip() == "committed"
            assert reader.counts(campaign_id)[TrialState.OK] == 3
            assert reader.best(campaign_id).hosts == ["n9"]
            writer.stdin.write("\n")
            writer.stdin.flush()
            assert writer.stdout.readline().strip() == "uncommitted"
            assert reader.counts(campaign_id)[TrialState.OK] == 3
            writer.stdin.write("\n")
            writer.stdin.flush()
            assert writer.wait(timeout=30) == 0
        finally:
            writer.kill()
            writer.wait()


def test_a_writer_that_died_mid_transaction(tmp_path: Path) -> None:
    """A crash leaves a hot journal: readers say what to do, the next writer rolls it back."""
    path = tmp_path / "s.db"
    campaign_id = make_store(path)
    crash = python(
        f"""
        import os, sqlite3
        raw = sqlite3.connect({str(path)!r}, isolation_level=None)
        raw.execute("PRAGMA cache_size = 1")  # spill changed pages into the file itself
        raw.execute("BEGIN IMMEDIATE")
        raw.execute("UPDATE trials SET state = 'error', log_tail = zeroblob(100000)")
        os._exit(1)
        """
    )
    assert crash.wait(timeout=30) == 1
    assert (tmp_path / "s.db-journal").exists()
    with pytest.raises(StoreError, match=r"unfinished write .*parsearch resume"):
        SQLiteStore(path, readonly=True)

    # A reader that lands while a live writer is about to roll the journal back (another
    # driver of a shared store) waits for it instead of failing.
    def writer_comes() -> None:
        time.sleep(0.5)
        with SQLiteStore(path) as writer:
            writer.counts(campaign_id)

    helper = threading.Thread(target=writer_comes)
    started = time.monotonic()
    helper.start()
    with SQLiteStore(path, readonly=True) as reader:
        assert reader.counts(campaign_id)[TrialState.OK] == 3
    waited = time.monotonic() - started
    helper.join()
    assert waited >= 0.4, f"read after {waited:.2f} s, before the writer rolled back at 0.5 s"
    assert not (tmp_path / "s.db-journal").exists()


def test_a_second_writer_waits_then_gives_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    campaign_id = make_store(path)
    with SQLiteStore(path, timeout_s=0.2) as store:
        holder = python(
            f"""
            import sqlite3, sys
            raw = sqlite3.connect({str(path)!r}, isolation_level=None)
            raw.execute("BEGIN EXCLUSIVE")
            print("locked", flush=True)
            sys.stdin.readline()
            """
        )
        try:
            assert holder.stdout.readline().strip() == "locked"
            with pytest.raises(StoreError, match=r"stayed locked for more than 0.2 s while adding"):
                store.add_trial(campaign_id, layout(64))
        finally:
            holder.kill()
            holder.wait()
        assert store.add_trial(campaign_id, layout(64)).number == 3
