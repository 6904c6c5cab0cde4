"""Eight drivers write one store at once, 200 trials each, while readers and ``parsearch
serve`` read it, and three drivers are killed with SIGKILL at random moments and resumed:
nothing lost, nothing duplicated, every budget exact (benchmarks/many_drivers.py)."""

from __future__ import annotations

import many_drivers
import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.e2e]
DRIVERS, TRIALS, KILLS = 8, 200, 3


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_eight_drivers_at_once_lose_and_repeat_nothing(tmp_path, kind, request):
    """The same test on both stores: a SQLite file, and a schema of a PostgreSQL server."""
    store = (
        str(tmp_path / "shared.db") if kind == "sqlite" else request.getfixturevalue("postgres_url")
    )
    outcome = many_drivers.run(
        store, tmp_path, drivers=DRIVERS, trials=TRIALS, kills=KILLS, readers=2, seed=7
    )
    assert outcome.problems == [], outcome.problems
    assert len(outcome.killed) == KILLS, outcome.killed
    assert outcome.read_errors == 0 and outcome.reads > 0, (outcome.reads, outcome.read_errors)
    assert outcome.http_errors == [] and outcome.http_polls > 0, outcome.http_errors
    # The check finds what is missing: one trial more than the budget is missing everywhere.
    missing = many_drivers.check(store, [f"d{i}" for i in range(DRIVERS)], TRIALS + 1, {})
    assert len(missing) == DRIVERS and all("200 trials" in line for line in missing), missing
