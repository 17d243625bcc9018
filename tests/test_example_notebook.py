"""examples/notebook.ipynb, the notebook tutorial, run on a real Jupyter kernel (nbclient,
ipykernel) with a tiny random checkpoint: every cell runs, progress shows in the notebook (a bar
and bertheads' lines, though its stderr is no terminal), one text gives one prediction, and
`verbose=False` is quiet."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import bertheads

pytestmark = pytest.mark.slow
nbclient = pytest.importorskip("nbclient", reason="nbclient is in the test extra")
nbformat = pytest.importorskip("nbformat", reason="nbformat is in the test extra")
pytest.importorskip("ipykernel", reason="ipykernel is in the test extra")

ROOT = Path(__file__).resolve().parents[1]


def texts(cell, name: str | None = None) -> str:
    """A cell's outputs as text: its streams (stdout or stderr), results and widgets' kinds."""
    out = []
    for o in cell.get("outputs", []):
        if o["output_type"] == "stream" and name in (None, o["name"]):
            out.append(o["text"])
        elif o["output_type"] in ("execute_result", "display_data") and name is None:
            out.append(o["data"].get("text/plain", ""))
            if "application/vnd.jupyter.widget-view+json" in o["data"]:
                out.append("<widget>")
    return "".join(out)


def test_the_example_notebook_runs_on_a_jupyter_kernel(tiny_bert, tmp_path, monkeypatch):
    shutil.copytree(ROOT / "examples" / "sentiment", tmp_path / "examples" / "sentiment")
    notebook = nbformat.read(ROOT / "examples" / "notebook.ipynb", as_version=4)
    monkeypatch.setenv("BERTHEADS_NOTEBOOK_MODEL", tiny_bert)
    monkeypatch.setenv("BERTHEADS_NOTEBOOK_EPOCHS", "1")
    monkeypatch.setenv("PYTHONPATH", str(Path(bertheads.__file__).parents[1]))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    client = nbclient.NotebookClient(notebook, timeout=240, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path / "examples")}})
    client.execute()  # a failing cell raises CellExecutionError
    cells = {c.source.splitlines()[0]: c for c in notebook.cells if c.cell_type == "code"}
    training = cells["losses, accuracy = [], []"]
    shown = texts(training, "stderr") + texts(training)
    # a bar for the epoch (tqdm's widget, or its text bar) and the dev evaluation, though stderr is no terminal
    assert "<widget>" in shown or "epoch 1/1: 100%" in shown, shown
    assert "bertheads: epoch 1: classify: accuracy=" in shown  # the API logs at INFO by default
    assert "steps; dev accuracy by epoch: [(1, " in texts(training, "stdout")
    answer = texts(cells["print(model.labels)       # {head: labels}"])
    assert "{'classify': ['negative', 'positive']}" in answer
    assert "{'label': " in answer and "[{'label'" not in answer  # one text, one prediction
    assert "'mode': 'torch fp32 on cpu'" in texts(cells['metrics = model.evaluate("sentiment/dev.tsv")'])
    quiet = texts(cells['quiet = bertheads.load("../runs/notebook", verbose=False)'], "stderr")
    assert all(line.startswith("bertheads: warning:") for line in quiet.splitlines()
               if line.startswith("bertheads:")), quiet  # warnings only (a tiny model's learned nothing)
    assert (tmp_path / "runs" / "notebook" / "MLmodel").is_file()
