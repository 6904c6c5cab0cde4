"""Temporary directories of a driver killed with kill -9 are removed by the next one."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from parsearch import tempdirs
from parsearch.store.liveness import process_identity

pytestmark = pytest.mark.skipif(process_identity() is None, reason="needs /proc")


def test_a_dead_owners_directories_go_and_a_live_ones_stay(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempdirs.tempfile, "tempdir", None)  # re-read TMPDIR
    code = (
        "import time\n"
        "from parsearch.tempdirs import owned_tempdir\n"
        "for kind in ('local', 'cbo'):\n"
        "    (owned_tempdir(kind) / 'trial.log').write_text('x')\n"
        "print('made', flush=True)\n"
        "time.sleep(600)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "made"
    left = sorted(p.name for p in tmp_path.iterdir())
    assert len(left) == 2 and all(f"-p{child.pid}-" in name for name in left)
    mine = tempdirs.owned_tempdir("local")  # a live owner's directories are kept
    assert len(list(tmp_path.iterdir())) == 3
    child.send_signal(signal.SIGKILL)
    child.wait(30)
    unrelated = tmp_path / "parsearch-local-p1-unowned"  # no owner file: never touched
    unrelated.mkdir()
    tempdirs.owned_tempdir("cbo")
    names = {p.name for p in tmp_path.iterdir()}
    assert mine.name in names and unrelated.name in names
    assert not any(f"-p{child.pid}-" in name for name in names)


def test_a_directory_killed_before_its_marker_is_still_removed(tmp_path, monkeypatch):
    """A kill between ``mkdir`` and the marker's write leaves only a staging directory, and
    its name says whose it is: the next parsearch removes it once that owner is dead."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempdirs.tempfile, "tempdir", None)  # re-read TMPDIR
    code = (  # the state the kill leaves: the staging directory made, the marker not yet
        "import tempfile, time\n"
        "from parsearch import tempdirs\n"
        "from parsearch.store.liveness import process_identity\n"
        "tempfile.mkdtemp(prefix=tempdirs._staging_prefix(process_identity()))\n"
        "print('made', flush=True)\n"
        "time.sleep(600)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "made"
    [staging] = list(tmp_path.iterdir())
    assert staging.name.startswith(f".parsearch-staging-p{child.pid}-"), staging.name
    mine = tempdirs.owned_tempdir("local")
    assert staging.exists(), "a live owner's staging directory was removed"
    assert (mine / ".parsearch-owner").read_text() == process_identity()
    child.send_signal(signal.SIGKILL)
    child.wait(30)
    tempdirs.owned_tempdir("local")
    names = sorted(p.name for p in tmp_path.iterdir())
    assert staging.name not in names and mine.name in names, names
    assert not any(name.startswith(".parsearch-staging") for name in names), names


def test_a_staging_name_from_another_namespace_is_never_judged(tmp_path):
    """A staging directory whose namespace digest is not ours (another host or container
    sharing TMPDIR) proves nothing about its pid here, and stays."""
    exited = subprocess.Popen(["true"])  # a pid that no process here holds now
    exited.wait(30)
    foreign = tmp_path / f".parsearch-staging-p{exited.pid}-0123456789ab-42-abcdefgh"
    foreign.mkdir()
    assert tempdirs.remove_dead_owners(tmp_path) == []
    assert foreign.exists()
