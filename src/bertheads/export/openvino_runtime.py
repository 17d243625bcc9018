"""The OpenVINO path: a saved model's heads run from its ONNX export (`DIR/onnx/`) by OpenVINO
on the CPU, in fp32, bf16 (the fp32 graph with bf16 inference, on CPUs with AMX or
AVX512_BF16) or int8 (the static QDQ graph that `bertheads export --quantize int8` writes).

OpenVINO's inference precision is always set explicitly: left alone, it runs an fp32 graph in
bf16 on CPUs that have bf16 units. `OpenVinoNet` is an `OnnxNet` (tasks, tokenizer, checks)
whose batches run on one OpenVINO compiled model, one infer request on its own thread pool.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from bertheads.base.errors import UserError
from bertheads.base.extras import require
from bertheads.base.machine import machine
from bertheads.base.schema import said
from bertheads.export.onnx_runtime import OnnxNet, OnnxSettings
from bertheads.text.encoding import Feature, encoder_batch

# --precision -> (the export's graph, OpenVINO's INFERENCE_PRECISION_HINT)
GRAPHS = {"fp32": "fp32", "bf16": "fp32", "int8": "qdq"}


def hint_for(precision: str) -> str:
    """The inference precision OpenVINO is told: f32 for fp32, bf16 for bf16; an int8 graph's
    float parts run in bf16 where the CPU has bf16 units, else f32."""
    if precision == "bf16" or (precision == "int8" and machine().cpu_bf16):
        return "bf16"
    return "f32"


class OpenVinoNet(OnnxNet):
    """The tasks of a saved model and an OpenVINO compiled model of its ONNX graph."""

    runtime = "openvino"

    def __init__(self, directory: str | Path, settings: OnnxSettings | None = None) -> None:
        settings = settings or OnnxSettings()
        self.hint = hint_for(settings.precision)
        self.local = threading.local()
        super().__init__(directory, settings, graph=GRAPHS[settings.precision])

    def parallelism(self) -> tuple[int, int]:
        """One worker thread whose infer request uses every CPU thread (OpenVINO's own thread
        pool; requests filled from several Python threads at once can deadlock in its input
        dispatcher)."""
        if self.settings.workers not in (None, 1):
            raise UserError(f"{said('runtime', 'openvino')} runs one batch at a time (its threads are its own)")
        return 1, self.settings.threads or torch.get_num_threads() or 1

    def open(self, path: Path) -> set[str]:
        import openvino

        _, threads = self.parallelism()
        core = openvino.Core()
        config = {"INFERENCE_PRECISION_HINT": self.hint, "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1",
                  "INFERENCE_NUM_THREADS": str(threads)}
        self.compiled = core.compile_model(core.read_model(str(path)), "CPU", config)
        self.input_names = [i.get_any_name() for i in self.compiled.inputs]
        self.output_names = [o.get_any_name() for o in self.compiled.outputs]
        return set(self.output_names)

    def request(self):
        """This thread's infer request (requests are not shared between threads)."""
        req = getattr(self.local, "request", None)
        if req is None:
            req = self.local.request = self.compiled.create_infer_request()
        return req

    def run_batch(self, features: Sequence[Feature], rows: Sequence[int], heads: Sequence[str],
                  with_loss: bool = False) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """Each head's outputs for a batch; the graph gives no loss."""
        batch = encoder_batch(features, self.pad_id, torch.device("cpu"))
        req = self.request()
        req.infer({k: batch[k].numpy() for k in self.input_names})
        return {name: np.array(req.get_tensor(name).data, dtype=np.float32) for name in heads}, {}


def load_openvino(directory: str | Path, precision: str = "fp32", settings: OnnxSettings | None = None) -> OpenVinoNet:
    """The OpenVINO model of a saved model directory (its `DIR/onnx/` export)."""
    if precision not in GRAPHS:
        raise UserError(f"{said('runtime', 'openvino')} {said('precision', precision)}: expected fp32, bf16 or int8")
    require("export", said("runtime", "openvino"))
    if importlib.util.find_spec("openvino") is None:
        raise UserError(f"{said('runtime', 'openvino')} needs the openvino package: pip install 'bertheads[export]'")
    settings = settings or OnnxSettings()
    settings.precision = precision
    return OpenVinoNet(directory, settings)
