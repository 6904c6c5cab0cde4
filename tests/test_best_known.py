"""``parsearch best --like SPACE``: the best layout across every campaign of one real store
holding three models on two allocations each (simulate campaigns), with where it came from,
and a refusal that says what the store holds when nothing compares."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from parsearch.best_known import Comparable, best_known
from parsearch.campaign.session import CampaignSettings, start_campaign
from parsearch.cli import main
from parsearch.result import TrialState
from parsearch.space import load_space
from parsearch.store import open_store

pytestmark = pytest.mark.e2e
SPACES = Path(__file__).parent.parent / "search_spaces"
MODELS = ("gpt-22b-frontier", "gpt-175b-frontier", "gpt-1t-frontier")


def variant(tmp: Path, model: str, nodes: int | None = None, trainer: str | None = None) -> Path:
    """The shipped space of ``model``, on ``nodes`` nodes (default: its own)."""
    data = yaml.safe_load((SPACES / f"{model}.yaml").read_text())
    if nodes is not None:
        data["allocation"]["nodes"] = nodes
    data["name"] = f"{model}-{data['allocation']['nodes']}n" + (f"-{trainer}" if trainer else "")
    path = tmp / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One store, six campaigns: each model on its own node count and on half of it."""
    tmp = tmp_path_factory.mktemp("shared")
    db = tmp / "shared.db"
    settings = CampaignSettings(backend="simulate", slots=4, backend_options={"seed": "1"})
    paths = {}
    for model in MODELS:
        nodes = load_space(SPACES / f"{model}.yaml").allocation.nodes
        for count in (nodes, nodes // 2):
            path = variant(tmp, model, count)
            start_campaign(path, db, name=path.stem, budget=8, settings=settings)
            paths[(model, count)] = path
    return db, paths


def _cli(capsys, *args):
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_store_holds_three_models_on_two_allocations(shared):
    db, paths = shared
    with open_store(db, readonly=True) as store:
        names = sorted(c.name for c in store.list_campaigns())
        assert names == sorted(p.stem for p in paths.values())
        for campaign in store.list_campaigns():
            ok = store.trials(campaign.id, [TrialState.OK])
            assert ok, f"{campaign.name}: {store.counts(campaign.id)}"


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("half", [False, True])
def test_the_answer_is_the_comparable_campaigns_fastest_trial(shared, capsys, model, half):
    db, paths = shared
    nodes = load_space(SPACES / f"{model}.yaml").allocation.nodes // (2 if half else 1)
    like = paths[(model, nodes)]
    with open_store(db, readonly=True) as store:
        (campaign,) = [c for c in store.list_campaigns() if c.name == like.stem]
        ok = store.trials(campaign.id, [TrialState.OK])
        fastest = max(ok, key=lambda t: t.tokens_per_s)
    code, out, err = _cli(
        capsys, "best", "--store", str(db), "--like", str(like), "--format", "json"
    )
    assert code == 0, err
    answer = json.loads(out)
    seen = [(r["campaign"], r["trial"], r["metrics"]["tokens_per_s"]) for r in answer["ranked"]]
    assert [r["campaign"] for r in answer["ranked"]] == [like.stem], seen
    best = answer["best"]
    assert (best["trial"], best["layout"]) == (fastest.number, fastest.config), seen
    # Simulate campaigns: the estimate's figures, never called measured.
    assert best["measured"] is False and best["trainer"] == "builtin"
    assert best["provenance"].startswith("simulated"), best["provenance"]
    assert best["finished_at"] == fastest.finished_at
    other = nodes * 2 if half else nodes // 2
    assert answer["other_allocations"] == [{"campaign": paths[(model, other)].stem, "nodes": other}]
    assert answer["campaigns_in_store"] == 6
    # The same answer in the formats users paste: the layout, its provenance on stderr.
    code, out, err = _cli(capsys, "best", "--store", str(db), "--like", str(like))
    assert code == 0 and f"campaign '{like.stem}' trial #{fastest.number}" in out, out
    assert fastest.layout.short() in out and "simulated" in out
    assert "no comparable trial was measured: the figures are only predicted" in out, out
    code, out, err = _cli(
        capsys, "best", "--store", str(db), "--like", str(like), "--format", "megatron"
    )
    assert code == 0 and f"--tensor-model-parallel-size {fastest.config['tp']}" in out, out
    assert f"campaign '{like.stem}' trial #{fastest.number}" in err


def test_a_campaign_of_the_same_shape_from_another_trainer_compares_unless_filtered(
    shared, tmp_path
):
    db, paths = shared
    model = "gpt-22b-frontier"
    nodes = load_space(SPACES / f"{model}.yaml").allocation.nodes
    copy = tmp_path / "copy.db"
    copy.write_bytes(Path(db).read_bytes())
    data = yaml.safe_load(paths[(model, nodes)].read_text())
    data["name"] = "22b-by-a-command"
    data["trainer"] = {"kind": "command", "parser": "json", "command": ["true"], "timeout": 60}
    other = tmp_path / "command.yaml"
    other.write_text(yaml.safe_dump(data, sort_keys=False))
    settings = CampaignSettings(backend="simulate", backend_options={"seed": "2"})
    start_campaign(other, copy, name="22b-by-a-command", budget=4, settings=settings)
    wanted = Comparable.of(load_space(paths[(model, nodes)]))
    with open_store(copy, readonly=True) as store:
        both = best_known(store, wanted)
        builtin = best_known(store, wanted, trainer="builtin")
        command = best_known(store, wanted, trainer="command")
    assert {k.campaign.name for k in both.layouts} == {
        paths[(model, nodes)].stem,
        "22b-by-a-command",
    }
    speeds = [k.trial.tokens_per_s for k in both.layouts]
    assert speeds == sorted(speeds, reverse=True), speeds
    assert [k.campaign.name for k in builtin.layouts] == [paths[(model, nodes)].stem]
    assert [(k.campaign.name, k.trainer) for k in command.layouts] == [
        ("22b-by-a-command", "command")
    ]


def test_nothing_comparable_is_refused_with_what_the_store_holds(shared, tmp_path, capsys):
    db, _ = shared
    elsewhere = variant(tmp_path, "gpt-175b-frontier", nodes=16)
    code, out, err = _cli(capsys, "best", "--store", str(db), "--like", str(elsewhere))
    assert code != 0 and out == ""
    assert "none of the 6 campaigns in the store has an ok trial of gpt 96 layers" in err, err
    assert "on 16 nodes x 8 cuda (64 GiB" in err, err
    for nodes in (128, 64):  # the same model on the same devices, other node counts
        assert f"'gpt-175b-frontier-{nodes}n' ({nodes} nodes)" in err, err
    unknown = variant(tmp_path, "llama3-8b-h200")
    code, out, err = _cli(capsys, "best", "--store", str(db), "--like", str(unknown))
    assert code != 0 and "none of the 6 campaigns" in err and "measured by" not in err, err


def test_like_refuses_options_that_choose_one_campaign(shared, capsys):
    db, paths = shared
    like = str(next(iter(paths.values())))
    code, _, err = _cli(capsys, "best", "--store", str(db), "--like", like, "--name", "x")
    assert code != 0 and "--name: not with --like" in err, err
    code, _, err = _cli(capsys, "best", "--store", str(db), "--trainer", "builtin")
    assert code != 0 and "--trainer: only with --like" in err, err


@pytest.mark.multiprocess
def test_a_measured_layout_answers_before_a_faster_simulated_one(tmp_path, capsys):
    """Real trials of the tiny space on this machine, and a rehearsal of the same space whose
        estimate reaches the whole core peak (10x the shipped efficiency), so it is predicted far
    faster than this CPU trains: the measured one is the answer."""
    db = tmp_path / "s.db"
    tiny = load_space(SPACES / "tiny-cpu.yaml")
    local = CampaignSettings(backend="local")
    start_campaign(SPACES / "tiny-cpu.yaml", db, name="measured", budget=2, settings=local)
    data = yaml.safe_load((SPACES / "tiny-cpu.yaml").read_text())
    data["estimate"]["compute_efficiency"] = 1.0  # a rehearsal far faster than this CPU
    fast = tmp_path / "fast.yaml"
    fast.write_text(yaml.safe_dump(data, sort_keys=False))
    rehearsal = CampaignSettings(backend="simulate", backend_options={"seed": "1"})
    start_campaign(fast, db, name="rehearsal", budget=2, settings=rehearsal)
    with open_store(db, readonly=True) as store:
        known = best_known(store, Comparable.of(tiny))
    seen = [(k.campaign.name, k.how, k.trial.tokens_per_s) for k in known.layouts]
    assert [k.campaign.name for k in known.layouts] == ["measured", "rehearsal"], seen
    assert known.layouts[1].trial.tokens_per_s > known.layouts[0].trial.tokens_per_s, seen
    assert known.best.measured and known.best.how == "measured", seen
    code, out, err = _cli(
        capsys, "best", "--store", str(db), "--like", str(SPACES / "tiny-cpu.yaml")
    )
    assert code == 0, err
    assert out.splitlines()[1].strip().startswith("1.") and "measured" in out, out
    assert "only predicted" not in out, out


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_a_new_campaign_warm_starts_from_the_nearest_node_count_in_its_store(
    shared, tmp_path, capsys, kind, request
):
    """On a copy of the shared store: a SQLite file, or a PostgreSQL schema (store copy)."""
    db, paths = shared
    model = "gpt-22b-frontier"
    nodes = load_space(SPACES / f"{model}.yaml").allocation.nodes
    if kind == "sqlite":
        copy = tmp_path / "copy.db"
        copy.write_bytes(Path(db).read_bytes())
        where = str(copy.resolve())
    else:
        copy = where = request.getfixturevalue("postgres_url")
        code, _, err = _cli(capsys, "store", "copy", str(db), copy)
        assert code == 0, err
    run = ("--store", str(copy), "--backend", "simulate", "--budget", "3", "--quiet")
    bigger = variant(tmp_path, model, nodes * 2)
    code, _, err = _cli(capsys, "run", str(bigger), *run)
    nearest = paths[(model, nodes)].stem  # 1 doubling away; the half-size one is 2
    assert code == 0, err
    assert f"note: warm start from campaign '{nearest}' of this store" in err, err
    assert f"{nodes} nodes; 8 finished trials" in err, err
    with open_store(copy, readonly=True) as store:
        settings = store.get_campaign(bigger.stem).settings
    assert (settings["warm_start"], settings["warm_start_name"]) == (where, nearest)
    code, _, err = _cli(capsys, "resume", "--store", str(copy), "--name", bigger.stem,
                          "--budget", "4", "--quiet")  # fmt: skip
    assert code == 0 and "warm start" not in err, err  # resumed with the stored source
    # Turned off, and never from the same allocation (that campaign answers the question).
    off = variant(tmp_path, model, nodes * 4)
    code, _, err = _cli(capsys, "run", str(off), *run, "--no-auto-warm-start")
    assert code == 0 and "warm start" not in err, err
    same = tmp_path / "same.yaml"
    same.write_text(paths[(model, nodes)].read_text().replace(nearest, "again"))
    code, _, err = _cli(capsys, "run", str(same), *run)
    assert code == 0 and f"warm start from campaign '{paths[(model, nodes // 2)].stem}'" in err, err
    with open_store(copy, readonly=True) as store:
        assert store.get_campaign(off.stem).settings["warm_start"] is None
