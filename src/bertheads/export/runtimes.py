"""Opening the runner of a mode (`modes.Mode`): the torch model, its encoder's weights cast to
bf16 or fp16 for those precisions, or an ONNX Runtime or OpenVINO session of the export."""

from __future__ import annotations

import json
from pathlib import Path

from bertheads.base.machine import DTYPES
from bertheads.export.modes import Mode
from bertheads.export.onnx import META, ONNX_DIR
from bertheads.export.onnx_runtime import OnnxSettings, load_onnx
from bertheads.export.openvino_runtime import load_openvino
from bertheads.saved import bundle


def has_graph(directory: Path, graph: str) -> bool:
    path = directory / ONNX_DIR / META
    try:
        return graph in json.loads(path.read_text()).get("graphs", {})
    except (OSError, ValueError):
        return False


def open_runner(directory: Path, mode: Mode, verify: bool, reference=None):
    """The runner of `mode` (torch: the model, its encoder's weights in bf16/fp16 for those
    precisions; onnx, openvino: a session of the export)."""
    if mode.runtime == "torch":
        net = reference if reference is not None else bundle.load(directory, mode.device, verify)
        net.to(mode.device)
        net.set_inference_dtype(DTYPES.get(mode.precision))
        return net
    settings = OnnxSettings(device=str(mode.device), verify=verify)
    if mode.runtime == "onnx":
        return load_onnx(directory, mode.precision, settings)
    return load_openvino(directory, mode.precision, settings)
