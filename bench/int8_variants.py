"""Dynamic int8 (ONNX Runtime `quantize_dynamic`) variants of one saved model, against its fp32
ONNX graph on the same dev inputs: main metric change, label agreement and speed, rounds
alternating. Chooses `export.onnx.Int8Settings`.

    python bench/int8_variants.py --model bench/out/precision-classify-fp32 --rounds 3

The model directory is copied to a temporary folder; the export and the variants are written there.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from common import environment, median, save_json  # noqa: E402

VARIANTS = {  # name -> changes to Int8Settings
    "reduce_range, all products (before)": {"reduce_range": True, "keep_after_activation": False},
    "full range, all products": {"reduce_range": False, "keep_after_activation": False},
    "reduce_range, feed-forward output fp32": {"reduce_range": True, "keep_after_activation": True},
    "full range, feed-forward output fp32": {"reduce_range": False, "keep_after_activation": True},
    "full range, MatMul only (attention fp32)": {"reduce_range": False, "keep_after_activation": False,
                                                 "op_types": ("MatMul",)},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--data", help="labelled inputs (default: each head's dev file)")
    parser.add_argument("--limit", type=int, default=1000, help="first N inputs (the gate's number)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--name", default="int8-variants")
    args = parser.parse_args()

    from bertheads.export import gate
    from bertheads.export.onnx import GRAPHS, Int8Settings, export_onnx, quantize
    from bertheads.export.onnx_runtime import OnnxNet, OnnxSettings
    from bertheads.inference.path import head_outputs

    record: dict = {"command": " ".join(["python", "bench/int8_variants.py", *sys.argv[1:]]),
                    "environment": environment(), "load_average_start": os.getloadavg(), "variants": {}}
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / args.model.name
        shutil.copytree(args.model, model, ignore=shutil.ignore_patterns("onnx", "gate.json", "checkpoints"))
        export_onnx(model)
        onnx_dir = model / "onnx"
        reference = OnnxNet(model, OnnxSettings())
        data = gate.gate_data(model, reference.tasks, args.data)
        if data is None:
            raise SystemExit(f"{args.model}: a head has no dev file; pass --data")
        nets = {"fp32": reference}
        for name, changes in VARIANTS.items():
            path = onnx_dir / f"variant-{len(nets)}.onnx"
            info = quantize(onnx_dir / GRAPHS["fp32"], path, replace(Int8Settings(), **changes))
            net = OnnxNet(model, OnnxSettings())
            net.open(path)
            nets[name] = net
            record["variants"][name] = {"settings": {k: list(v) if isinstance(v, tuple) else v
                                                     for k, v in changes.items()},
                                        "quantized_ops": info["quantized_ops"], "fp32_ops_left": info["fp32_ops_left"],
                                        "heads": gate.compare(reference, net, data, args.limit)}
            print(name, gate.summary(record["variants"][name]), flush=True)
        examples = {h: reference.tasks[h].read(p, need_labels=True)[: args.limit] for h, p in data.items()}
        times: dict[str, list[float]] = {n: [] for n in nets}
        for r in range(args.rounds):
            for name in list(nets)[:: 1 if r % 2 == 0 else -1]:
                start = time.perf_counter()
                for head, inputs in examples.items():
                    head_outputs(nets[name], head, inputs)
                times[name].append(time.perf_counter() - start)
        inputs = sum(len(v) for v in examples.values())
        record["speed"] = {n: {"seconds": t, "inputs_per_second": inputs / median(t)} for n, t in times.items()}
    record["load_average_end"] = os.getloadavg()
    path = save_json(args.name, record)
    fp32 = record["speed"]["fp32"]["inputs_per_second"]
    print(f"`{record['command']}`; {record['environment']['machine']}; load {record['load_average_start'][0]:.1f}"
          f" -> {record['load_average_end'][0]:.1f}\n")
    print("| int8 variant | metric change (points) | same predictions | inputs/s | x fp32 graph |\n|---|---|---|---|---|")
    print(f"| fp32 graph | - | - | {fp32:.0f} | 1.00x |")
    for name, v in record["variants"].items():
        speed = record["speed"][name]["inputs_per_second"]
        change = ", ".join(f"{h['change_points']:+.2f}" for h in v["heads"].values())
        agree = ", ".join(f"{h['label_agreement']:.1%}" for h in v["heads"].values())
        print(f"| {name} | {change} | {agree} | {speed:.0f} | {speed / fp32:.2f}x |")
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
