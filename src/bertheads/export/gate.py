"""The gate before a lower precision is used: its outputs against fp32's on the model's own dev
data (or a sample the user gives), and the verdict stored with the model.

```
DIR/gate.json   {"manifest_sha256", "modes": {"openvino/bf16": {"passed", "tolerance_points",
                 "heads": {NAME: {"data", "examples", "metric", "fp32", "value",
                 "change_points", "label_agreement"}}, "export_sha256", "machine"}}}
```
`export_checked` is `bertheads export --to onnx`: the graphs, then each lower precision of the
export this machine runs put through the gate. A mode passes when every head's main metric moves by at most `modes.TOLERANCE` points (0.3
for bf16 and fp16, 0.5 for int8). Label agreement is the share of inputs whose prediction,
scores left out, is the same as fp32's. A record holds while the model (its manifest and head
weights) and, for an exported mode, the export are the ones it was made on.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path

import torch

from bertheads.base.errors import SystemFault, UserError
from bertheads.base.extras import require
from bertheads.base.machine import machine
from bertheads.export.modes import GRAPH_OF, TOLERANCE, Mode, check_mode
from bertheads.export.onnx import META, ONNX_DIR, export_onnx, manifest_digest
from bertheads.export.runtimes import open_runner
from bertheads.model import head_outputs
from bertheads.saved import bundle
from bertheads.store.atomic import atomic_write_text

log = logging.getLogger("bertheads")

GATE = "gate.json"
GATE_EXAMPLES = 1000  # dev inputs compared per head (the first ones)


def export_digest(directory: Path) -> str | None:
    path = directory / ONNX_DIR / META
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def read_records(directory: Path) -> dict[str, dict]:
    """The stored verdicts that still hold for this model and its export."""
    path = directory / GATE
    try:
        saved = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    if saved.get("manifest_sha256") != manifest_digest(directory):
        return {}
    export = export_digest(directory)
    return {k: v for k, v in saved.get("modes", {}).items()
            if k.startswith("torch/") or v.get("export_sha256") == export}


def store(directory: Path, key: str, record: dict, say: Callable[[str], None]) -> None:
    """Add one verdict to DIR/gate.json (a model directory that cannot be written keeps it in memory)."""
    records = read_records(directory)
    records[key] = record
    text = json.dumps({"manifest_sha256": manifest_digest(directory), "modes": records}, indent=1) + "\n"
    try:
        atomic_write_text(directory / GATE, text)
    except (OSError, SystemFault) as exc:
        say(f"could not write {directory / GATE} ({exc}); the check runs again next time")


def dev_path(manifest: dict, name: str, directory: Path) -> str | None:
    """The dev file a head was trained with, as its saved settings name it (when it is still there)."""
    settings = manifest.get("settings") or {}
    entry = settings.get("tasks", {}).get(name, {}) if "tasks" in settings else settings
    dev = entry.get("dev")
    if not dev:
        return None
    for candidate in (Path(dev), directory / dev):
        if candidate.is_file():
            return str(candidate)
    return None


def gate_data(directory: Path, heads, given: str | None) -> dict[str, str] | None:
    """Each head's data for the gate: `given` (a user sample) or its own dev file; None when
    a head has neither."""
    manifest = bundle.read_manifest(directory)
    out = {}
    for name in heads:
        path = given or dev_path(manifest, name, directory)
        if path is None:
            return None
        out[name] = path
    return out


def without_scores(value):
    """A prediction with its float values (scores) left out: what label agreement compares."""
    if isinstance(value, dict):
        return {k: without_scores(v) for k, v in value.items() if not isinstance(v, float)}
    if isinstance(value, (list, tuple)):
        return [without_scores(v) for v in value if not isinstance(v, float)]
    return value


def compare(reference, candidate, data: dict[str, str], limit: int = GATE_EXAMPLES) -> dict[str, dict]:
    """Each head's main metric and predictions from `candidate` against `reference` (both runners
    holding the same tasks) on the first `limit` labelled inputs of its data."""
    out = {}
    for name, path in data.items():
        task = reference.tasks[name]
        examples = task.read(path, need_labels=True)[:limit]
        if not examples:
            raise UserError(f"{path}: no labelled inputs to check the lower precision on")
        ref = head_outputs(reference, name, examples, progress=f"gate {name}: fp32")
        got = head_outputs(candidate, name, examples, progress=f"gate {name}: lower precision")
        metric = task.main_metric
        ref_value = float(task.metrics(ref, examples)[metric])
        got_value = float(task.metrics(got, examples)[metric])
        scale = 100.0 if abs(ref_value) <= 1 and abs(got_value) <= 1 else 1.0  # fractions as points
        same = [without_scores(a) == without_scores(b)
                for a, b in zip(task.decode(ref, examples), task.decode(got, examples))]
        out[name] = {"data": path, "examples": len(examples), "metric": metric, "fp32": ref_value,
                     "value": got_value, "change_points": (got_value - ref_value) * scale,
                     "label_agreement": sum(same) / len(same)}
    return out


def verdict(directory: Path, mode: Mode, heads: dict[str, dict]) -> dict:
    tolerance = TOLERANCE[mode.precision]
    return {"passed": all(abs(h["change_points"]) <= tolerance for h in heads.values()),
            "tolerance_points": tolerance, "heads": heads, "device": str(mode.device),
            "export_sha256": None if mode.runtime == "torch" else export_digest(directory),
            "machine": machine().line()}


def summary(record: dict) -> str:
    """One line: each head's metric change and label agreement."""
    parts = [f"{name}: {h['metric']} {h['change_points']:+.2f} points, {h['label_agreement']:.1%} same predictions "
             f"on {h['examples']} inputs" for name, h in record["heads"].items()]
    return "; ".join(parts)


def export_checked(directory: str | Path, out: str | Path | None = None, quantize_to: str | None = None,
                   gate_file: str | None = None, say: Callable[[str], None] | None = None) -> dict:
    """`bertheads export --to onnx`: the graphs (int8 calibrated on the dev data), then each
    lower-precision mode of the export this machine runs checked against fp32 (DIR/gate.json)."""
    require("export", "export --to onnx")  # before the model is read: the missing extra is the first thing to say
    directory = Path(directory)
    say = say or log.info
    heads = bundle.read_manifest(directory)["heads"]
    data = gate_data(directory, heads, gate_file)
    meta = export_onnx(directory, out, quantize_to, say, calibration=data)
    if data is None or (out is not None and Path(out).resolve() != (directory / ONNX_DIR).resolve()):
        return meta
    cpu = torch.device("cpu")
    reference = None
    for (runtime, precision), graph in GRAPH_OF.items():
        if precision not in TOLERANCE or graph not in meta["graphs"]:
            continue
        try:
            check_mode(runtime, precision, cpu)
        except UserError:
            continue  # not on this machine (bf16 without AMX/AVX512_BF16, no openvino)
        mode = Mode(runtime, precision, cpu)
        reference = reference or bundle.load(directory, cpu)
        record = verdict(directory, mode, compare(reference, open_runner(directory, mode, True), data))
        store(directory, mode.key, record, say)
        say(f"gate {runtime} {precision}: {'passed' if record['passed'] else 'REFUSED'} ({summary(record)})")
    return meta
