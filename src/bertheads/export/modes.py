"""Inference modes: a runtime (any registered in `base/runtimes.py`: torch, ONNX Runtime,
OpenVINO) and a precision (fp32, bf16, fp16, int8) on a device, which of them this machine can
run, and what `auto` picks.

`auto` walks the modes every registered runtime offers on this machine, fastest first (each
`Offer`'s rank), and takes the first whose runtime and graph are there and whose lower
precision passed the gate (`export/gate.py`); torch fp32 ends every list, so a model with no
export and no gate record runs as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bertheads.base.errors import UserError
from bertheads.base.machine import Machine, machine
from bertheads.base.runtimes import RUNTIMES, runs, runtime_choice, runtime_named
from bertheads.base.schema import said, setting

PRECISIONS = ("auto", "fp32", "bf16", "fp16", "int8")
# how far a lower precision's main dev metric may fall below fp32's, in points (a gain never refuses)
TOLERANCE = {"bf16": 0.3, "fp16": 0.3, "int8": 0.5}
# the least share of inputs whose prediction (scores left out) must be fp32's: measured on SST-2 dev,
# bf16 keeps 99.8-99.9% and int8 97.5-97.8% of the labels; a broken kernel keeps far fewer
AGREEMENT = {"bf16": 0.99, "fp16": 0.99, "int8": 0.97}
# below this many labelled inputs per head, a lower precision is not used: a metric on a handful of
# inputs says nothing about the rest
MIN_INPUTS = 200


@dataclass
class RuntimeSettings:
    """How a saved model runs (the runtime flags of predict, evaluate, analyze and serve, and
    `load`'s keywords)."""

    device: str = setting("auto", "auto (the first GPU when there is one, else MPS, else the CPU), cpu, cuda, cuda:N "
                                  "or mps", group="runtime")
    runtime: str = setting("auto", "torch, onnx (ONNX Runtime) or openvino, the last two on DIR/onnx/ (`bertheads "
                                   "export DIR --to onnx`); auto: the fastest here that passed the gate",
                           type=runtime_choice, group="runtime")
    precision: str = setting("auto", "fp32, bf16 (GPU, or a CPU with AMX/AVX512_BF16), fp16 (GPU), int8 (onnx, "
                                     "openvino); a lower one is first checked against fp32 on the model's dev data",
                             choices=PRECISIONS, group="runtime")
    gate_data: str | None = setting(None, "labelled file a lower precision is checked on (default: the model's own "
                                          "dev file, when it lies inside the model folder)", group="runtime")
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
    """The modes worth trying on `device`, fastest first: (runtime, precision, why), from every
    registered runtime whose package is here."""
    m = fake or machine()
    offered = [(offer.rank, (runtime.name, offer.precision, offer.why)) for runtime in RUNTIMES.values()
               if runtime.installed(m.installed) for offer in runtime.offers(device, m)]
    return [mode for _, mode in sorted(offered, key=lambda o: o[0])]


def check_mode(runtime: str, precision: str, device: torch.device, fake: Machine | None = None) -> None:
    """Refuse, with one line, a mode this machine (or the runtime) cannot run."""
    m = fake or machine()
    named = runtime_named(runtime) if runtime != "auto" else None
    if precision not in PRECISIONS:
        raise UserError(f"{said('precision')}: expected one of {', '.join(PRECISIONS)}, got {precision!r}")
    if named is not None:
        refusal = named.refusal(precision, device)
        if refusal:
            raise UserError(refusal)
        if not named.installed(m.installed):
            raise UserError(f"{said('runtime', runtime)} needs {named.missing}")
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
        return [(runtime, precision, "asked for")]
    if runtime != "auto":
        check_mode(runtime, "fp32", device, fake)
    elif precision not in PRECISIONS:
        check_mode("auto", precision, device, fake)
    out = [c for c in fastest_first(device, fake)
           if runtime in ("auto", c[0]) and precision in ("auto", c[1])]
    if runtime != "auto" and precision == "auto" and (runtime, "fp32") not in [c[:2] for c in out]:
        # the runtime's own fp32 ends its list: what runs when its faster graphs are missing or refused
        out.append((runtime, "fp32", f"{runtime} fp32: no faster {runtime} mode on this machine passed"))
    if precision != "auto" and not out:
        fallback = runs(precision)[0].name  # the first runtime registered that runs it
        check_mode(fallback, precision, device, fake)
        out.append((fallback, precision, "asked for"))
    return out
