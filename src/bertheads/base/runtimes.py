"""The inference runtimes by name: `RUNTIMES` is what `--runtime`, `auto`, the gate and
`bertheads env` read; `register` adds a runtime (a `Runtime`), `unregister` takes one away.
The built-in ones (torch, ONNX Runtime, OpenVINO) are registered in `export/__init__.py`.

The registry sits at the bottom so that `base/machine.py` can read which runtime packages to
look for; what a runtime runs with (its runner, its export) is the library's, held as callables.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bertheads.base.errors import UserError
from bertheads.base.schema import said, unknown_name

# auto's place for a runtime's slowest, surest mode (torch fp32, the default path): after every other
LAST = 100.0


@dataclass(frozen=True)
class Offer:
    """A mode a runtime offers `--runtime auto` on a device: its precision, its place in the
    order (`rank`: lower is tried first; equal ranks keep the registry's order) and why.

    The built-in ranks on a CPU: OpenVINO int8 1, OpenVINO bf16 2 with AMX (4 without: there
    AVX512_BF16 does half the work per instruction of VNNI), ONNX Runtime int8 3, torch bf16 5;
    on a GPU torch bf16 or fp16 1; torch fp32 `LAST` everywhere."""

    precision: str
    rank: float
    why: str


def no_refusal(precision: str, device: torch.device) -> str | None:
    return None


@dataclass(frozen=True)
class Runtime:
    """One way to run a saved model: what it runs, how it is opened and what export it reads."""

    name: str  # its --runtime value
    precisions: tuple[str, ...]  # the precisions it runs
    devices: tuple[str, ...]  # the device types it runs on (cpu, cuda, mps)
    # (directory, mode, verify, reference) -> its runner (`compute.runner.Runner`) of the saved model;
    # reference: the torch fp32 model when one is loaded already (the gate's), else None
    open: Callable[..., Any]
    # (device, machine) -> the modes `auto` may try on that device of that machine (`base.machine.Machine`)
    offers: Callable[..., list[Offer]]
    graphs: Mapping[str, str] = field(default_factory=dict)  # precision -> the graph of its export it reads
    # (export.json "graphs"); none: it runs the saved model's own weights
    export: Callable[[Path, str], str] | None = None  # (directory, precision) -> the command writing that graph
    package: str | None = None  # the package it imports (None: always there)
    missing: str = ""  # what installs the package, said when it is not there
    refuse: Callable[[str, torch.device], str | None] = no_refusal  # its own words for a mode it does not run
    about: Callable[[], dict] = dict  # its version, providers or devices (`bertheads env`)
    reference: bool = False  # the gate's reference: lower precisions are measured against its fp32

    def refusal(self, precision: str, device: torch.device) -> str | None:
        """Why it does not run `precision` on `device` (None: it does)."""
        own = self.refuse(precision, device)
        if own:
            return own
        if precision not in self.precisions:
            return f"{said('runtime', self.name)} runs {', '.join(self.precisions)}, not {said('precision', precision)}"
        if device.type not in self.devices:
            return f"{said('runtime', self.name)}: runs on {', '.join(self.devices)}, not {device}"
        return None

    def installed(self, packages: frozenset[str]) -> bool:
        """Its package is among `packages` (a machine's installed ones), or it needs none."""
        return self.package is None or self.package in packages


RUNTIMES: dict[str, Runtime] = {}  # name -> its Runtime, in the order registered


def register(runtime: Runtime) -> Runtime:
    """Add a runtime to the registry (its `name` must be new); returns it."""
    if runtime.name == "auto" or (runtime.name in RUNTIMES and RUNTIMES[runtime.name] is not runtime):
        raise ValueError(f"a runtime {runtime.name!r} is registered already")
    RUNTIMES[runtime.name] = runtime
    return runtime


def unregister(name: str) -> None:
    """Take a runtime out of the registry."""
    RUNTIMES.pop(name, None)


def choices() -> tuple[str, ...]:
    """What `--runtime` takes: auto, then each registered runtime."""
    return ("auto", *RUNTIMES)


def unknown(name: str) -> str:
    return unknown_name(name, choices(), "runtime", then=f"; expected one of {', '.join(choices())}")


def runtime_choice(text: str) -> str:
    """`--runtime`'s value type: auto or a registered runtime (an unknown one: the closest named)."""
    if text not in choices():
        raise argparse.ArgumentTypeError(unknown(text))
    return text


def runtime_named(name: str) -> Runtime:
    """The registered runtime `name`; a UserError naming the closest one when there is none."""
    if name not in RUNTIMES:
        raise UserError(f"{said('runtime')}: {unknown(name)}")
    return RUNTIMES[name]


def runs(precision: str) -> list[Runtime]:
    """The registered runtimes that run `precision`, in registry order."""
    return [r for r in RUNTIMES.values() if precision in r.precisions]
