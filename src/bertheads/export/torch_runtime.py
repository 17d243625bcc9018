"""The torch runtime: the saved model itself (`model.BertHeads`), its encoder's weights cast to
bf16 or fp16 for those precisions. Its fp32 is what the gate measures every other mode against."""

from __future__ import annotations

from pathlib import Path

import torch

from bertheads.base.machine import DTYPES, Machine
from bertheads.base.runtimes import LAST, Offer, Runtime, runs
from bertheads.base.schema import said
from bertheads.export.modes import Mode
from bertheads.model import BertHeads
from bertheads.saved import bundle

PRECISIONS = ("fp32", "bf16", "fp16")


def open_torch(directory: Path, mode: Mode, verify: bool, reference: BertHeads | None = None) -> BertHeads:
    """The saved model on `mode`'s device in its precision (`reference`: the model, loaded already)."""
    net = reference if reference is not None else bundle.load(directory, mode.device, verify)
    net.to(mode.device)
    net.set_inference_dtype(DTYPES.get(mode.precision))
    return net


def torch_offers(device: torch.device, m: Machine) -> list[Offer]:
    """bf16 (fp16 on a GPU without it) where the device has the units, then fp32."""
    if device.type == "cuda":
        half = Offer("bf16", 1, "the GPU's bf16 units") if m.cuda_bf16 else Offer("fp16", 1, "the GPU's fp16 units")
        return [half, Offer("fp32", LAST, "fp32 on the GPU")]
    if device.type != "cpu":
        return [Offer("fp32", LAST, f"fp32 on {device.type}")]
    out = [Offer("bf16", 5, "torch's bf16 kernels use the CPU's " + m.bf16_units)] if m.cpu_bf16 else []
    fp32_why = ("this CPU has no bf16 or int8 units (flags: " + m.flag_text() + "): torch fp32, the default path"
                if not (m.cpu_bf16 or m.cpu_int8) else "torch fp32: no faster mode passed")
    return [*out, Offer("fp32", LAST, fp32_why)]


def torch_refusal(precision: str, device: torch.device) -> str | None:
    """A precision torch has no kernels for (int8: the runtimes that run it), fp16 off a GPU."""
    others = [r.name for r in runs(precision)]
    if precision not in PRECISIONS and others:
        return (f"{said('precision', precision)} needs {said('runtime', others[0])}{''.join(' or ' + o for o in others[1:])}"
                f" (the torch runtime runs {', '.join(PRECISIONS[:-1])} or {PRECISIONS[-1]})")
    if precision == "fp16" and device.type != "cuda":
        return f"{said('precision', 'fp16')}: only on a CUDA device (this runs on {device})"
    return None


def torch_about() -> dict:
    return {"version": torch.__version__}


TORCH = Runtime("torch", precisions=PRECISIONS, devices=("cpu", "cuda", "mps"), open=open_torch,
                offers=torch_offers, refuse=torch_refusal, about=torch_about, reference=True)
