"""Small shared pieces for the benchmarks: timing, environment facts, result files."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from contextlib import contextmanager
from pathlib import Path

DATA = Path(os.environ.get("BERTHEADS_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
OUT = Path(__file__).resolve().parent / "out"


@contextmanager
def timer(record: dict, key: str):
    """Store the wall time of the block, in seconds, as record[key]."""
    start = time.perf_counter()
    yield
    record[key] = time.perf_counter() - start


def median(values) -> float:
    return float(statistics.median(values))


def environment() -> dict:
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "threads": torch.get_num_threads(),
            "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()}


CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8")


def cpu_line() -> str:
    """The CPU a result ran on: model name, the flags that matter for bf16/int8, cores (every
    benchmark row names them: sessions run on different CPUs)."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and name in ("", platform.machine(), platform.processor()):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    shown = " ".join(f for f in CPU_FLAGS if f in flags) or "none of " + ",".join(CPU_FLAGS)
    return f"CPU: {name}; flags: {shown}; {os.cpu_count()} cores"


def matmul_peak_gflops(n: int = 1024, repeats: int = 5, clock=time.perf_counter) -> float:
    """This machine's fp32 matrix-multiply rate (median of `repeats`), for '% of peak' figures.
    `clock=time.process_time` gives the rate per CPU-second of this process instead."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    times = []
    for _ in range(repeats):
        start = clock()
        torch.mm(a, b)
        times.append(max(clock() - start, 1e-9))
    return 2 * n**3 / median(times) / 1e9


def save_json(name: str, data: dict) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def require_data(*parts: str) -> Path:
    path = DATA.joinpath(*parts)
    if not path.exists():
        raise SystemExit(f"benchmark data not found: {path} (set BERTHEADS_DATA)")
    return path
