"""Matrix products on this CPU, fp32 against bf16: `torch.matmul` at a BERT layer's shapes (the
feed-forward and attention projections of a batch of M tokens) and `nn.Linear` under
`torch.autocast` (which casts the weights every call), in GFLOP/s with the CPU line. Tells
whether bf16 units (AMX tiles, AVX512_BF16) are used and what a product can reach.

    .venv/bin/python bench/matmul_speed.py --threads 2
    ONEDNN_VERBOSE=1 .venv/bin/python bench/matmul_speed.py --shapes 64x384x384 --calls 1 2>&1 | grep exec  # the kernel

Results: Markdown rows on stdout (mean time of `--calls` calls after one warm-up call).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cpu_line  # noqa: E402

SHAPES = "4096x384x1536,800x384x1536,800x1536x384,800x384x384"


def seconds(call, calls: int) -> float:
    call()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=SHAPES, help="MxKxN, comma-separated")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    print(f"<!-- {cpu_line()}; {args.threads} thread(s) -->")
    print("| M x K @ K x N | fp32 GFLOP/s | bf16 GFLOP/s | bf16 / fp32 | `nn.Linear` under autocast / fp32 |")
    print("|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        m, k, n = (int(x) for x in shape.split("x"))
        a, b = torch.randn(m, k), torch.randn(k, n)
        a16, b16 = a.bfloat16(), b.bfloat16()
        fp32 = seconds(lambda a=a, b=b: a @ b, args.calls)
        bf16 = seconds(lambda a=a16, b=b16: a @ b, args.calls)
        linear = torch.nn.Linear(k, n)
        with torch.no_grad():
            linear32 = seconds(lambda f=linear, a=a: f(a), args.calls)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                linear16 = seconds(lambda f=linear, a=a: f(a), args.calls)
        flop = 2 * m * k * n / 1e9
        print(f"| {m}x{k} @ {k}x{n} | {flop / fp32:.0f} | {flop / bf16:.0f} | {fp32 / bf16:.1f}x | "
              f"{linear32 / linear16:.1f}x |")


if __name__ == "__main__":
    main()
