"""The ONNX Runtime path: a saved model's heads run from `DIR/onnx/` (written by
`bertheads export DIR --to onnx`) instead of torch.

`OnnxNet` holds the tasks (for reading, encoding and decoding, which stay the same) and the
tokenizer, and is a `compute.runner.Runner`: `model.run_heads` batches, orders and threads its
session calls as it does the torch model's, on single-threaded workers (one per CPU thread).
The encoder's torch weights are never loaded.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bertheads.base.bounded import read_json
from bertheads.base.errors import UserError
from bertheads.base.extras import require
from bertheads.base.machine import Machine, machine
from bertheads.base.runtimes import Offer, Runtime
from bertheads.base.schema import said
from bertheads.compute.batching import MAX_CPU_WORKERS
from bertheads.compute.runner import EncoderInputs
from bertheads.encoder.pretrained import EncoderShape
from bertheads.export.modes import Mode
from bertheads.export.onnx import (
    GRAPHS,
    INPUTS,
    META,
    ONNX_DIR,
    PRECISIONS,
    encoder_digest,
    manifest_digest,
    session,
)
from bertheads.saved import bundle
from bertheads.text.encoding import Feature, encoder_batch


@dataclass
class OnnxSettings:
    """How the session runs. `workers`: batches run side by side on that many threads, each
    with a single-threaded session call (None: one per torch thread, as the torch path);
    `threads`: intra-op threads of the session (None: 1 with several workers, else the torch
    thread count); `device`: cpu, or cuda[:N] (ONNX Runtime's CUDA provider, from
    onnxruntime-gpu)."""

    precision: str = "fp32"
    workers: int | None = None
    threads: int | None = None
    device: str = "cpu"
    verify: bool = True  # the export must match the model's encoder weights (False: --no-verify)


def read_export(directory: Path, graph: str | tuple[str, ...], verify: bool = True) -> tuple[dict, Path]:
    """export.json and the graph `graph` (fp32, int8, qdq, openvino; of several, the first the
    export has, else the last), checked against the model's manifest, heads and (unless `verify`
    is False) encoder weight files."""
    wanted = (graph,) if isinstance(graph, str) else graph
    onnx_dir = directory / ONNX_DIR
    meta_path = onnx_dir / META
    export_cmd = f"bertheads export {directory} --to onnx" + (" --quantize int8" if wanted[-1] in ("int8", "qdq") else "")
    if not meta_path.is_file():
        raise UserError(f"{onnx_dir}: no ONNX export of this model; run `{export_cmd}`")
    meta = read_json(meta_path)  # its shape and graph files checked when the folder was opened
    precision = next((g for g in wanted if g in meta.get("graphs", {})), wanted[-1])
    graph = meta.get("graphs", {}).get(precision)
    if not graph:
        raise UserError(f"{onnx_dir}: no {precision} graph; run `{export_cmd}`")
    if meta.get("manifest_sha256") != manifest_digest(directory):
        raise UserError(f"{onnx_dir}: the ONNX export does not match {directory / bundle.MANIFEST} and the heads "
                        f"(the model changed since it was exported); run `{export_cmd}` again")
    if verify:
        check_export_encoder(directory, meta, meta_path, export_cmd)
    path = onnx_dir / graph.get("file", GRAPHS[precision])
    for needed in (path, *([onnx_dir / graph["weights"]] if graph.get("weights") else [])):
        if not needed.is_file():
            raise UserError(f"{needed}: missing; run `{export_cmd}`")
    here = machine()
    if precision == "int8" and graph.get("quantization", {}).get("reduce_range") is False and here.int8_pairs_saturate:
        raise UserError(f"{path}: its int8 weights use the full 8 bits (exported on a CPU with VNNI or AMX), which "
                        f"this CPU's int8 kernels can overflow (flags: {here.flag_text()}); run `{export_cmd}` here")
    return meta, path


def check_export_encoder(directory: Path, meta: dict, meta_path: Path, export_cmd: str) -> None:
    """The export was made from the encoder the model has now: the manifest's `encoder_hash`
    and the bytes of DIR/encoder's weight files are the ones recorded in export.json."""
    manifest = bundle.read_manifest(directory)
    if meta.get("encoder_hash") != manifest.get("encoder_hash"):
        raise UserError(f"{meta_path}: the export was made from another encoder than {directory / bundle.MANIFEST} "
                        f"names; run `{export_cmd}` again")
    recorded = meta.get("encoder_files_sha256", "missing")
    if recorded == "missing":
        raise UserError(f"{meta_path}: records no hash of the encoder's weight files (an export of an earlier "
                        f"bertheads); run `{export_cmd}` again")
    if recorded != encoder_digest(directory):
        raise UserError(f"{meta_path}: the encoder's weight files in {directory / 'encoder'} changed since the "
                        f"export was made; run `{export_cmd}` again ({said('runtime', 'torch')} checks the weights "
                        f"themselves against the manifest)")


class OnnxNet(EncoderInputs):
    """The tasks of a saved model and an ONNX Runtime session holding its encoder and heads."""

    runtime = "onnx"

    def __init__(self, directory: str | Path, settings: OnnxSettings | None = None,
                 graph: str | tuple[str, ...] | None = None) -> None:
        self.settings = settings or OnnxSettings()
        directory = Path(directory)
        manifest = bundle.read_manifest(directory)
        meta, path = read_export(directory, graph or self.settings.precision, self.settings.verify)
        # what the tasks and callers read of the encoder; its weights are the export's, never loaded
        self.encoder = EncoderShape.read(bundle.encoder_location(directory))
        self.tasks = {}
        for name, entry in manifest["heads"].items():
            cls = bundle.task_class(entry["kind"])
            self.tasks[name] = cls.build(cls.spec_type.from_saved(entry["spec"]), self.encoder)
        self.manifest = manifest
        self.meta = meta
        self.path = path
        self.precision = self.settings.precision
        outputs = self.open(path)
        missing = [n for n in self.tasks if n not in outputs]
        if missing or set(self.input_names) - set(INPUTS):
            raise UserError(f"{path}: the graph does not match the model (heads {', '.join(self.tasks)}; graph "
                            f"outputs {', '.join(sorted(outputs))}); run `bertheads export {directory} --to onnx`")
        self.token_levels = {name: bool(meta["heads"][name]["token_level"]) for name in self.tasks}

    def open(self, path: Path) -> set[str]:
        """Start the runtime on the graph at `path`; the graph's output names."""
        _, threads = self.parallelism()
        self.session = session(path, threads, providers(self.settings.device))
        self.input_names = [i.name for i in self.session.get_inputs()]
        return {o.name for o in self.session.get_outputs()}

    def parallelism(self) -> tuple[int, int]:
        """(workers, intra-op threads per session call)."""
        cpus = torch.get_num_threads() or os.cpu_count() or 1
        if self.device.type != "cpu":
            return 1, cpus
        workers = self.settings.workers or min(cpus, MAX_CPU_WORKERS)
        threads = self.settings.threads or max(1, cpus // workers)
        return workers, threads

    # the `compute.runner.Runner` members: a batch of features through the session
    def evaluating(self) -> AbstractContextManager:
        return nullcontext()  # (a graph has no training mode)

    @property
    def device(self) -> torch.device:
        return torch.device(self.settings.device)

    @property
    def workers(self) -> int:
        return self.parallelism()[0]

    def token_level(self, name: str) -> bool:
        return self.token_levels[name]

    def run_batch(self, features: Sequence[Feature], rows: Sequence[int], heads: Sequence[str],
                  with_loss: bool = False) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """Each head's outputs for a batch; the graph gives no loss."""
        batch = encoder_batch(features, self.pad_id, torch.device("cpu"))
        outputs = self.session.run(list(heads), {k: batch[k].numpy() for k in self.input_names})
        return dict(zip(heads, outputs)), {}


def providers(device: str) -> list[str]:
    """ONNX Runtime's execution providers for `device` (cuda needs onnxruntime-gpu)."""
    if not device.startswith("cuda"):
        return ["CPUExecutionProvider"]
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        raise UserError(f"{said('runtime', 'onnx')} {said('device', str(device))}: this onnxruntime has no CUDA provider; "
                        f"install onnxruntime-gpu, or use {said('runtime', 'torch')}")
    index = device.partition(":")[2] or "0"
    return [("CUDAExecutionProvider", {"device_id": int(index)}), "CPUExecutionProvider"]  # type: ignore[list-item]


def load_onnx(directory: str | Path, precision: str = "fp32", settings: OnnxSettings | None = None) -> OnnxNet:
    """The ONNX Runtime model of a saved model directory (its `DIR/onnx/` export)."""
    if precision not in PRECISIONS:
        raise UserError(f"{said('runtime', 'onnx')} {said('precision', precision)}: the ONNX Runtime graphs are fp32 and int8")
    require("export", said("runtime", "onnx"))
    settings = settings or OnnxSettings()
    settings.precision = precision
    return OnnxNet(directory, settings)


def open_onnx(directory: Path, mode: Mode, verify: bool, reference=None) -> OnnxNet:
    """`mode`'s ONNX Runtime session of the export (`reference`, a torch model, is not used)."""
    return load_onnx(directory, mode.precision, OnnxSettings(device=str(mode.device), verify=verify))


def onnx_offers(device: torch.device, m: Machine) -> list[Offer]:
    """int8 on a CPU with int8 units (on a GPU, ONNX Runtime is used only when asked for)."""
    if device.type != "cpu" or not m.cpu_int8:
        return []
    return [Offer("int8", 3, "ONNX Runtime's int8 kernels use the CPU's " + m.int8_units)]


def onnx_refusal(precision: str, device: torch.device) -> str | None:
    if precision in ("bf16", "fp16"):
        return (f"{said('precision', precision)}: the ONNX Runtime graphs are fp32 and int8; use "
                f"{said('runtime', 'openvino')} or torch")
    return None


def export_command(directory: Path, precision: str) -> str:
    """The command that writes the graph of the export a precision reads."""
    return f"bertheads export {directory} --to onnx{' --quantize int8' if precision == 'int8' else ''}"


def onnx_about() -> dict:
    import onnxruntime

    return {"version": onnxruntime.__version__, "providers": onnxruntime.get_available_providers()}


ONNX = Runtime("onnx", precisions=PRECISIONS, devices=("cpu", "cuda"), open=open_onnx, offers=onnx_offers,
               graphs={"fp32": "fp32", "int8": "int8"}, export=export_command, package="onnxruntime",
               missing="the export extra: pip install 'bertheads[export]'", refuse=onnx_refusal, about=onnx_about)
