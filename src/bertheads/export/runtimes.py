"""Opening the runner of a mode (`modes.Mode`) through its registered runtime
(`base/runtimes.py`), and whether the model's export has the graph a mode reads."""

from __future__ import annotations

from pathlib import Path

from bertheads.base.bounded import read_json
from bertheads.base.errors import UserError
from bertheads.base.runtimes import runtime_named
from bertheads.export.modes import Mode
from bertheads.export.onnx import META, ONNX_DIR


def has_graph(directory: Path, graph: str) -> bool:
    path = directory / ONNX_DIR / META
    try:
        meta = read_json(path) if path.is_file() else {}
    except UserError:  # opening the model says what is wrong with it
        return False
    return isinstance(meta, dict) and isinstance(meta.get("graphs"), dict) and graph in meta["graphs"]


def missing_export(directory: Path, runtime: str, precision: str) -> str | None:
    """The command that writes the graph `runtime` reads for `precision`, when the model's export
    lacks it (None: it is there, or the runtime runs the saved weights)."""
    named = runtime_named(runtime)
    graph = named.graphs.get(precision)
    if graph is None or has_graph(directory, graph):
        return None
    return named.export(directory, precision) if named.export else f"no {graph} graph"


def open_runner(directory: Path, mode: Mode, verify: bool, reference=None):
    """The runner of `mode`, opened by its runtime (`reference`: the torch fp32 model when one is
    loaded already, which the torch runtime casts and uses)."""
    return runtime_named(mode.runtime).open(directory, mode, verify, reference)
