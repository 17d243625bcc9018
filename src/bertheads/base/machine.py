"""What this machine has: the CPU and the flags that matter for bf16 and int8, threads, CUDA
devices, MPS and the installed inference runtimes; and the device a `--device` names.

`machine()` detects once and caches (tests that need another machine replace `detected`).
`BERTHEADS_CPU_FLAGS` (space- or comma-separated) replaces the CPU flags read from /proc/cpuinfo,
so `auto` can be kept off units a machine has (the test suite runs as an AVX2-only CPU with it).
The runtime packages looked for are the registered runtimes' (`base/runtimes.py`); each is
imported only by its runtime's `about` (`runtimes()`) and runner.
"""

from __future__ import annotations

import importlib.util
import os
import platform
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

import torch

from bertheads.base.errors import UserError
from bertheads.base.runtimes import RUNTIMES
from bertheads.base.schema import said

CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8")
FLAGS_VARIABLE = "BERTHEADS_CPU_FLAGS"
DEVICES = ("auto", "cpu", "cuda", "cuda:N", "mps")


@dataclass(frozen=True)
class Machine:
    """The facts a device or precision choice depends on."""

    cpu: str = "unknown"
    flags: frozenset[str] = frozenset()
    cores: int = 1
    threads: int = 1
    capability: str = "DEFAULT"  # torch's CPU kernel level (torch.backends.cpu.get_cpu_capability)
    cuda: tuple[str, ...] = ()  # one name per CUDA device
    cuda_bf16: bool = False
    mps: bool = False
    installed: frozenset[str] = field(default_factory=frozenset)  # the registered runtimes' packages found here

    @property
    def cpu_bf16(self) -> bool:
        """bf16 matrix units (AMX) or instructions (AVX512_BF16)."""
        return bool({"amx_bf16", "avx512_bf16"} & self.flags)

    @property
    def cpu_int8(self) -> bool:
        """int8 dot-product units (AMX, AVX512_VNNI or AVX_VNNI)."""
        return bool({"amx_int8", "avx512_vnni", "avx_vnni"} & self.flags)

    @property
    def bf16_units(self) -> str:
        """What does its bf16 work: AMX or AVX512_BF16."""
        return "AMX" if "amx_bf16" in self.flags else "AVX512_BF16"

    @property
    def int8_units(self) -> str:
        """What does its int8 work: AMX, AVX512_VNNI or AVX_VNNI."""
        return "AMX" if "amx_int8" in self.flags else ("AVX512_VNNI" if "avx512_vnni" in self.flags else "AVX_VNNI")

    @property
    def int8_pairs_saturate(self) -> bool:
        """x86 without VNNI (AVX2): u8 x s8 int8 kernels add pairs of products in 16 bits, which
        full-range int8 weights can overflow."""
        return "avx2" in self.flags and not self.cpu_int8

    def flag_text(self) -> str:
        shown = [f for f in CPU_FLAGS if f in self.flags]
        return " ".join(shown) or "none of " + ",".join(CPU_FLAGS)

    def line(self) -> str:
        """One line naming the CPU, its bf16/int8 flags, cores and GPUs (every benchmark row has it)."""
        gpus = f"; GPU: {', '.join(self.cuda)}" if self.cuda else ""
        return f"CPU: {self.cpu}; flags: {self.flag_text()}; {self.cores} cores, {self.threads} threads{gpus}"

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(flags=[f for f in CPU_FLAGS if f in self.flags], installed=sorted(self.installed), cuda=list(self.cuda),
                   cpu_bf16=self.cpu_bf16, cpu_int8=self.cpu_int8)
        return out


def read_cpuinfo(text: str) -> tuple[str, frozenset[str]]:
    """The model name and flags of the first CPU in /proc/cpuinfo's text."""
    name, flags = "", frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not name:
            name = value.strip()
        elif key == "flags" and not flags:
            flags = frozenset(value.split())
    return name, flags


def detect(packages: tuple[str, ...] = ()) -> Machine:
    """This machine, from /proc/cpuinfo, torch and which of `packages` (runtimes') import here."""
    name, flags = "", frozenset()
    try:
        name, flags = read_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        pass
    override = os.environ.get(FLAGS_VARIABLE)
    if override is not None:
        flags = frozenset(override.replace(",", " ").split())
    cuda: tuple[str, ...] = ()
    bf16 = False
    if torch.cuda.is_available():
        cuda = tuple(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        bf16 = bool(torch.cuda.is_bf16_supported())
    mps = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    installed = frozenset(p for p in packages if importlib.util.find_spec(p) is not None)
    return Machine(cpu=name or platform.processor() or platform.machine(), flags=flags, cores=os.cpu_count() or 1,
                   threads=torch.get_num_threads(), capability=torch.backends.cpu.get_cpu_capability(),
                   cuda=cuda, cuda_bf16=bf16, mps=mps, installed=installed)


@lru_cache(maxsize=4)
def detected(packages: tuple[str, ...]) -> Machine:
    return detect(packages)


def runtime_packages() -> tuple[str, ...]:
    """The packages the registered runtimes need."""
    return tuple(r.package for r in RUNTIMES.values() if r.package)


def machine() -> Machine:
    """This machine (detected once)."""
    return detected(runtime_packages())


def runtimes() -> dict[str, dict]:
    """Each registered runtime whose package imports here, by its package (its name when it
    needs none): its version and what else it says of itself (providers, devices)."""
    return {r.package or r.name: r.about() for r in RUNTIMES.values()
            if r.package is None or importlib.util.find_spec(r.package) is not None}


def resolve_device(name: str | torch.device | None, fake: Machine | None = None) -> torch.device:
    """The device `--device` names: auto (the first GPU, else MPS, else the CPU), cpu, cuda,
    cuda:N or mps; one that this machine lacks is a UserError."""
    m = fake or machine()
    if isinstance(name, torch.device):
        name = str(name)
    text = (name or "auto").strip().lower()
    if text == "auto":
        if m.cuda:
            return torch.device("cuda", 0)
        return torch.device("mps") if m.mps else torch.device("cpu")
    if text == "cpu":
        return torch.device("cpu")
    if text == "mps":
        if not m.mps:
            raise UserError(f"{said('device', 'mps')}: this machine has no MPS device (Apple GPU)")
        return torch.device("mps")
    kind, _, index = text.partition(":")
    if kind == "cuda" and (not index or index.isdigit()):
        number = int(index or 0)
        if not m.cuda:
            raise UserError(f"{said('device', text)}: this machine has no CUDA device (torch {torch.__version__}"
                            f"{'' if torch.version.cuda else ', a CPU-only build'})")
        if number >= len(m.cuda):
            raise UserError(f"{said('device', text)}: this machine has {len(m.cuda)} CUDA device(s) (cuda:0 to "
                            f"cuda:{len(m.cuda) - 1})")
        return torch.device("cuda", number)
    raise UserError(f"{said('device')}: expected one of {', '.join(DEVICES)}, got {name!r}")


TRAIN_PRECISIONS = ("auto", "fp32", "bf16", "fp16")


def training_precision(requested: str, device: torch.device, fake: Machine | None = None) -> tuple[str, str]:
    """The autocast precision a training run on `device` uses, and why: `auto` takes bf16 on a
    GPU that has it (else fp16, with a gradient scaler) and on a CPU with AMX or AVX512_BF16,
    fp32 elsewhere. bf16 asked for on a CPU without them, or fp16 off CUDA, is a UserError."""
    m = fake or machine()
    if requested not in TRAIN_PRECISIONS:
        raise UserError(f"{said('precision')}: expected one of {', '.join(TRAIN_PRECISIONS)}, got {requested!r}")
    kind = device.type
    if requested == "auto":
        if kind == "cuda":
            if m.cuda_bf16:
                return "bf16", "the GPU has bf16"
            return "fp16", "the GPU has no bf16: fp16 with a gradient scaler"
        if kind == "cpu" and m.cpu_bf16:
            return "bf16", "the CPU has " + m.bf16_units
        return "fp32", ("the CPU has neither AMX nor AVX512_BF16 (bf16 would be slower)" if kind == "cpu"
                        else f"{kind}: fp32")
    if requested == "bf16":
        if kind == "cpu" and not m.cpu_bf16:
            raise UserError(f"{said('precision', 'bf16')}: this CPU has neither AMX nor AVX512_BF16 (flags: "
                            f"{m.flag_text()}); bf16 would run slower than fp32 here; use fp32 or auto")
        if kind == "cuda" and not m.cuda_bf16:
            raise UserError(f"{said('precision', 'bf16')}: this GPU has no bf16; use fp16 or auto")
        if kind == "mps":
            raise UserError(f"{said('precision', 'bf16')}: not on mps; use fp32")
    if requested == "fp16" and kind != "cuda":
        raise UserError(f"{said('precision', 'fp16')}: only on CUDA (a gradient scaler keeps fp16 gradients from "
                        f"underflowing); this run is on {kind}; use fp32 or auto")
    return requested, "asked for"


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
