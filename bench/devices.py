"""`--runtime auto --precision auto` against today's torch fp32 (and other modes by name) on
SST-2 dev prediction, on this machine, rounds alternating between the modes.

    PYTHONPATH=src .venv/bin/python bench/devices.py --model runs/sst2 --rounds 3 \
        --modes auto,torch/fp32,onnx/int8,openvino/fp32

The model needs an ONNX export (`bertheads export DIR --to onnx --quantize int8`) for the
exported modes. Each round predicts every dev sentence end to end (texts in, labels out) once per
mode; sentences/s is the median over rounds. Prints Markdown rows with the machine's line and
the load average (other jobs on the machine change the figures); results in bench/out/devices.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cpu_line, median, require_data, save_json  # noqa: E402


def read_dev(limit: int | None) -> tuple[list[str], list[str]]:
    lines = require_data("sst2", "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    rows = [line.rsplit("\t", 1) for line in lines if line.strip()][:limit]
    return [r[0] for r in rows], [r[1] for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a classify model directory trained on SST-2")
    parser.add_argument("--modes", default="auto,torch/fp32", help="comma-separated: auto or RUNTIME/PRECISION")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--limit", type=int, help="first N dev sentences")
    args = parser.parse_args()

    import bertheads
    from bertheads.base.errors import UserError

    texts, gold = read_dev(args.limit)
    models, refused = {}, {}
    for name in args.modes.split(","):
        runtime, _, precision = name.partition("/")
        try:
            models[name] = bertheads.load(args.model, runtime=runtime, precision=precision or "auto")
        except UserError as exc:
            refused[name] = str(exc)
    times: dict[str, list[float]] = {name: [] for name in models}
    labels: dict[str, list[str]] = {}
    load_before = os.getloadavg()
    for _ in range(args.rounds):
        for name, model in models.items():
            start = time.perf_counter()
            labels[name] = [str(p["label"]) for p in model.predict(texts)]
            times[name].append(time.perf_counter() - start)
    load_after = os.getloadavg()
    reference = labels.get("torch/fp32")
    rows = {}
    for name, model in models.items():
        mode = model.mode
        rows[name] = {"ran": f"{mode.runtime} {mode.precision}", "sentences_per_s": len(texts) / median(times[name]),
                      "accuracy": sum(a == b for a, b in zip(labels[name], gold)) / len(gold),
                      "same_as_fp32": (sum(a == b for a, b in zip(labels[name], reference)) / len(gold)
                                       if reference else None),
                      "seconds": times[name]}
    base = rows.get("torch/fp32", {}).get("sentences_per_s")
    result = {"command": " ".join(sys.argv), "machine": cpu_line(), "sentences": len(texts), "rounds": args.rounds,
              "load_average_before_after": [load_before, load_after], "rows": rows, "refused": refused}
    save_json("devices", result)
    print(f"<!-- {cpu_line()}; load average {load_before[0]:.1f} -> {load_after[0]:.1f} -->")
    print("| asked | ran | sent/s | vs torch fp32 | accuracy | same labels as fp32 |")
    print("|---|---|---|---|---|---|")
    for name, row in rows.items():
        ratio = f"{row['sentences_per_s'] / base:.2f}x" if base else "-"
        same = f"{row['same_as_fp32']:.1%}" if row["same_as_fp32"] is not None else "-"
        print(f"| {name} | {row['ran']} | {row['sentences_per_s']:.0f} | {ratio} | {row['accuracy']:.4f} | {same} |")
    for name, why in refused.items():
        print(f"| {name} | refused: {why} | | | | |")


if __name__ == "__main__":
    main()
