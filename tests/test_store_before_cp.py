"""A store written by the release before context parallelism (4c77633) keeps working.

The fixture ``fixtures/stores/release-4c77633.db`` was written by that release: a simulated
8-trial campaign of ``search_spaces/gpt-22b-frontier.yaml`` (``parsearch run SPACE --backend
simulate --budget 8 --seed 3``; its space file was then deleted, as a user's may be), and
``release-4c77633-best.json`` is what that release's ``best --format json`` printed. Its
trials' configs have no ``cp``: each must keep the identity it was stored under, or a resume
would run the same layouts again under new keys and ``best`` could change.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from parsearch.config import LAYOUT_DIMENSIONS
from parsearch.store import open_store

FIXTURES = Path(__file__).parent / "fixtures" / "stores"
RELEASE = "4c77633"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "parsearch", *args], capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def old_store(tmp_path: Path) -> Path:
    path = tmp_path / "old.db"
    shutil.copy(FIXTURES / f"release-{RELEASE}.db", path)
    return path


def stored(path: Path) -> list:
    with open_store(path, readonly=True) as store:
        (campaign,) = store.list_campaigns()
        return list(store.trials(campaign.id))


def test_every_stored_layout_keeps_the_key_it_was_stored_under(old_store):
    records = stored(old_store)
    assert len(records) == 8 and all("cp" not in r.config for r in records), records
    changed = [(r.number, r.key, r.layout.key()) for r in records if r.layout.key() != r.key]
    assert not changed, f"(trial, stored key, key now): {changed}"
    assert all(r.layout.cp == r.layout.ep == r.layout.etp == 1 for r in records)


@pytest.mark.e2e
def test_best_is_unchanged_and_a_resume_runs_no_layout_again(old_store):
    before = json.loads((FIXTURES / f"release-{RELEASE}-best.json").read_text())
    best = cli("best", "--store", str(old_store), "--format", "json")
    assert best.returncode == 0, best.stderr
    now = json.loads(best.stdout)
    assert now["trial"] == before["trial"] and now["objective"] == before["objective"], now
    added = {d.name: d.default for d in LAYOUT_DIMENSIONS if d.name not in before["layout"]}
    assert set(added) >= {"cp"}, added
    assert now["layout"] == {**before["layout"], **added}, now["layout"]

    first = {r.number: (r.key, r.state, r.objective, r.started_at) for r in stored(old_store)}
    resumed = cli("resume", "--store", str(old_store), "--budget", "12", "--quiet")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    records = stored(old_store)
    kept = {r.number: (r.key, r.state, r.objective, r.started_at) for r in records}
    assert {n: kept[n] for n in first} == first, "a finished trial was run or changed again"
    assert len(records) == 12, [(r.number, r.layout.short(), r.state) for r in records]
    layouts = [r.layout for r in records]
    assert len(set(layouts)) == len(layouts), [layout.short() for layout in layouts]
