"""A store whose rows hold what a hand edit or a flipped byte can put there (issue 29): every
reader (status, top, best, show, export, report, resume) answers or exits with a message naming
the row and column; no traceback, no hang, and a resume never runs on another backend than the
campaign's."""

from __future__ import annotations

import shutil
import sqlite3
import time
from pathlib import Path

import pytest

from parsearch.cli import main

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "search_spaces" / "tiny-cpu.yaml")
BIG = str(ROOT / "search_spaces" / "gpt-175b-frontier.yaml")

DEEP = "[" * 100_000 + "]" * 100_000
# (table, column, SQL value): what a hand edit or damage can leave in a row (SQLite itself
# refuses NULL in its NOT NULL columns).
EDITS = [
    *[("trials", "config", v) for v in ("''", "'garbage'", "'[]'", "'{}, {}'",
                                         "'{\"tp\": \"x\"}'", "'{\"tp\": 0}'", "'{\"bogus\": 1}'",
                                         f"'{DEEP}'", "X'00FF'")],
    *[("trials", "state", v) for v in ("'done'", "''", "3", "CAST(X'FF' AS TEXT)")],
    *[("trials", "metrics", v) for v in ("'garbage'", "'[1, 2]'", "'\"text\"'",
                                          "'{\"tokens_per_s\": \"fast\"}'", "'{}, {}'",
                                          "'{\"tokens_per_s\": NaN}'")],
    *[("trials", "hosts", v) for v in ("'node1'", "'[1, 2]'", "'{}'", "'[null]'")],
    *[("trials", "predicted", v) for v in ("'garbage'", "'[]'", "'{\"tokens_per_s\": \"x\"}'")],
    *[("trials", "objective", v) for v in ("'fast'", "9e999", "-9e999", "X'01'")],
    *[("trials", "tokens_per_s", v) for v in ("'fast'", "9e999")],
    *[("trials", "peak_mem_bytes", v) for v in ("'lots'", "-1")],
    *[("trials", "number", v) for v in ("'one'", "-5", "9223372036854775807")],
    *[("trials", "attempt", v) for v in ("'x'", "1.5")],
    *[("trials", "created_at", v) for v in ("'yesterday'", "9e999")],
    *[("trials", "duration_s", v) for v in ("'long'", "-9e999")],
    *[("trials", "error", v) for v in ("X'1b5d303b7469746c6507'", "CAST(X'FF' AS TEXT)", "42")],
    *[("trials", "log_tail", v) for v in ("CAST(X'C328' AS TEXT)", "X'00'", "42")],
    *[("trials", "origin", v) for v in ("7",)],
    *[("trials", "proxy_dp", v) for v in ("'two'", "0")],
    *[("campaigns", "space", v) for v in ("'garbage'", "'[]'", "'{}'", "'{\"model\": 1}'")],
    *[("campaigns", "settings", v) for v in ("'garbage'", "'[]'", "'{\"slots\": \"x\"}'")],
    *[("campaigns", "versions", v) for v in ("'garbage'", "'1'")],
    *[("campaigns", "status", v) for v in ("'paused'",)],
    *[("campaigns", "budget", v) for v in ("'many'", "-1", "1.5")],
    *[("campaigns", "seed", v) for v in ("'x'",)],
    *[("campaigns", "name", v) for v in ("42", "'evil\u202eexe'")],
    *[("campaigns", "backend", v) for v in ("'quantum'",)],
    *[("campaigns", "objective_metric", v) for v in ("'speed'",)],
    *[("campaigns", "created_at", v) for v in ("'now'", "9e999")],
]  # fmt: skip
READERS = [
    ["status"],
    ["status", "--format", "json"],
    ["top"],
    ["best"],
    ["show", "--trial", "0"],
    ["show", "--trial", "0", "--format", "json"],
    ["export", "--out", "{tmp}/x.csv"],
]


@pytest.fixture(scope="module")
def done_store(tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("hostile-store") / "done.db"
    argv = ["run", TINY, "--store", str(db), "--budget", "2", "--backend", "simulate"]
    assert main([*argv, "--quiet"]) == 0
    return db


def _edited(done_store: Path, tmp_path: Path, table: str, column: str, value: str) -> Path:
    db = tmp_path / "edited.db"
    shutil.copy(done_store, db)
    with sqlite3.connect(db) as conn:
        # The first row (trial 0, the campaign): what one hand edit changes.
        conn.execute(
            f"UPDATE {table} SET {column} = {value} WHERE rowid = (SELECT min(rowid) FROM {table})"
        )
    return db


@pytest.mark.e2e
@pytest.mark.parametrize(("table", "column", "value"), EDITS, ids=lambda v: str(v)[:24])
def test_every_reader_answers_or_names_the_damage(
    done_store, tmp_path, capsys, table, column, value
):
    db = _edited(done_store, tmp_path, table, column, value)
    for reader in READERS:
        argv = [reader[0], "--store", str(db), *(a.format(tmp=tmp_path) for a in reader[1:])]
        began = time.monotonic()
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse
            code = int(exit_.code)
        # Any other exception fails the test: that is the traceback a user would see.
        assert time.monotonic() - began < 10, argv
        out = capsys.readouterr()
        assert code in (0, 1, 2), (argv, code, out.err)
        if code:
            assert out.err.startswith(f"parsearch {reader[0]}: error:"), out.err
            assert "\x1b" not in out.err


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize(
    ("table", "column", "value"),
    [edit for edit in EDITS if edit[0] == "campaigns"]
    + [("trials", "state", "'running'"), ("trials", "config", "'garbage'")],
    ids=lambda v: str(v)[:24],
)
def test_resume_of_a_damaged_store_answers_or_names_the_damage(
    done_store, tmp_path, capsys, table, column, value
):
    db = _edited(done_store, tmp_path, table, column, value)
    began = time.monotonic()
    code = main(["resume", "--store", str(db), "--budget", "3", "--quiet"])
    assert time.monotonic() - began < 30
    err = capsys.readouterr().err
    assert code in (0, 1, 2), err
    if code:
        assert err.startswith("parsearch resume: error:"), err
    hosts = [h for (h,) in sqlite3.connect(db).execute("SELECT hosts FROM trials")]
    assert all("sim" in h or h == "[]" for h in hosts if isinstance(h, str) and h.startswith("["))


@pytest.mark.e2e
def test_settings_that_lost_their_backend_resume_on_the_campaigns_own(tmp_path, capsys):
    """Issue 29: with ``campaigns.settings = '{}'``, resume started real local trials of the
    175B space; the campaign's backend column is the one it runs on."""
    db = tmp_path / "big.db"
    assert main(["run", BIG, "--store", str(db), "--budget", "2", "--backend", "simulate",
                 "--quiet"]) == 0  # fmt: skip
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE campaigns SET settings = '{}'")
    capsys.readouterr()
    began = time.monotonic()
    assert main(["resume", "--store", str(db), "--budget", "3", "--quiet"]) == 0
    assert time.monotonic() - began < 30
    hosts = [h for (h,) in sqlite3.connect(db).execute("SELECT hosts FROM trials")]
    assert len(hosts) == 3 and all('"sim' in h for h in hosts), hosts
