"""Small shared pieces for the benchmarks: timing, environment facts, result files."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

DATA = Path(os.environ.get("BERTHEADS_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
OUT = Path(__file__).resolve().parent / "out"
SRC = Path(__file__).resolve().parents[1] / "src"
if SRC.is_dir() and str(SRC) not in sys.path:  # the benchmarks measure this checkout's code
    sys.path.insert(0, str(SRC))


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
            "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "machine": cpu_line()}


def cpu_line() -> str:
    """The machine a result ran on (`bertheads.base.machine`, what `bertheads env` prints): CPU
    model, the flags that matter for bf16/int8, cores, threads, GPUs (every benchmark row names
    them: sessions run on different machines)."""
    from bertheads.base.machine import machine

    return machine().line()


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
