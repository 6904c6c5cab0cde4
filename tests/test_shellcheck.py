"""The job scripts (jobs/) and the setup scripts (scripts/) pass shellcheck: they run where
nobody watches them (a batch node, a fresh CI machine), so a quoting slip or an unset
variable must show up here. A finding that is not a fault is disabled on its line, with why.

shellcheck is a Debian package (scripts/system-packages.sh installs it); without it the test
skips and says so, except on CI (``CI`` set), where it must run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
SCRIPTS = ("jobs/*.sh", "jobs/*.sbatch", "jobs/*.pbs", "jobs/sites/*.sh", "scripts/*.sh")


def test_job_and_setup_scripts_pass_shellcheck():
    if shutil.which("shellcheck") is None:
        reason = "shellcheck is not installed (scripts/system-packages.sh installs it)"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set: {reason}")
        pytest.skip(reason)
    files = sorted(str(path.relative_to(ROOT)) for glob in SCRIPTS for path in ROOT.glob(glob))
    assert len(files) >= 10, files
    # -x follows the `source` lines (jobs/chain.sh), named relative to the repository root.
    checked = subprocess.run(
        ["shellcheck", "-x", *files], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
