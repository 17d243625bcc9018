"""Where the real training loop's time goes, fp32 against bf16: torch.profiler over a whole
`bertheads.train` call (fused AdamW, length-grouped batches, the encoder as bertheads runs it),
classify on the first N SST-2 training sentences, one epoch, no dev file and no holdout so the
profile is the loop. Prints each precision's operators by self CPU time, with their share.

    .venv/bin/python bench/profile_train.py --limit 512 --batch-size 32 --precisions fp32,bf16
    .venv/bin/python bench/profile_train.py --precisions bf16 --threads 2 --by-shape   # the products' shapes

Results: bench/out/profile-train.json and Markdown tables with the CPU line. Runs on one thread
by default (`--threads`), so the shares do not depend on how busy the second core is.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cpu_line, require_data, save_json  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--by-shape", action="store_true",
                        help="also the matrix products and copies by input shape (slower to profile)")
    args = parser.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    import bertheads

    torch.set_num_threads(args.threads)
    lines = require_data("sst2", "train.tsv").read_text(encoding="utf-8").splitlines()
    work = Path(tempfile.mkdtemp(prefix="profile-train-"))
    train = work / "train.tsv"
    train.write_text("\n".join(lines[: args.limit + 1]) + "\n", encoding="utf-8")
    result: dict = {"machine": cpu_line(), "command": " ".join(sys.argv), "threads": args.threads,
                    "load_average_start": os.getloadavg(), "precisions": {}}
    options = {"epochs": 1, "batch_size": args.batch_size, "seed": 42, "holdout": 0, "progress": False,
               "verbose": False, "mode": "finetune"}
    for precision in args.precisions.split(","):
        bertheads.train("classify", str(train), None, None, precision=precision, **{**options, "limit": 64})  # warm-up
        start = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU], record_shapes=args.by_shape) as prof:
            model = bertheads.train("classify", str(train), None, None, precision=precision, **options)
        seconds = time.perf_counter() - start
        events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
        total = sum(e.self_cpu_time_total for e in events)
        top = sorted(events, key=lambda e: -e.self_cpu_time_total)[: args.top]
        rate = model.metrics["history"][-1]["train_examples_per_second"]
        if args.by_shape:
            shaped = [e for e in prof.key_averages(group_by_input_shape=True)
                      if e.key in ("aten::mm", "aten::addmm", "aten::bmm", "aten::copy_")]
            print(f"\n{precision}, by input shape:")
            for e in sorted(shaped, key=lambda e: -e.self_cpu_time_total)[: args.top]:
                print(f"  {e.key} {e.self_cpu_time_total / 1e3:.1f} ms, {e.count} calls, "
                      f"{e.self_cpu_time_total / e.count:.0f} us a call: {e.input_shapes}")
        result["precisions"][precision] = {
            "seconds": round(seconds, 2), "train_examples_per_second": rate,
            "self_ms_total": round(total / 1e3, 1),
            "top": [{"op": e.key, "self_ms": round(e.self_cpu_time_total / 1e3, 1), "calls": e.count,
                     "share": round(e.self_cpu_time_total / total, 4)} for e in top]}
    result["load_average_end"] = os.getloadavg()
    save_json("profile-train", result)
    print(f"<!-- {result['machine']}; {args.threads} thread(s); load average "
          f"{result['load_average_start'][0]:.1f} -> {result['load_average_end'][0]:.1f} -->")
    for precision, entry in result["precisions"].items():
        print(f"\n{precision}: {entry['seconds']} s under the profiler, loop {entry['train_examples_per_second']:.1f} "
              f"examples/s, {entry['self_ms_total']:.0f} ms of operator self time\n")
        print("| operator | self ms | calls | share |")
        print("|---|---|---|---|")
        for row in entry["top"]:
            print(f"| `{row['op']}` | {row['self_ms']:.0f} | {row['calls']} | {row['share'] * 100:.1f}% |")


if __name__ == "__main__":
    main()
