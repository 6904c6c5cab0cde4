"""``notebooks/analysis.ipynb`` runs headless, top to bottom, on a store made here.

The notebook reads its store from ``PARSEARCH_STORE``; the kernel inherits this process's
environment, so the test points it at a fresh simulated campaign.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).parent.parent
NOTEBOOK = ROOT / "notebooks" / "analysis.ipynb"


def test_notebook_is_committed_without_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(not cell.outputs and cell.execution_count is None for cell in code)
    assert "parameters" in code[0].metadata.get("tags", [])


def test_notebook_executes_against_a_simulated_campaign(tmp_path, monkeypatch):
    store = tmp_path / "campaign.db"
    space = ROOT / "search_spaces" / "gpt-175b-frontier.yaml"
    ran = subprocess.run(
        [sys.executable, "-m", "parsearch", "run", str(space), "--store", str(store),
         "--backend", "simulate", "--budget", "30", "--strategy", "random",
         "--keep-predicted-oom", "--quiet"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    monkeypatch.setenv("PARSEARCH_STORE", str(store))
    monkeypatch.delenv("PARSEARCH_CAMPAIGN", raising=False)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=180, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
    )
    client.execute()  # raises CellExecutionError, with the cell and traceback, on failure
    outputs = [output for cell in notebook.cells for output in cell.get("outputs", [])]
    images = [output for output in outputs if "image/png" in output.get("data", {})]
    assert len(images) >= 5  # the four report figures and the sliced heat map
    text = "".join(output.get("text", "") for output in outputs)
    assert "campaign 'gpt-175b-frontier'" in text
    assert "--tensor-model-parallel-size" in text  # the best layout's exports
