"""The ONNX Runtime path: a saved model's heads run from `DIR/onnx/` (written by
`bertheads export DIR --to onnx`) instead of torch.

`OnnxNet` stands where the torch model (`model.BertHeads`) stands: it has the tasks (for
reading, encoding and decoding, which stay the same) and the tokenizer, and its
`run_heads` is the batched prediction: inputs sorted by length, batches of at most 64 inputs
and 2,048 tokens padded to their own longest member, run side by side on single-threaded
workers (one per CPU thread), outputs trimmed and returned in input order. The encoder's torch
weights are never loaded.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch
from tqdm.auto import tqdm

from bertheads.base.errors import UserError
from bertheads.encoder.pretrained import EncoderInfo, load_tokenizer
from bertheads.export.onnx import GRAPHS, INPUTS, META, ONNX_DIR, PRECISIONS, manifest_digest, session
from bertheads.saved import bundle
from bertheads.text.batching import INFERENCE_BATCH, INFERENCE_TOKENS, MAX_CPU_WORKERS, sorted_batches
from bertheads.text.encoding import Feature, collate

RUNTIMES = ("torch", "onnx")


@dataclass
class OnnxSettings:
    """How the session runs. `workers`: batches run side by side on that many threads, each
    with a single-threaded session call (None: one per torch thread, as the torch path);
    `threads`: intra-op threads of the session (None: 1 with several workers, else the torch
    thread count)."""

    precision: str = "fp32"
    workers: int | None = None
    threads: int | None = None


def check_runtime(runtime: str, precision: str) -> None:
    if runtime not in RUNTIMES:
        raise UserError(f"--runtime: expected torch or onnx, got {runtime!r}")
    if precision not in PRECISIONS:
        raise UserError(f"--precision: expected fp32 or int8, got {precision!r}")
    if runtime == "torch" and precision != "fp32":
        raise UserError(f"--precision {precision} needs --runtime onnx (the torch runtime runs in fp32)")


def read_export(directory: Path, precision: str) -> tuple[dict, Path]:
    """export.json and the graph for `precision`, checked against the model's manifest."""
    onnx_dir = directory / ONNX_DIR
    meta_path = onnx_dir / META
    export_cmd = f"bertheads export {directory} --to onnx" + (" --quantize int8" if precision == "int8" else "")
    if not meta_path.is_file():
        raise UserError(f"{onnx_dir}: no ONNX export of this model; run `{export_cmd}`")
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"{meta_path}:{exc.lineno}: malformed JSON ({exc.msg})") from None
    graph = meta.get("graphs", {}).get(precision)
    if not graph:
        raise UserError(f"{onnx_dir}: no {precision} graph; run `{export_cmd}`")
    if meta.get("manifest_sha256") != manifest_digest(directory):
        raise UserError(f"{onnx_dir}: the ONNX export does not match {directory / bundle.MANIFEST} and the heads "
                        f"(the model changed since it was exported); run `{export_cmd}` again")
    path = onnx_dir / graph.get("file", GRAPHS[precision])
    if not path.is_file():
        raise UserError(f"{path}: missing; run `{export_cmd}`")
    return meta, path


class OnnxNet:
    """The tasks of a saved model and an ONNX Runtime session holding its encoder and heads."""

    runtime = "onnx"

    def __init__(self, directory: str | Path, settings: OnnxSettings | None = None) -> None:
        self.settings = settings or OnnxSettings()
        directory = Path(directory)
        manifest = bundle.read_manifest(directory)
        meta, path = read_export(directory, self.settings.precision)
        tokenizer = load_tokenizer(str(directory / "encoder"))
        config = json.loads((directory / "encoder" / "config.json").read_text())
        info = EncoderInfo(hidden_size=int(config.get("hidden_size", config.get("dim", 0))),
                           num_layers=int(config.get("num_hidden_layers", config.get("n_layers", 0))),
                           uses_token_types=int(config.get("type_vocab_size", 0) or 0) > 1
                           and "token_type_ids" in tokenizer.model_input_names)
        # what tasks and callers read from a model's encoder (no torch weights are loaded)
        self.encoder = SimpleNamespace(tokenizer=tokenizer, info=info, pooler_state=None)
        self.tasks = {}
        for name, entry in manifest["heads"].items():
            cls = bundle.task_class(entry["kind"])
            self.tasks[name] = cls.build(cls.spec_from_dict(entry["spec"]), self.encoder)
        self.manifest = manifest
        self.meta = meta
        self.path = path
        self.precision = self.settings.precision
        workers, threads = self.parallelism()
        self.session = session(path, threads)
        self.input_names = [i.name for i in self.session.get_inputs()]
        outputs = {o.name for o in self.session.get_outputs()}
        missing = [n for n in self.tasks if n not in outputs]
        if missing or set(self.input_names) - set(INPUTS):
            raise UserError(f"{path}: the graph does not match the model (heads {', '.join(self.tasks)}; graph "
                            f"outputs {', '.join(sorted(outputs))}); run `bertheads export {directory} --to onnx`")
        self.heads = {name: SimpleNamespace(token_level=bool(meta["heads"][name]["token_level"]))
                      for name in self.tasks}

    def parallelism(self) -> tuple[int, int]:
        """(workers, intra-op threads per session call)."""
        cpus = torch.get_num_threads() or os.cpu_count() or 1
        workers = self.settings.workers or min(cpus, MAX_CPU_WORKERS)
        threads = self.settings.threads or max(1, cpus // workers)
        return workers, threads

    # the torch model's interface that callers use
    def eval(self) -> OnnxNet:
        return self

    def train(self, mode: bool = True) -> OnnxNet:
        return self

    @property
    def training(self) -> bool:
        return False

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def run_heads(self, features: Sequence[Feature], names: Sequence[str], batch_size: int = INFERENCE_BATCH,
                  max_tokens: int | None = INFERENCE_TOKENS, progress: str | None = None) -> dict[str, list]:
        """Head outputs per feature, in input order (what `model.run_heads` returns)."""
        names = list(names)
        pad_id = self.encoder.tokenizer.pad_token_id or 0
        lengths = [len(f["input_ids"]) for f in features]
        results: dict[str, list] = {n: [None] * len(features) for n in names}
        batches = sorted_batches(lengths, batch_size, max_tokens)
        token_level = {n: self.heads[n].token_level for n in names}

        def run(idx: list[int]) -> int:
            batch = collate([{"input_ids": features[i]["input_ids"],
                              "token_type_ids": features[i].get("token_type_ids")} for i in idx], pad_id)
            feed = {k: batch[k].numpy() for k in self.input_names}
            outs = self.session.run(names, feed)
            for name, arr in zip(names, outs):
                for j, i in enumerate(idx):
                    results[name][i] = arr[j, : lengths[i]] if token_level[name] else arr[j]
            return len(idx)

        bar = tqdm(total=len(features), desc=progress, unit="ex", disable=None if progress else True, leave=False)
        workers, _ = self.parallelism()
        try:
            if workers > 1 and len(batches) > 1:
                with ThreadPoolExecutor(min(workers, len(batches))) as pool:
                    for done in pool.map(run, batches):
                        bar.update(done)
            else:
                for idx in batches:
                    bar.update(run(idx))
        finally:
            bar.close()
        return results


def load_onnx(directory: str | Path, precision: str = "fp32", settings: OnnxSettings | None = None) -> OnnxNet:
    """The ONNX Runtime model of a saved model directory (its `DIR/onnx/` export)."""
    check_runtime("onnx", precision)
    settings = settings or OnnxSettings()
    settings.precision = precision
    return OnnxNet(directory, settings)

