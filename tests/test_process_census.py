"""The suite's clean-up of the mpich segments its killed MPI jobs leave in /dev/shm: only
the unmapped ones made during the run go (``conftest.pytest_sessionfinish``)."""

from __future__ import annotations

import mmap
import os
import time

import pytest
from process_census import SEGMENT_PREFIX, SHM, orphaned_segments

pytestmark = pytest.mark.skipif(not os.path.isdir(SHM), reason="no /dev/shm here")


@pytest.fixture
def segments():
    stem = f"census_test_{os.getpid()}_"
    paths = {role: os.path.join(SHM, f"{SEGMENT_PREFIX}{stem}{role}") for role in
             ("mapped", "orphaned", "older")}  # fmt: skip
    paths["other"] = os.path.join(SHM, f"not_mpich_{stem}other")
    for path in paths.values():
        with open(path, "wb") as file:
            file.write(b"\0" * mmap.PAGESIZE)
    yield paths
    for path in paths.values():
        if os.path.exists(path):
            os.unlink(path)


def test_only_unmapped_segments_made_since_the_start_are_orphaned(segments):
    since = time.time() - 60
    old = since - 3600
    os.utime(segments["older"], (old, old))
    with open(segments["mapped"], "r+b") as file, mmap.mmap(file.fileno(), 0):
        found = set(orphaned_segments(since))
    ours = {path for path in found if f"census_test_{os.getpid()}_" in path}
    assert ours == {segments["orphaned"]}
