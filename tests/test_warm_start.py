"""``parsearch run --warm-start OTHER.db``: a 1T search calibrated by a 175B campaign."""

import sqlite3
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from trials_seen import trials_seen

from parsearch.campaign.session import CampaignSettings, start_campaign
from parsearch.campaign.warm_start import load_warm_start
from parsearch.cli import main
from parsearch.result import TrialState
from parsearch.search.calibration import MemoryCalibration
from parsearch.search.factory import make_strategy
from parsearch.search.local_memory import MAX_MARGIN
from parsearch.search.strategy import StrategyError
from parsearch.search.warm_start import (
    MARGIN_PER_STEP,
    SAME_SHAPE_MARGIN,
    WarmStartError,
    distance,
    transfer_margin,
)
from parsearch.space import load_space
from parsearch.store import open_store

ROOT = Path(__file__).parent.parent
GPT175 = ROOT / "search_spaces" / "gpt-175b-frontier.yaml"
GPT1T = ROOT / "search_spaces" / "gpt-1t-frontier.yaml"
MACHINE = {"mem_factor": "1.15", "mem_offset": "1GiB"}
GIB = 2**30
SPACES = ("gpt-22b-frontier", "gpt-175b-frontier", "gpt-1t-frontier", "llama3-8b-h200")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A finished 175B campaign on a machine that needs 15% + 1 GiB more than predicted."""
    db = tmp_path_factory.mktemp("warm") / "175b.db"
    settings = CampaignSettings(backend="simulate", backend_options=MACHINE)
    start_campaign(GPT175, db, name="gpt-175b", budget=12, settings=settings)
    return db


def test_warm_start_calibrates_before_the_first_trial(source):
    space = load_space(GPT1T)
    cold = make_strategy("default", space, seed=0)
    warm = make_strategy("default", space, seed=0, warm_start=load_warm_start(source))
    try:
        assert cold.estimate.memory.fit.slope == 1.0
        fit = warm.estimate.memory.fit
        assert fit.peak(50 * 2**30) == pytest.approx(1.15 * 50 * 2**30 + 2**30, rel=0.01)
        assert len(warm.candidates) < len(cold.candidates), "the wall moved down"
        # Nothing is proposed beyond the transferred fit's uncertainty (175B -> 1T: 5%).
        assert fit.margin == pytest.approx(-transfer_margin(distance(load_space(GPT175), space)))
        first = warm.ask(4)
        wall = space.memory_limit_bytes * (1 - fit.margin)
        assert all(fit.peak(p.prediction.memory.total) <= wall for p in first)
    finally:
        cold.close()
        warm.close()


def test_run_with_warm_start_end_to_end(source, tmp_path, capsys):
    store = tmp_path / "1t.db"
    code = main(
        [
            "run", str(GPT1T), "--store", str(store), "--backend", "simulate",
            "--backend-opt", "mem_factor=1.15", "--backend-opt", "mem_offset=1GiB",
            "--budget", "6", "--quiet", "--warm-start", str(source),
            "--warm-start-name", "gpt-175b",
        ]
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    with open_store(store, readonly=True) as db:
        campaign = db.get_campaign()
        trials = db.trials(campaign.id)
    assert campaign.settings["warm_start"] == str(source.resolve())
    assert campaign.settings["warm_start_name"] == "gpt-175b"
    assert len(trials) == 6
    assert not any(t.state is TrialState.OOM for t in trials), trials_seen(trials)


def _run_error(capsys, *extra):
    code = main(["run", str(GPT1T), "--store", "unused.db", "--backend", "simulate", *extra])
    return code, capsys.readouterr().err


def test_missing_store_is_a_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, err = _run_error(capsys, "--warm-start", str(tmp_path / "nope.db"))
    assert code == 2
    assert "--warm-start: no store at" in err and "nope.db" in err
    assert not (tmp_path / "unused.db").exists() or not _campaigns(tmp_path / "unused.db")


def _campaigns(path):
    with open_store(path, readonly=True) as store:
        return store.list_campaigns()


def test_a_database_of_another_program_is_a_clear_error(tmp_path):
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE runs (id INTEGER)")
    with pytest.raises(WarmStartError, match="not a parsearch store"):
        load_warm_start(other)


def test_a_file_that_is_not_a_database_is_a_clear_error(tmp_path):
    text = tmp_path / "notes.db"
    text.write_text("not sqlite at all\n" * 100)
    with pytest.raises(WarmStartError, match=r"--warm-start .*notes\.db"):
        load_warm_start(text)


def test_unknown_campaign_and_empty_campaign(source, tmp_path):
    with pytest.raises(WarmStartError, match=r"no campaign 'gpt-1t'.*gpt-175b"):
        load_warm_start(source, "gpt-1t")
    empty = tmp_path / "empty.db"
    with open_store(empty) as store:
        store.create_campaign("nothing-yet", load_space(GPT175).raw)
    with pytest.raises(WarmStartError, match="no finished trial"):
        load_warm_start(empty)


def test_warm_start_needs_the_default_strategy(source):
    with pytest.raises(StrategyError, match="default strategy"):
        make_strategy("random", load_space(GPT1T), seed=0, warm_start=load_warm_start(source))


def test_distance_counts_doublings_of_what_memory_depends_on():
    spaces = {n: load_space(ROOT / "search_spaces" / f"{n}.yaml") for n in SPACES}
    for name, space in spaces.items():
        assert distance(space, space) == 0.0, name
    gpt175, gpt1t, gpt22 = (
        spaces["gpt-175b-frontier"],
        spaces["gpt-1t-frontier"],
        spaces["gpt-22b-frontier"],
    )
    assert distance(gpt175, gpt1t) == pytest.approx(distance(gpt1t, gpt175))
    # Same machine: the model size and the allocation size are what differ.
    assert 3 < distance(gpt175, gpt1t) < distance(gpt22, gpt1t)
    other_precision = replace(gpt175, estimate=replace(gpt175.estimate, precision="fp16"))
    assert distance(gpt175, other_precision) == 1.0


def test_transfer_margin_grows_with_distance_and_is_capped():
    assert transfer_margin(0.0) == SAME_SHAPE_MARGIN
    assert transfer_margin(2.0) == pytest.approx(SAME_SHAPE_MARGIN + 2 * MARGIN_PER_STEP)
    assert transfer_margin(4.0) > transfer_margin(2.0)
    assert transfer_margin(100.0) == MAX_MARGIN


def test_a_transferred_fit_prunes_only_beyond_its_uncertainty_until_own_evidence():
    """A layout the transferred fit puts 3% over the wall is kept while only transferred
    measurements speak (a 5% uncertainty), and pruned once this campaign measures."""
    limit = 64 * GIB
    memory = MemoryCalibration(limit)
    for predicted in (40, 50, 60):
        memory.add_peak(predicted * GIB, 1.1 * predicted * GIB, 0.5, transferred=True)
    memory.transferred(0.05)
    over = np.array([1.03 * limit / 1.1])
    assert memory.fits(over)[0]
    assert not memory.fits(np.array([1.06 * limit / 1.1]))[0]
    memory.add_peak(30 * GIB, 33 * GIB)  # the campaign's own first measurement
    assert memory.fit.margin > 0
    assert not memory.fits(over)[0]


def test_own_out_of_memory_ends_the_transferred_band():
    memory = MemoryCalibration(64 * GIB)
    memory.add_peak(50 * GIB, 55 * GIB, 0.5, transferred=True)
    memory.transferred(0.05)
    assert memory.fit.margin == -0.05
    memory.add_oom(58 * GIB)
    assert memory.fit.margin >= 0
