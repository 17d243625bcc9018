"""The OpenVINO path: a saved model's heads run from its export (`DIR/onnx/`) by OpenVINO on the
CPU, in fp32, bf16 (the fp32 graph with bf16 inference, on CPUs with AMX or AVX512_BF16) or int8
(the static QDQ graph that `bertheads export --quantize int8` writes). The fp32 graph is the
OpenVINO IR the export converted from torch (`model.xml`), or the ONNX graph in an export that
has none (made where openvino was not installed).

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
from bertheads.base.machine import Machine, machine
from bertheads.base.runtimes import Offer, Runtime
from bertheads.base.schema import said
from bertheads.export.modes import Mode
from bertheads.export.onnx_runtime import OnnxNet, OnnxSettings, export_command
from bertheads.text.encoding import Feature, encoder_batch

# --precision -> the export's graph (fp32 and bf16: the OpenVINO IR, or the ONNX graph of an
# export without one)
GRAPHS = {"fp32": ("openvino", "fp32"), "bf16": ("openvino", "fp32"), "int8": "qdq"}
MISSING = "the openvino package: pip install 'bertheads[export]'"


# OpenVINO's CPU plugin fuses each attention into one generated kernel ("snippets"). On AMX that
# kernel is slower than separate products below about 48 tokens a row and faster above
# (bench/openvino_probe.py --lengths), so batches up to this length run on a second compilation
# with snippets off. CPUs where it was not measured keep OpenVINO's default.
SHORT_LENGTHS = {"amx_bf16": 48}
SHORT_CONFIG = {"SNIPPETS_MODE": "DISABLE"}  # a CPU plugin setting not among its listed properties


def short_length(here) -> int:
    """Up to how many tokens a row a batch runs with attention snippets off on this CPU (0: never)."""
    return max((n for flag, n in SHORT_LENGTHS.items() if flag in here.flags), default=0)


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
        self.core = openvino.Core()
        self.config = {"INFERENCE_PRECISION_HINT": self.hint, "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1",
                       "INFERENCE_NUM_THREADS": str(threads)}
        graph = self.core.read_model(str(path))
        self.compiled = self.core.compile_model(graph, "CPU", self.config)
        # for the second compilation: the IR's weights are mapped from its file, so keeping the
        # model costs no memory and both compilations share those pages; an ONNX graph's are
        # copies in memory, so it is read again when needed
        self.graph, self.graph_path = (graph if path.suffix == ".xml" else None), str(path)
        self.short_compiled = None  # compiled at the first short batch
        self.short_length = short_length(machine()) if self.settings.precision != "int8" else 0
        self.input_names = [i.get_any_name() for i in self.compiled.inputs]
        self.output_names = [o.get_any_name() for o in self.compiled.outputs]
        return set(self.output_names)

    def short(self):
        """The graph compiled for short batches (attention snippets off), or None where this
        OpenVINO does not take the setting."""
        if self.short_compiled is None:
            try:
                graph = self.graph or self.core.read_model(self.graph_path)
                self.short_compiled = self.core.compile_model(graph, "CPU", {**self.config, **SHORT_CONFIG})
            except RuntimeError:
                self.short_length = 0
        return self.short_compiled

    def request(self, length: int = 0):
        """This thread's infer request for a batch of `length` tokens a row (requests are not
        shared between threads)."""
        which = "short" if 0 < length <= self.short_length and self.short() is not None else "long"
        req = getattr(self.local, which, None)
        if req is None:
            req = (self.short_compiled if which == "short" else self.compiled).create_infer_request()
            setattr(self.local, which, req)
        return req

    def run_batch(self, features: Sequence[Feature], rows: Sequence[int], heads: Sequence[str],
                  with_loss: bool = False) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """Each head's outputs for a batch; the graph gives no loss."""
        batch = encoder_batch(features, self.pad_id, torch.device("cpu"))
        req = self.request(batch["input_ids"].shape[1])
        req.infer({k: batch[k].numpy() for k in self.input_names})
        return {name: np.array(req.get_tensor(name).data, dtype=np.float32) for name in heads}, {}


def load_openvino(directory: str | Path, precision: str = "fp32", settings: OnnxSettings | None = None) -> OpenVinoNet:
    """The OpenVINO model of a saved model directory (its `DIR/onnx/` export)."""
    if precision not in GRAPHS:
        raise UserError(f"{said('runtime', 'openvino')} {said('precision', precision)}: expected fp32, bf16 or int8")
    require("export", said("runtime", "openvino"))
    if importlib.util.find_spec("openvino") is None:
        raise UserError(f"{said('runtime', 'openvino')} needs {MISSING}")
    settings = settings or OnnxSettings()
    settings.precision = precision
    return OpenVinoNet(directory, settings)


def open_openvino(directory: Path, mode: Mode, verify: bool, reference=None) -> OpenVinoNet:
    """`mode`'s OpenVINO compiled model of the export (`reference`, a torch model, is not used)."""
    return load_openvino(directory, mode.precision, OnnxSettings(device=str(mode.device), verify=verify))


def openvino_offers(device: torch.device, m: Machine) -> list[Offer]:
    """int8 and bf16 on a CPU with those units; bf16 after ONNX Runtime's int8 without AMX."""
    if device.type != "cpu":
        return []
    out = [Offer("int8", 1, "OpenVINO's int8 kernels use the CPU's " + m.int8_units)] if m.cpu_int8 else []
    if m.cpu_bf16:
        # without AMX, bf16 dot products (AVX512_BF16) do half the work per instruction of int8 ones (VNNI)
        out.append(Offer("bf16", 2 if "amx_bf16" in m.flags else 4, "OpenVINO's bf16 kernels use the CPU's " + m.bf16_units))
    return out


def openvino_refusal(precision: str, device: torch.device) -> str | None:
    if device.type != "cpu":
        return f"{said('runtime', 'openvino')}: runs on the CPU here, not {device}; use {said('device', 'cpu')}"
    if precision == "fp16":
        return f"{said('precision', 'fp16')}: not with {said('runtime', 'openvino')} on a CPU; use bf16 or int8"
    return None


def openvino_about() -> dict:
    import openvino

    core = openvino.Core()
    devices = {d: core.get_property(d, "OPTIMIZATION_CAPABILITIES") for d in core.available_devices}
    return {"version": openvino.__version__, "devices": {d: list(c) for d, c in devices.items()}}


OPENVINO = Runtime("openvino", precisions=tuple(GRAPHS), devices=("cpu",), open=open_openvino, offers=openvino_offers,
                   graphs={"fp32": "fp32", "bf16": "fp32", "int8": "qdq"}, export=export_command, package="openvino",
                   missing=MISSING, refuse=openvino_refusal, about=openvino_about)
