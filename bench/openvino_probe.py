"""Where an OpenVINO batch's time goes, on a saved classify model exported to ONNX: SST-2 dev
through `bertheads.load(..., runtime="openvino", precision=P)`, split into OpenVINO's `infer`,
our padding and batching, and the rest (tokenizing, decoding); then, on the same batches,
OpenVINO by itself: one stream against two with an async queue, a static shape against the
dynamic graph, and our predict at several batch sizes. `--graphs`: instead, OpenVINO alone on the
same batches from the export's ONNX graph and from its IR (`model.xml`), each with attention
snippets on and off; `--lengths`: tokens/s by row length, snippets on and off (the figures behind
`openvino_runtime.SHORT_LENGTHS`: measure them on a CPU not in it); `--kernels`: OpenVINO's own
per-node profile of each graph on the predict batches, its time by node type and kernel.

    .venv/bin/python bench/openvino_probe.py --model bench/out/precision-classify-fp32-default --precision bf16
    .venv/bin/python bench/openvino_probe.py --model DIR --graphs --lengths
    .venv/bin/python bench/openvino_probe.py --model TAG_DIR --task tag --limit 1000 --graphs

Results: Markdown-ready lines on stdout, with the CPU line. Passes: `--passes` after one warm-up.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cpu_line  # noqa: E402


def rates(call, inputs: int, passes: int) -> list[int]:
    out = []
    for _ in range(passes):
        start = time.perf_counter()
        call()
        out.append(round(inputs / (time.perf_counter() - start)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--task", default="classify", choices=("classify", "tag", "qa"),
                        help="the model's kind: its inputs are bench/export.py's (SST-2 dev, CoNLL dev, SQuAD)")
    parser.add_argument("--limit", type=int, help="only the first N inputs")
    parser.add_argument("--precision", default="bf16", choices=("fp32", "bf16"))
    parser.add_argument("--passes", type=int, default=4)
    parser.add_argument("--graphs", action="store_true", help="the ONNX graph against the IR, snippets on and off")
    parser.add_argument("--lengths", action="store_true", help="tokens/s by row length, snippets on and off")
    parser.add_argument("--kernels", action="store_true", help="each graph's time by node type and kernel")
    args = parser.parse_args()
    import numpy as np
    import openvino as ov
    import torch
    from export import read_inputs

    import bertheads
    from bertheads.export import openvino_runtime
    from bertheads.text.encoding import encoder_batch

    texts = read_inputs(args.task, args.limit)[0]
    # force: the speed is the question here, not the gate's verdict (qa bf16 is refused on agreement)
    model = bertheads.load(args.model, runtime="openvino", precision=args.precision, verbose=False, force=True)
    model.predict(texts)  # every batch shape met once
    print(f"<!-- {cpu_line()} -->")
    parts = {"infer": 0.0, "batch": 0.0, "tokens": 0, "padded": 0}
    batches: list[dict] = []
    real = openvino_runtime.OpenVinoNet.run_batch

    def timed_batch(self, features, rows, heads, with_loss=False):
        """`OpenVinoNet.run_batch`, its two parts timed (the same calls)."""
        t0 = time.perf_counter()
        batch = encoder_batch(features, self.pad_id, torch.device("cpu"))
        t1 = time.perf_counter()
        request = self.request(batch["input_ids"].shape[1])
        request.infer({k: batch[k].numpy() for k in self.input_names})
        parts["batch"] += t1 - t0
        parts["infer"] += time.perf_counter() - t1
        parts["tokens"] += sum(len(f["input_ids"]) for f in features)
        parts["padded"] += batch["input_ids"].numel()
        batches.append({k: batch[k].numpy() for k in self.input_names})
        return {name: np.array(request.get_tensor(name).data, dtype=np.float32) for name in heads}, {}

    openvino_runtime.OpenVinoNet.run_batch = timed_batch
    start = time.perf_counter()
    model.predict(texts)
    total = time.perf_counter() - start
    openvino_runtime.OpenVinoNet.run_batch = real
    if args.graphs or args.lengths or args.kernels:
        compare(args, batches, len(texts))
        return
    print(f"predict, {len(texts)} sentences: {total * 1e3:.0f} ms ({len(texts) / total:.0f}/s); infer "
          f"{parts['infer'] * 1e3:.0f} ms ({parts['infer'] / total:.0%}), padding and batching "
          f"{parts['batch'] * 1e3:.0f} ms, the rest {(total - parts['infer'] - parts['batch']) * 1e3:.0f} ms; "
          f"{len(batches)} batches, {parts['tokens']} tokens ({parts['padded']} with padding)")

    core = ov.Core()
    graph = Path(args.model) / "onnx" / "model.onnx"
    names = list(batches[0])
    hint = {"INFERENCE_PRECISION_HINT": "bf16" if args.precision == "bf16" else "f32"}
    one = core.compile_model(core.read_model(str(graph)), "CPU",
                             {**hint, "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1", "INFERENCE_NUM_THREADS": "2"})
    request = one.create_infer_request()
    print("OpenVINO alone, one stream, sync:", rates(lambda: [request.infer(b) for b in batches], len(texts),
                                                     args.passes))
    two = core.compile_model(core.read_model(str(graph)), "CPU", {**hint, "PERFORMANCE_HINT": "THROUGHPUT",
                                                                  "NUM_STREAMS": "2", "INFERENCE_NUM_THREADS": "2"})
    queue = ov.AsyncInferQueue(two, 2)

    def queued() -> None:
        for b in batches:
            queue.start_async(b)
        queue.wait_all()

    print("OpenVINO alone, two streams, async queue:", rates(queued, len(texts), args.passes))
    rows, length = 64, 32
    feed = {k: np.ones((rows, length), dtype=batches[0][k].dtype) for k in names}
    static = core.read_model(str(graph))
    static.reshape({k: [rows, length] for k in names})
    for label, compiled in (("dynamic", one), ("static", core.compile_model(static, "CPU", {**hint,
                            "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1", "INFERENCE_NUM_THREADS": "2"}))):
        req = compiled.create_infer_request()
        print(f"{label} graph at {rows}x{length}, tokens/s:", rates(lambda r=req: [r.infer(feed) for _ in range(10)],
                                                                    rows * length * 10, args.passes))
    for size in (32, 64, 128, 256):
        print(f"predict, batch size {size}:", rates(lambda n=size: model.predict(texts, batch_size=n), len(texts),
                                                    args.passes))


def kernels(compiled, batches: list[dict], label: str, top: int = 10) -> None:
    """Share of OpenVINO's summed node time by (node type, kernel), over two passes after a warm one."""
    request = compiled.create_infer_request()
    [request.infer(b) for b in batches]
    spent: dict[tuple[str, str], float] = {}
    for _ in range(2):
        for b in batches:
            request.infer(b)
            for node in request.profiling_info:
                key = (node.node_type, node.exec_type)
                spent[key] = spent.get(key, 0.0) + node.real_time.total_seconds()
    total = sum(spent.values())
    print(f"{label}: " + ", ".join(f"{t} {e} {v / total:.1%}" for (t, e), v in
                                   sorted(spent.items(), key=lambda kv: -kv[1])[:top]))


def compare(args, batches: list[dict], inputs: int) -> None:
    """`--graphs` and `--lengths`: OpenVINO alone, each variant compiled once, rounds alternated."""
    import numpy as np
    import openvino as ov

    from bertheads.export.openvino_runtime import SHORT_CONFIG

    core = ov.Core()
    hint = {"INFERENCE_PRECISION_HINT": "bf16" if args.precision == "bf16" else "f32", "PERFORMANCE_HINT": "LATENCY",
            "NUM_STREAMS": "1", "INFERENCE_NUM_THREADS": "2"}
    onnx_dir = Path(args.model) / "onnx"
    graphs = {k: v for k, v in (("onnx", onnx_dir / "model.onnx"), ("ir", onnx_dir / "model.xml")) if v.is_file()}
    if not args.graphs:  # --lengths alone: the graph the runtime runs
        graphs = dict([list(graphs.items())[-1]])
    variants = {f"{g} snippets {on}": core.compile_model(core.read_model(str(path)), "CPU",
                                                         {**hint, **({} if on == "on" else SHORT_CONFIG)})
                for g, path in graphs.items() for on in ("on", "off")}
    requests = {k: c.create_infer_request() for k, c in variants.items()}

    def medians(feeds: list[dict], count: int) -> dict[str, float]:
        for r in requests.values():
            [r.infer(f) for f in feeds]
        got: dict[str, list[float]] = {k: [] for k in requests}
        for _ in range(args.passes):
            for k, r in requests.items():
                start = time.perf_counter()
                [r.infer(f) for f in feeds]
                got[k].append(count / (time.perf_counter() - start))
        return {k: sorted(v)[len(v) // 2] for k, v in got.items()}

    if args.kernels:
        for g, path in graphs.items():
            kernels(core.compile_model(core.read_model(str(path)), "CPU", {**hint, "PERF_COUNT": "YES"}), batches, g)
    if args.graphs:
        rates_by = medians(batches, inputs)
        print(f"OpenVINO alone on the predict batches ({args.precision}), inputs/s, median of {args.passes}: "
              + ", ".join(f"{k} {v:.0f}" for k, v in rates_by.items()))
    if args.lengths:
        rng = np.random.default_rng(0)
        print("| tokens a row | rows | " + " | ".join(f"{k} (tokens/s)" for k in requests) + " |")
        print("|---" * (len(requests) + 2) + "|")
        for length in (16, 32, 48, 64, 96, 128, 192, 256, 384):
            rows = max(1, 8192 // length)
            feed = {"input_ids": rng.integers(1000, 20000, (rows, length)), "attention_mask": np.ones((rows, length)),
                    "token_type_ids": np.zeros((rows, length))}
            feed = {k: v.astype(np.int64) for k, v in feed.items() if k in batches[0]}
            rates_by = medians([feed], rows * length)
            print(f"| {length} | {rows} | " + " | ".join(f"{v:,.0f}" for v in rates_by.values()) + " |")


if __name__ == "__main__":
    main()
