"""Inference modes: a runtime (torch, ONNX Runtime, OpenVINO) and a precision (fp32, bf16,
fp16, int8) on a device, which of them this machine can run, and what `auto` picks.

`auto` walks the modes this machine runs fastest, first to last, and takes the first whose
runtime and graph are there and whose lower precision passed the gate (`export/gate.py`);
torch fp32 ends every list, so a model with no export and no gate record runs as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bertheads.base.errors import UserError
from bertheads.base.machine import Machine, machine
from bertheads.base.schema import said, setting

RUNTIMES = ("auto", "torch", "onnx", "openvino")
PRECISIONS = ("auto", "fp32", "bf16", "fp16", "int8")
# how far a lower precision's main dev metric may fall below fp32's, in points (a gain never refuses)
TOLERANCE = {"bf16": 0.3, "fp16": 0.3, "int8": 0.5}
# the least share of inputs whose prediction (scores left out) must be fp32's: measured on SST-2 dev,
# bf16 keeps 99.8-99.9% and int8 97.5-97.8% of the labels; a broken kernel keeps far fewer
AGREEMENT = {"bf16": 0.99, "fp16": 0.99, "int8": 0.97}
# below this many labelled inputs per head, a lower precision is not used: a metric on a handful of
# inputs says nothing about the rest
MIN_INPUTS = 200
# the graph of DIR/onnx/ each exported mode reads (export.json "graphs")
GRAPH_OF = {("onnx", "fp32"): "fp32", ("onnx", "int8"): "int8",
            ("openvino", "fp32"): "fp32", ("openvino", "bf16"): "fp32", ("openvino", "int8"): "qdq"}


@dataclass
class RuntimeSettings:
    """How a saved model runs (the runtime flags of predict, evaluate, analyze and serve, and
    `load`'s keywords)."""

    device: str = setting("auto", "auto (the first GPU when there is one, else MPS, else the CPU), cpu, cuda, cuda:N "
                                  "or mps", group="runtime")
    runtime: str = setting("auto", "torch, onnx (ONNX Runtime) or openvino, the last two on DIR/onnx/ (`bertheads "
                                   "export DIR --to onnx`); auto: the fastest here that passed the gate",
                           choices=RUNTIMES, group="runtime")
    precision: str = setting("auto", "fp32, bf16 (GPU, or a CPU with AMX/AVX512_BF16), fp16 (GPU), int8 (onnx, "
                                     "openvino); a lower one is first checked against fp32 on the model's dev data",
                             choices=PRECISIONS, group="runtime")
    gate_data: str | None = setting(None, "labelled file a lower precision is checked on (default: the model's own "
                                          "dev file)", group="runtime")
    verify: bool = setting(True, "load encoder weights that differ from the saved hash", negate=True, group="runtime")
    force: bool = setting(False, "run the --precision asked for even when its check against fp32 failed (with a "
                                 "warning: its figures differ from fp32's by more than the tolerance)",
                          group="runtime")
    verbose: bool = setting(True, "from Python: what the model does (the mode chosen, the gate, progress) on stderr "
                                  "at INFO when logging is not set up (False: warnings only)", cli=False)
    encoder: str | None = setting(None, "the checkpoint folder of a head-only model, when its encoder is outside the "
                                        "model folder (its weights must still hash to the recorded value)",
                                  group="runtime")


@dataclass(frozen=True)
class Mode:
    """One way to run a model, and why it was chosen."""

    runtime: str
    precision: str
    device: torch.device
    why: str = ""

    @property
    def key(self) -> str:
        return f"{self.runtime}/{self.precision}"

    def text(self) -> str:
        return f"{said('runtime', self.runtime)} {said('precision', self.precision)} on {self.device}"


def fastest_first(device: torch.device, fake: Machine | None = None) -> list[tuple[str, str, str]]:
    """The modes worth trying on `device`, fastest first: (runtime, precision, why)."""
    m = fake or machine()
    if device.type == "cuda":
        half = ("torch", "bf16", "the GPU's bf16 units") if m.cuda_bf16 else ("torch", "fp16", "the GPU's fp16 units")
        return [half, ("torch", "fp32", "fp32 on the GPU")]
    if device.type != "cpu":
        return [("torch", "fp32", f"fp32 on {device.type}")]
    out = []
    ov = "openvino" in m.installed
    if m.cpu_int8 and ov:
        out.append(("openvino", "int8", "OpenVINO's int8 kernels use the CPU's " + int8_units(m)))
    onnx_int8 = ("onnx", "int8", "ONNX Runtime's int8 kernels use the CPU's " + int8_units(m))
    # without AMX, bf16 dot products (AVX512_BF16) do half the work per instruction of int8 ones
    # (VNNI): ONNX Runtime's int8 comes before OpenVINO's bf16 there
    int8_before_bf16 = "amx_bf16" not in m.flags and m.cpu_int8 and "onnxruntime" in m.installed
    if int8_before_bf16:
        out.append(onnx_int8)
    if m.cpu_bf16 and ov:
        out.append(("openvino", "bf16", "OpenVINO's bf16 kernels use the CPU's " + bf16_units(m)))
    if m.cpu_int8 and "onnxruntime" in m.installed and not int8_before_bf16:
        out.append(onnx_int8)
    if m.cpu_bf16:
        out.append(("torch", "bf16", "torch's bf16 kernels use the CPU's " + bf16_units(m)))
    fp32_why = ("this CPU has no bf16 or int8 units (flags: " + m.flag_text() + "): torch fp32, the default path"
                if not (m.cpu_bf16 or m.cpu_int8) else "torch fp32: no faster mode passed")
    out.append(("torch", "fp32", fp32_why))
    return out


def bf16_units(m: Machine) -> str:
    return "AMX" if "amx_bf16" in m.flags else "AVX512_BF16"


def int8_units(m: Machine) -> str:
    return "AMX" if "amx_int8" in m.flags else ("AVX512_VNNI" if "avx512_vnni" in m.flags else "AVX_VNNI")


def check_mode(runtime: str, precision: str, device: torch.device, fake: Machine | None = None) -> None:
    """Refuse, with one line, a mode this machine (or the runtime) cannot run."""
    m = fake or machine()
    if runtime not in RUNTIMES:
        raise UserError(f"{said('runtime')}: expected one of {', '.join(RUNTIMES)}, got {runtime!r}")
    if precision not in PRECISIONS:
        raise UserError(f"{said('precision')}: expected one of {', '.join(PRECISIONS)}, got {precision!r}")
    if runtime == "torch":
        if precision == "int8":
            raise UserError(f"{said('precision', 'int8')} needs {said('runtime', 'onnx')} or openvino (the torch runtime "
                            f"runs fp32, bf16 or fp16)")
        if precision == "fp16" and device.type != "cuda":
            raise UserError(f"{said('precision', 'fp16')}: only on a CUDA device (this runs on {device})")
    if runtime == "onnx" and precision in ("bf16", "fp16"):
        raise UserError(f"{said('precision', precision)}: the ONNX Runtime graphs are fp32 and int8; use "
                        f"{said('runtime', 'openvino')} or torch")
    if runtime == "openvino":
        if device.type != "cpu":
            raise UserError(f"{said('runtime', 'openvino')}: runs on the CPU here, not {device}; use {said('device', 'cpu')}")
        if precision == "fp16":
            raise UserError(f"{said('precision', 'fp16')}: not with {said('runtime', 'openvino')} on a CPU; use bf16 or int8")
        if "openvino" not in m.installed:
            raise UserError(f"{said('runtime', 'openvino')} needs the openvino package: pip install 'bertheads[export]'")
    if runtime == "onnx" and "onnxruntime" not in m.installed:
        raise UserError(f"{said('runtime', 'onnx')} needs the export extra: pip install 'bertheads[export]'")
    if precision == "bf16" and device.type == "cpu" and not m.cpu_bf16:
        raise UserError(f"{said('precision', 'bf16')}: this CPU has neither AMX nor AVX512_BF16 (flags: {m.flag_text()}); bf16 "
                        f"would be emulated, slower than fp32; use fp32 or auto")
    if precision == "bf16" and device.type == "cuda" and not m.cuda_bf16:
        raise UserError(f"{said('precision', 'bf16')}: this GPU has no bf16; use fp16 or auto")


def candidates(runtime: str, precision: str, device: torch.device,
               fake: Machine | None = None) -> list[tuple[str, str, str]]:
    """The modes `--runtime`/`--precision` (either may be auto) allow on `device`, fastest
    first. Both given: that one mode, checked (a UserError when it cannot run here)."""
    if runtime != "auto" and precision != "auto":
        check_mode(runtime, precision, device, fake)
        if runtime != "torch" and (runtime, precision) not in GRAPH_OF:
            raise UserError(f"{said('runtime', runtime)} {said('precision', precision)}: not a mode bertheads has")
        return [(runtime, precision, "asked for")]
    if runtime != "auto":
        check_mode(runtime, "fp32", device, fake)
    elif precision not in PRECISIONS:
        check_mode("torch", precision, device, fake)
    out = [c for c in fastest_first(device, fake)
           if runtime in ("auto", c[0]) and precision in ("auto", c[1])]
    if runtime != "auto" and precision == "auto" and (runtime, "fp32") not in [c[:2] for c in out]:
        # the runtime's own fp32 ends its list: what runs when its faster graphs are missing or refused
        out.append((runtime, "fp32", f"{runtime} fp32: no faster {runtime} mode on this machine passed"))
    if precision != "auto" and not out:
        fallback = "torch" if precision != "int8" else "onnx"
        check_mode(fallback, precision, device, fake)
        out.append((fallback, precision, "asked for"))
    return out
