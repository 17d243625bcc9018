"""The Python API: `train(...)` a head on an encoder, `load(DIR)` a saved model, then
`predict`, `evaluate` (and, with several heads, `analyze`)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import torch

from bertheads import bundle
from bertheads.encoder import Encoder
from bertheads.errors import UserError
from bertheads.features import parse_layers
from bertheads.model import BertHeads
from bertheads.packing import INFERENCE_BATCH
from bertheads.train import TaskData, TrainSettings, fit


class Model:
    """A loaded bertheads model: one encoder and one or more named heads."""

    def __init__(self, net: BertHeads, directory: str | Path | None = None) -> None:
        self.net = net
        self.directory = Path(directory) if directory else None

    @property
    def heads(self) -> dict[str, str]:
        """Head name -> task kind."""
        return {name: task.kind for name, task in self.net.tasks.items()}

    def task(self, head: str | None = None):
        return self.net.tasks[self.head_name(head)]

    def head_name(self, head: str | None) -> str:
        if head is None:
            if len(self.net.tasks) == 1:
                return next(iter(self.net.tasks))
            raise UserError(f"this model has several heads ({', '.join(self.net.tasks)}); choose one with --head")
        if head not in self.net.tasks:
            raise UserError(f"no head named {head!r} (heads: {', '.join(self.net.tasks)})")
        return head

    def predict(self, inputs: list, head: str | None = None, batch_size: int = INFERENCE_BATCH, **options) -> list[dict]:
        """Predictions for Python inputs (texts, (text, text) pairs, or a task's own records)."""
        name = self.head_name(head)
        task = self.net.tasks[name]
        examples = task.from_inputs(list(inputs), **options)
        return task.decode(task.outputs(self.net, name, examples, batch_size), examples, **options)

    def predict_file(self, path: str | None, head: str | None = None, fmt: str | None = None,
                     batch_size: int = INFERENCE_BATCH, progress: bool = False, **options) -> tuple[list, list[dict]]:
        """Read a file in the task's formats (labels optional); the records and their predictions."""
        name = self.head_name(head)
        task = self.net.tasks[name]
        examples = task.read(path, need_labels=False, fmt=fmt, **options)
        outputs = task.outputs(self.net, name, examples, batch_size, progress="predict" if progress else None)
        return examples, task.decode(outputs, examples, **options)

    def render(self, predictions: list[dict], examples: list, fmt: str | None = None, head: str | None = None) -> str:
        """Predictions as the text `bertheads predict` writes (JSON lines unless the task has a format)."""
        return self.task(head).render(predictions, examples, fmt)

    def evaluate(self, path: str, head: str | None = None, batch_size: int = INFERENCE_BATCH, **options) -> dict:
        """The task's metrics on a labelled file."""
        name = self.head_name(head)
        task = self.net.tasks[name]
        examples = task.read(path, need_labels=True)
        outputs = task.outputs(self.net, name, examples, batch_size)
        return task.metrics(outputs, examples, path, **options)

    def analyze(self, texts: list[str], second_texts: list[str] | None = None, questions: list[str] | None = None,
                batch_size: int = INFERENCE_BATCH, **options) -> list[dict]:
        """`{head: prediction}` per text from every single-text head, one encoder pass for the heads
        whose inputs encode alike; pair heads run given `second_texts`, qa heads given `questions`."""
        from bertheads.multi import analyze

        return analyze(self, texts, second_texts, questions, batch_size, **options)


def load(directory: str | Path, device: str | torch.device | None = None, runtime: str = "torch",
         precision: str = "fp32") -> Model:
    """Load a model directory written by `bertheads train` (or `train(...)`).

    `runtime="onnx"` runs it with ONNX Runtime from its `DIR/onnx/` export (`bertheads export
    DIR --to onnx`), in `precision` "fp32" or "int8"."""
    from bertheads.runtime_onnx import check_runtime, load_onnx

    check_runtime(runtime, precision)
    if runtime == "onnx":
        return Model(load_onnx(directory, precision), directory)
    return Model(bundle.load(directory, device), directory)


def make_spec(cls, options: dict, encoder: Encoder):
    """The task's spec from CLI/API options (unknown keys are ignored)."""
    names = {f.name for f in fields(cls.spec_type)}
    spec = cls.spec_type(**{k: v for k, v in options.items() if k in names and v is not None})
    if isinstance(spec.layers, str) or spec.layers is None:
        spec.layers = list(parse_layers(spec.layers, encoder.info.num_layers))
    if spec.mode not in ("finetune", "features"):
        raise UserError(f"--mode: expected finetune or features, got {spec.mode!r}")
    return spec


def prepare_task(kind: str, train_path: str, dev_path: str | None, encoder: Encoder, options: dict,
                 limit: int | None = None, name: str | None = None) -> TaskData:
    """Read and encode one task's training (and dev) data and build its head."""
    cls = bundle.task_class(kind)
    spec = make_spec(cls, options, encoder)
    task, examples = cls.prepare(train_path, spec, encoder, **{k: v for k, v in options.items()
                                                                 if k in cls.prepare_options})
    if limit:
        examples = examples[:limit]
    features = task.encode(examples, encoder.tokenizer, with_labels=True, path=train_path)
    if not features:
        raise UserError(f"{train_path}: no usable training examples")
    dev = task.read(dev_path, need_labels=True) if dev_path else None
    return TaskData(name or kind, task, features, dev, dev_path)


def evaluate_task(model: BertHeads, data: TaskData, batch_size: int = INFERENCE_BATCH) -> dict:
    outputs = data.task.outputs(model, data.name, data.dev_examples, batch_size)
    return data.task.metrics(outputs, data.dev_examples, data.dev_path, during_training=True)


def train(kind: str, train: str, dev: str | None = None, out: str | Path | None = None, model: str = "default",
          settings: TrainSettings | None = None, limit: int | None = None, **options) -> Model:
    """Fine-tune (or, with mode="features", train a head on a frozen encoder) and save to `out`.

    `options` are the task's settings (max_length, text_column, problem, layers, ...).
    """
    settings = settings or TrainSettings()
    if out is not None:
        bundle.check_writable_out(out)
    torch.manual_seed(settings.seed)
    encoder = Encoder.load(model)
    data = prepare_task(kind, train, dev, encoder, options, limit)
    net = BertHeads(encoder, {data.name: data.task})
    if data.task.spec.mode == "features":
        from bertheads.features import attach_cache

        attach_cache(net, [data], options, model, train, progress=settings.progress)
    result = fit(net, [data], settings, out, evaluate_task, {"source_model": model})
    if out is not None:
        return load(out)
    net.metrics = result
    return Model(net)
