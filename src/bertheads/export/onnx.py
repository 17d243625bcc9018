"""`bertheads export DIR --to onnx [--quantize int8]`: one ONNX graph for the encoder and
every head of a saved model.

```
DIR/onnx/model.onnx        fp32: inputs input_ids, attention_mask, token_type_ids (int64,
                           [batch, seq]); one output per head, named after it: [batch, labels]
                           for classify, [batch, seq, tags] for tag, [batch, seq, 2] for qa
DIR/onnx/model.int8.onnx   with --quantize int8: the encoder's linear layers in int8 (the
                           heads' branches' too: they are encoder layers)
DIR/onnx/model.xml, .bin   where openvino is installed: the fp32 graph as OpenVINO IR, converted
                           from torch (what --runtime openvino runs in fp32 and bf16)
DIR/onnx/export.json       what was exported from which manifest, fusion counts, settings
DIR/onnx/README.md         the model card: the heads, their raw outputs, ONNX Runtime usage
```
The graph comes from torch's exporter (`torch.onnx.export(..., dynamo=True)`), with dynamic
batch and sequence axes. It is then optimized with the ONNX Runtime transformer fusions that
onnxscript applies to exporter graphs (attention, skip-LayerNorm, bias-GELU; exact GELU, no
tanh approximation). The int8 graph is dynamic quantization: per-channel int8 weights (7 bits
unless the exporting CPU has VNNI or AMX), activations quantized per batch at run time; the
heads stay fp32.
The directory is written into a temporary sibling and renamed into place.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from bertheads.base.errors import UserError
from bertheads.base.extras import require
from bertheads.base.machine import machine
from bertheads.base.progress import LogLines
from bertheads.base.schema import said
from bertheads.encoder.layers import reads_first_position_only
from bertheads.export.quiet import tools_quiet
from bertheads.saved import bundle, card
from bertheads.saved.manifest import EXPORT_META, ONNX_DIR
from bertheads.store.atomic import atomic_directory
from bertheads.store.guard import check_target
from bertheads.text.encoding import encoder_batch

META = EXPORT_META  # DIR/onnx/export.json, checked when the model folder is opened (`saved/manifest.py`)
EXPORT_FORMAT = 1
GRAPHS = {"fp32": "model.onnx", "int8": "model.int8.onnx", "qdq": "model.qdq.onnx", "openvino": "model.xml"}
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
PRECISIONS = ("fp32", "int8")
# Outputs of ORT and torch on the check batch written at export time may differ by this much.
CHECK_TOLERANCE = 1e-3


@dataclass
class Int8Settings:
    """Dynamic quantization of the encoder's linear layers (ONNX Runtime `quantize_dynamic`).

    `reduce_range`: weights use 7 of the 8 bits. On x86 CPUs without VNNI the u8 x s8 int8
    kernels add pairs of products in 16 bits (VPMADDUBSW), which can saturate with full-range
    weights and give wrong answers; with 7-bit weights a pair's sum always fits. None: 7 bits
    when the exporting CPU is such a one, all 8 (closer to fp32) when it has VNNI or AMX; a
    full-range graph is refused on a CPU whose pairs saturate (`onnx_runtime.read_export`).
    `keep_after_activation`: the products that read a feed-forward activation stay fp32."""

    weight_type: str = "QInt8"
    per_channel: bool = True
    reduce_range: bool | None = None
    op_types: tuple[str, ...] = ("MatMul", "Attention")
    keep_after_activation: bool = False


def manifest_digest(directory: Path) -> str:
    """sha256 of DIR/bertheads.json and the heads' weight files: an export is bound to them."""
    digest = hashlib.sha256((directory / bundle.MANIFEST).read_bytes())
    for path in sorted((directory / "heads").glob("*.safetensors")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def encoder_digest(directory: Path) -> str | None:
    """sha256 of the weight files of DIR/encoder (names and bytes); None for a head-only model
    (its checkpoint is checked against the manifest's `encoder.hash` when it is loaded)."""
    files = sorted((directory / "encoder").glob("*.safetensors"))
    if not files:
        return None
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode())
        with open(path, "rb") as fh:
            while block := fh.read(1 << 22):
                digest.update(block)
    return digest.hexdigest()


def check_exportable(net) -> None:
    """Heads the graph cannot hold, refused with one line."""
    for name, task in net.tasks.items():
        task.exporting.check(name, 'onnx')


class GraphModule(nn.Module):
    """The model as the graph sees it: three int64 inputs, one output per head."""

    def __init__(self, net, names: list[str]) -> None:
        super().__init__()
        self.net = net
        self.names = names

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor):
        batch = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        out = self.net(batch, self.names)
        return tuple(out[name].float() for name in self.names)


def example_inputs(tokenizer, batch: int = 2) -> dict[str, np.ndarray]:
    """A small padded batch of real text pairs (the check batch, and the exporter's example)."""
    texts = ["The tower stands in Paris, where Angela Merkel gave a speech last week.", "A gorgeous film."]
    pairs = ["Where is the tower?", "Was it any good at all?"]
    enc = tokenizer((texts * batch)[:batch], (pairs * batch)[:batch], padding=True, return_tensors="np",
                    return_token_type_ids=True)
    return {name: np.asarray(enc[name], dtype=np.int64) for name in INPUTS}


def other_inputs(tokenizer) -> dict[str, np.ndarray]:
    """A batch of another size and padded length than `example_inputs` (a traced graph's check)."""
    texts = ["Short.", "A longer sentence about the weather in Lisbon, the river and the bridges over it, "
                       "on a day in late spring.", "Three."]
    enc = tokenizer(texts, ["Where?", "Which city is it?", "Why?"], padding=True, return_tensors="np",
                    return_token_type_ids=True)
    return {name: np.asarray(enc[name], dtype=np.int64) for name in INPUTS}


def first_token_heads(net) -> bool:
    """Whether every head reads only [CLS] of the last layer (then so does the graph)."""

    return all(reads_first_position_only(head) for head in net.heads.values())


def export_graph(net, path: Path) -> list[str]:
    """Export the fp32 graph with torch's dynamo exporter; returns the output (head) names."""
    feed = example_inputs(net.encoder.tokenizer)
    args = tuple(torch.from_numpy(feed[n]) for n in INPUTS)
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
    shapes = {name: {0: batch, 1: seq} for name in INPUTS}
    with graph_module(net) as (module, names), torch.no_grad():
        program = torch.onnx.export(module, args, input_names=list(INPUTS), output_names=names,
                                    dynamic_shapes=shapes, dynamo=True, optimize=True, verbose=False)
    program.save(str(path))
    return names


@contextmanager
def graph_module(net) -> Iterator[tuple[GraphModule, list[str]]]:
    """The module the graphs are made from, and its output names; as in torch, [CLS]-only heads
    let the last layer run for [CLS] alone."""
    names = list(net.tasks)
    encoder = net.encoder
    first_token = encoder.first_token_ready
    if not first_token_heads(net):
        encoder.first_token_ready = False
    try:
        yield GraphModule(net, names).eval(), names
    finally:
        encoder.first_token_ready = first_token


def export_openvino(net, path: Path) -> float:
    """Write the fp32 graph as OpenVINO IR (`path`, and its weights beside it as .bin), converted
    from the torch module (OpenVINO's TorchScript route), not from the ONNX file: scaled-dot-product
    attention stays one op that OpenVINO's CPU kernels fuse, where the ONNX graph's packed
    Attention nodes come back as a product, a Split and Transposes. (The IR converted from
    `torch.export`'s program ran slower, as slow as the ONNX graph: bench/RESULTS.md.) A trace
    keeps what Python computed from the example's shapes, so the outputs are checked on a second
    batch of another size and length too. Returns the largest difference from torch's."""
    import openvino as ov

    feeds = [example_inputs(net.encoder.tokenizer), other_inputs(net.encoder.tokenizer)]
    with graph_module(net) as (module, names), torch.no_grad():
        graph = ov.convert_model(module, example_input=tuple(torch.from_numpy(feeds[0][n]) for n in INPUTS),
                                 input=[ov.PartialShape([-1, -1])] * len(INPUTS))
        references = [module(*(torch.from_numpy(feed[n]) for n in INPUTS)) for feed in feeds]
    for port, name in zip(graph.outputs, names):
        port.get_tensor().set_names({name})
    for port, name in zip(graph.inputs, INPUTS):
        port.get_tensor().set_names({name})
    ov.save_model(graph, str(path), compress_to_fp16=False)
    request = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"}).create_infer_request()
    worst = 0.0
    for feed, reference in zip(feeds, references):
        got = request.infer(feed)
        mask = feed["attention_mask"].astype(bool)
        for name, want in zip(names, reference):
            want, have = want.numpy(), np.asarray(got[request.model_outputs[names.index(name)]])
            if want.ndim == 3:  # token-level outputs: padding positions are not outputs
                want, have = want[mask], have[mask]
            worst = max(worst, float(np.abs(want - have).max()))
    return worst


def fuse(path: Path) -> dict[str, int]:
    """Apply ONNX Runtime's transformer fusions in place; the count of each fusion applied."""
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    model = ir.load(str(path))
    model, counts = optimize_for_ort(model)
    ir.save(model, str(path))
    folded = fold_weight_concats(path)
    ops = op_counts(path)
    if ops.get("FastGelu") or ops.get("BiasFastGelu"):  # pragma: no cover - a fusion changed GELU
        raise RuntimeError("the optimized graph approximates GELU (FastGelu); refusing it")
    counts = {k: int(v) for k, v in counts.items() if v}
    counts["weight_concats_folded"] = folded
    counts["ops"] = {k: ops[k] for k in ("Attention", "MultiHeadAttention", "SkipLayerNormalization",
                                         "BiasGelu", "Gelu", "LayerNormalization") if ops.get(k)}
    return counts


def fold_weight_concats(path: Path) -> int:
    """Replace Concat nodes whose inputs are all initializers by their result (the attention
    fusion packs the query, key and value weights with a Concat that would otherwise run on
    every call, and that the quantizer cannot see through), and drop Attention's
    `qkv_hidden_sizes` when the three are equal (its default; the quantizer leaves Attention
    nodes that carry it in fp32). Returns how many Concats were folded."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    folded = []
    for node in graph.node:
        if node.op_type != "Concat" or not node.input or not all(i in inits for i in node.input):
            continue
        axis = next(a.i for a in node.attribute if a.name == "axis")
        value = np.concatenate([numpy_helper.to_array(inits[i]) for i in node.input], axis=axis)
        graph.initializer.append(numpy_helper.from_array(value, node.output[0]))
        folded.append(node)
    for node in folded:
        graph.node.remove(node)
    for node in graph.node:  # equal query/key/value sizes are the default: the quantizer skips the attribute
        sizes = [a for a in node.attribute if a.name == "qkv_hidden_sizes"]
        if node.op_type == "Attention" and sizes and len(set(sizes[0].ints)) == 1:
            node.attribute.remove(sizes[0])
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    for init in [i for i in graph.initializer if i.name not in used]:
        graph.initializer.remove(init)
    onnx.save(model, str(path))
    return len(folded)


def op_counts(path: Path) -> dict[str, int]:
    import onnx

    counts: dict[str, int] = {}
    for node in onnx.load(str(path), load_external_data=False).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def head_weight(name: str) -> bool:
    """Whether an initializer is a head's own weight. A head's branch (its copy of the encoder's
    top layers, `model.attach_branch`) is encoder layers: quantized as the trunk's are."""
    return "heads." in name and ".branch." not in name


def head_nodes(path: Path) -> list[str]:
    """Nodes that read a head's weights (kept in fp32 by the quantizer)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    head_weights = {i.name for i in graph.initializer if head_weight(i.name)}
    reading = [n for n in graph.node if head_weights.intersection(n.input)]
    # a token-level head's linear layer is MatMul (weight transposed into a constant of another
    # name) then Add (its bias): the MatMul is found through the Add
    inputs = {i for n in reading for i in n.input}
    feeding = [n for n in graph.node if n.op_type == "MatMul" and inputs.intersection(n.output)]
    return [n.name for n in reading + feeding]


ACTIVATIONS = ("BiasGelu", "Gelu", "FastGelu", "QuickGelu", "Erf", "Relu", "Mul")


def after_activation(path: Path) -> list[str]:
    """MatMuls that read a feed-forward activation's output (GELU, ReLU, a gated unit's product):
    their inputs hold outliers that one int8 range per tensor cannot cover."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    made_by = {out: n.op_type for n in graph.node for out in n.output}
    return [n.name for n in graph.node if n.op_type == "MatMul" and made_by.get(n.input[0]) in ACTIVATIONS]


def kept_fp32(src: Path, keep_after_activation: bool) -> tuple[list[str], list[str], list[str]]:
    """The head nodes, the products after an activation (when kept), and every node name the
    quantizer must leave in fp32."""
    heads = head_nodes(src)
    kept = after_activation(src) if keep_after_activation else []
    # the quantizer first rewrites each Gemm into a MatMul named NAME_MatMul (and an Add)
    return heads, kept, heads + [f"{name}_MatMul" for name in heads] + kept


def quantize(src: Path, dst: Path, settings: Int8Settings) -> dict:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    if settings.reduce_range is None:
        settings = replace(settings, reduce_range=machine().int8_pairs_saturate)
    heads, kept, excluded = kept_fp32(src, settings.keep_after_activation)
    quantize_dynamic(str(src), str(dst), weight_type=getattr(QuantType, settings.weight_type),
                     per_channel=settings.per_channel, reduce_range=settings.reduce_range,
                     op_types_to_quantize=list(settings.op_types), nodes_to_exclude=excluded)
    ops = op_counts(dst)
    return {**asdict(settings), "op_types": list(settings.op_types), "heads_kept_fp32": len(heads),
            "kept_fp32_after_activation": len(kept),
            "quantized_ops": {k: v for k, v in ops.items() if k in ("MatMulInteger", "QAttention",
                                                                       "DynamicQuantizeMatMul")},
            "fp32_ops_left": {k: v for k, v in ops.items() if k in ("Attention", "MatMul", "Gemm")}}


CALIBRATION_EXAMPLES = 256  # dev inputs per head whose activations set the static int8 ranges


@dataclass
class QdqSettings:
    """Static quantization to a QDQ graph (ONNX Runtime `quantize_static`), which OpenVINO
    reads and runs with its int8 kernels: weights symmetric int8 per channel, activations uint8
    with a zero point, their ranges from the min/max over calibration batches of dev data. The
    heads and the matrix products after the feed-forward activation stay fp32: quantizing those
    moved SST-2 dev accuracy by several points, keeping them by a fraction of one (RESULTS.md)."""

    per_channel: bool = True
    op_types: tuple[str, ...] = ("MatMul",)
    batch_size: int = 16
    keep_after_activation: bool = True


def calibration_batches(net, data: dict[str, str], declared: set[str], batch_size: int) -> list[dict]:
    """Padded input batches from the first `CALIBRATION_EXAMPLES` inputs of each head's data."""
    batches = []
    pad = net.encoder.tokenizer.pad_token_id or 0
    for name, path in data.items():
        task = net.tasks[name]
        examples = task.reading.read(path, need_labels=False)[:CALIBRATION_EXAMPLES]
        features, _ = task.modeling.encode_for_inference(examples, net.encoder.tokenizer)
        for i in range(0, len(features), batch_size):
            batch = encoder_batch(features[i : i + batch_size], pad, torch.device("cpu"))
            batches.append({k: batch[k].numpy() for k in INPUTS if k in declared})
    return batches


def quantize_qdq(src: Path, dst: Path, batches: list[dict], settings: QdqSettings) -> dict:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.left = iter(batches)
            self.done = 0
            self.lines = LogLines("int8 QDQ calibration", len(batches), "batches")  # where no bar is drawn

        def get_next(self):
            batch = next(self.left, None)
            if batch is not None:
                self.done += 1
                self.lines.tick(self.done)
            return batch

    heads, kept, excluded = kept_fp32(src, settings.keep_after_activation)
    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, per_channel=settings.per_channel,
                    op_types_to_quantize=list(settings.op_types), activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8, nodes_to_exclude=excluded,
                    extra_options={"ActivationSymmetric": False, "WeightSymmetric": True})
    ops = op_counts(dst)
    return {**asdict(settings), "op_types": list(settings.op_types), "calibration_batches": len(batches),
            "heads_kept_fp32": len(heads), "kept_fp32_after_activation": len(kept),
            "quantized_ops": {k: v for k, v in ops.items() if k in ("QuantizeLinear", "DequantizeLinear")}}


def session(path: Path, threads: int = 1, providers: list | None = None):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=providers or ["CPUExecutionProvider"])


def max_difference(net, path: Path) -> float:
    """Largest absolute difference between torch's and ORT's outputs on the check batch."""
    feed = example_inputs(net.encoder.tokenizer)
    names = list(net.tasks)
    with torch.no_grad():
        ref = GraphModule(net, names).eval()(*(torch.from_numpy(feed[n]) for n in INPUTS))
    sess = session(path)
    declared = {i.name for i in sess.get_inputs()}
    got = sess.run(names, {k: v for k, v in feed.items() if k in declared})
    mask = feed["attention_mask"].astype(bool)
    worst = 0.0
    for r, g in zip(ref, got):
        r = r.numpy()
        if r.ndim == 3:  # token-level outputs: padding positions are not outputs
            r, g = r[mask], g[mask]
        worst = max(worst, float(np.abs(r - g).max()))
    return worst


def export_onnx(directory: str | Path, out: str | Path | None = None, quantize_to: str | None = None,
                log: Callable[[str], None] | None = None, calibration: dict[str, str] | None = None,
                openvino: bool = True) -> dict:
    """Export the model in `directory` to `out` (default DIR/onnx); returns export.json's content.
    With int8 and `calibration` (head -> labelled file), also the static QDQ graph for OpenVINO;
    with `openvino` and the package installed, the OpenVINO IR."""
    require("export", "export --to onnx")
    directory = Path(directory)
    manifest = bundle.read_manifest(directory)
    if quantize_to not in (None, "int8"):
        raise UserError(f"{said('quantize')}: expected int8, got {quantize_to!r}")
    out = check_target(Path(out) if out else directory / ONNX_DIR, META, models=bundle.model_folders(directory),
                       home=directory, inputs=(calibration or {}).values(), what="a bertheads ONNX export")
    say = log or (lambda _msg: None)
    net = bundle.load(directory)
    check_exportable(net)
    with_openvino = openvino and importlib.util.find_spec("openvino") is not None
    steps = ["the ONNX graph", "fusing and checking it", *(["the OpenVINO IR"] * with_openvino),
             *(["int8"] * (quantize_to == "int8")), *(["int8 QDQ"] * bool(quantize_to == "int8" and calibration))]
    lines = LogLines("export", len(steps), "steps")  # where no bar is drawn: at each step's start, when due

    def step(done: int) -> None:
        lines.tick(done, f"next: {steps[done]}" if done < len(steps) else "")

    with atomic_directory(out) as tmp, tools_quiet():
        started = time.perf_counter()
        fp32 = tmp / GRAPHS["fp32"]
        names = export_graph(net, fp32)
        say(f"exported {', '.join(names)} in {time.perf_counter() - started:.1f}s")
        step(1)
        fusions = fuse(fp32)
        say("fused: " + ", ".join(f"{k} {v}" for k, v in fusions["ops"].items()))
        diff = max_difference(net, fp32)
        step(2)
        if not diff <= CHECK_TOLERANCE:
            raise RuntimeError(f"the ONNX graph's outputs differ from torch's by {diff:.2e}")
        meta = {
            "format": EXPORT_FORMAT,
            "source": str(directory),
            "manifest_sha256": manifest_digest(directory),
            "encoder_hash": manifest.get("encoder_hash"),
            "encoder_files_sha256": encoder_digest(directory),
            "heads": {name: {"kind": task.kind, "token_level": bool(net.heads[name].token_level),
                             "outputs": int(net.heads[name].out.out_features)}
                      for name, task in net.tasks.items()},
            "inputs": list(INPUTS),
            "exporter": f"torch.onnx.export dynamo=True (torch {torch.__version__})",
            "graphs": {"fp32": {"file": GRAPHS["fp32"], "fusions": fusions, "max_abs_diff_vs_torch": diff,
                                "bytes": fp32.stat().st_size}},
        }
        if with_openvino:
            ir = tmp / GRAPHS["openvino"]
            try:
                diff = export_openvino(net, ir)
            except Exception as exc:  # a family OpenVINO cannot convert keeps the ONNX graph for it
                diff, why = float("nan"), f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
            else:
                why = f"its outputs differ from torch's by {diff:.2e}"
            if diff <= CHECK_TOLERANCE:
                meta["graphs"]["openvino"] = {"file": GRAPHS["openvino"], "weights": ir.with_suffix(".bin").name,
                                              "max_abs_diff_vs_torch": diff,
                                              "bytes": ir.stat().st_size + ir.with_suffix(".bin").stat().st_size}
                say(f"OpenVINO IR: {GRAPHS['openvino']} (what {said('runtime', 'openvino')} runs in fp32 and bf16)")
            else:
                ir.unlink(missing_ok=True)
                ir.with_suffix(".bin").unlink(missing_ok=True)
                logging.getLogger("bertheads").warning(
                    f"OpenVINO IR not written ({why}); {said('runtime', 'openvino')} reads the ONNX graph")
            step(3)
        if quantize_to == "int8":
            int8 = tmp / GRAPHS["int8"]
            info = quantize(fp32, int8, Int8Settings())
            meta["graphs"]["int8"] = {"file": GRAPHS["int8"], "quantization": info, "bytes": int8.stat().st_size}
            say("int8: " + ", ".join(f"{k} {v}" for k, v in info["quantized_ops"].items())
                + f"; {info['heads_kept_fp32']} head nodes kept in fp32")
            step(3 + with_openvino)
            if calibration:
                qdq = tmp / GRAPHS["qdq"]
                declared = {i.name for i in session(fp32).get_inputs()}
                batches = calibration_batches(net, calibration, declared, QdqSettings.batch_size)
                info = quantize_qdq(fp32, qdq, batches, QdqSettings())
                meta["graphs"]["qdq"] = {"file": GRAPHS["qdq"], "quantization": info, "bytes": qdq.stat().st_size}
                say(f"int8 QDQ (static, {len(batches)} calibration batches of "
                    f"{', '.join(sorted(set(calibration.values())))}): for {said('runtime', 'openvino')} {said('precision', 'int8')}")
            else:
                say(f"int8 QDQ graph (OpenVINO) not written: no dev data to calibrate on ({said('gate_data')})")
        import onnxruntime

        meta["onnxruntime"] = onnxruntime.__version__
        (tmp / META).write_text(json.dumps(meta, indent=2) + "\n")
        card.write_card(tmp, lambda: card.build_card(
            net, manifest, card.read_metrics(directory), f"{directory.name} (ONNX)",
            card.onnx_usage(out, directory, bundle.encoder_location(directory), manifest, net.tasks, meta)), out)
    return meta
