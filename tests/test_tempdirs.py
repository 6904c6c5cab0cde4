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
