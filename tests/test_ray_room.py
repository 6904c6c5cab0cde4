"""A local Ray cluster smaller than one trial is refused before the campaign starts (exit 2),
saying what the trial needs and how to give it, instead of failing as if nodes were lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from parsearch.cli import main

pytestmark = [pytest.mark.ray, pytest.mark.slow]

TINY = str(Path(__file__).resolve().parents[1] / "search_spaces" / "tiny-cpu.yaml")


def test_a_cluster_smaller_than_one_trial_exits_2_before_the_campaign(tmp_path, capsys):
    db = tmp_path / "s.db"
    argv = ["run", TINY, "--store", str(db), "--backend", "ray", "--backend-opt", "num_cpus=2"]
    assert main([*argv, "--budget", "2", "--quiet"]) == 2
    error = capsys.readouterr().err
    assert "smaller than one trial" in error and "1 node(s) of 4 CPUs" in error
    assert "--backend-opt num_cpus=4" in error
    from parsearch.store import open_store

    with open_store(db, readonly=True) as store:
        assert store.list_campaigns() == []  # nothing to resume: it never started
