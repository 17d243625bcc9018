"""The Python API: `train(...)` a head on an encoder (or `train_multi(...)` several), `load(DIR)`
a saved model, then `predict`, `evaluate` and, with several heads, `analyze`."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from bertheads.base.errors import UserError
from bertheads.base.progress import api_logging
from bertheads.base.schema import check_given, from_mapping, names, said
from bertheads.compute.batching import INFERENCE_BATCH
from bertheads.export.gate import gate_model
from bertheads.export.modes import RuntimeSettings
from bertheads.inference.analyze import analyze, split_extras
from bertheads.inference.calibrate import recalibrate
from bertheads.inference.opening import open_model
from bertheads.inference.outputs import claimed_output
from bertheads.inference.path import head_outputs, predict_examples
from bertheads.inference.report import report
from bertheads.inference.select import Selection, SelectSettings, select
from bertheads.inference.stream import (
    StreamReport,
    StreamSettings,
    analyze_stream,
    evaluate_stream,
    predict_chunks,
    predict_stream,
)
from bertheads.model import BertHeads, pick_head
from bertheads.saved import bundle
from bertheads.saved.combine import combine as combine_models
from bertheads.saved.combine import into_source
from bertheads.store.encoder_refs import named_encoder
from bertheads.text.readers import carried_fields
from bertheads.text.rows import as_rows, split_dataset
from bertheads.training.audit import AuditResult, AuditSettings, audit_task
from bertheads.training.config import MultiConfig, multi_task_manifest, read_config, run_settings, single_task
from bertheads.training.distill import DistillData, DistillSettings, distill_model
from bertheads.training.flags import convert_options, kind_options, task_class
from bertheads.training.joint import train_tasks
from bertheads.training.settings import TrainSettings


class Model:
    """A loaded bertheads model: one encoder and one or more named heads."""

    def __init__(self, net: BertHeads, directory: str | Path | None = None) -> None:
        self.net = net
        self.directory = Path(directory) if directory else None
        self.metrics: dict | None = None  # what training returned, for a model not saved
        self.mode = None  # the export.modes.Mode it runs in (device, runtime, precision, why)
        self.verbose = True  # bertheads' lines on stderr at INFO (when logging is not set up): `load(verbose=)`

    @property
    def heads(self) -> dict[str, str]:
        """Head name -> task kind."""
        return {name: task.kind for name, task in self.net.tasks.items()}

    @property
    def labels(self) -> dict[str, list]:
        """Head name -> the labels its predictions name, in output order (a classify head's
        labels or their names, a tag head's tags; empty for a head without labels)."""
        return {name: task.publishing.output_labels() for name, task in self.net.tasks.items()}

    @property
    def id2label(self) -> dict[str, dict[int, str]]:
        """Head name -> {output index: label}, as a transformers config's `id2label`."""
        return {name: dict(enumerate(map(str, labels))) for name, labels in self.labels.items()}

    def task(self, head: str | None = None):
        return self.net.tasks[self.head_name(head)]

    def head_name(self, head: str | None) -> str:
        return pick_head(self.net, head)

    def bound(self, head: str | None, options: dict) -> tuple[str, Any]:
        """The head's name and its task bound to a call's inference `options` (`Options.bind`)."""
        name = self.head_name(head)
        return name, self.net.tasks[name].options.bind(options)

    def predict(self, inputs, head: str | None = None, batch_size: int = INFERENCE_BATCH,
                keep_fields: tuple[str, ...] = (), **options):
        """Predictions for Python inputs: texts, (text, text) pairs or a task's own records; or
        a pandas DataFrame, a `datasets.Dataset` or a list of dicts, whose columns are found as
        a file's are (the predictions of a DataFrame come back as a DataFrame with its index;
        of other rows, as dicts carrying each row's `id` and `keep_fields`). `options` are the
        head's kind's inference options (`Parts.options`). One input of the head's form (a
        string; a pair head's `(text, text)`; a question head's dict) gives one prediction."""
        name, task = self.bound(head, options)
        if task.reading.form.is_one(inputs):
            return self.predict([inputs], name, batch_size, keep_fields, **options)[0]
        if records_given(inputs):
            rows = as_rows(inputs, "predict")
            settings = StreamSettings(batch_size=batch_size, keep_fields=tuple(keep_fields), progress=False)
            predictions = [{**carried_fields(e.extra if hasattr(e, "extra") else {}, settings.keep_fields), **p}
                           for chunk, preds in predict_chunks(self.net, name, rows, settings, task=task)
                           for e, p in zip(chunk, preds)]
            return as_frame(predictions, rows.frame) if rows.frame is not None else predictions
        return predict_examples(self.net, name, task.reading.from_inputs(list(inputs)), batch_size, task)

    def select(self, pool, k: int = 100, head: str | None = None, out: str | Path | None = None,
               batch_size: int = INFERENCE_BATCH, **options) -> Selection:
        """The `k` inputs of `pool` (a file, a DataFrame, a `datasets.Dataset`, a list of dicts)
        most worth labelling next (`bertheads select`); `options`: `SelectSettings`' (strategy
        margin, entropy, diverse or random; seed). Their records, in the kind's training format
        with the label empty, are also written to `out` as JSON lines."""
        settings = from_mapping(SelectSettings, {"k": k, **options})
        rows = as_rows(pool, "pool") if records_given(pool) else None
        with claimed_output(out, [pool], self.folders(), "select", flag="out"), api_logging(self.verbose):
            return select(self.net, self.head_name(head), rows or pool, settings, out, batch_size)

    def predict_file(self, path: str | None, head: str | None = None, fmt: str | None = None,
                     batch_size: int = INFERENCE_BATCH, progress: bool = False, **options) -> tuple[list, list[dict]]:
        """Read a file in the task's formats (labels optional); the records and their predictions."""
        name, task = self.bound(head, options)
        examples = task.reading.read(path, need_labels=False, fmt=fmt)
        outputs = head_outputs(self.net, name, examples, batch_size, "predict" if progress else None, task)
        return examples, task.judging.decode(outputs, examples)

    def predict_iter(self, path, head: str | None = None, fmt: str | None = None,
                     settings: StreamSettings | None = None, **options) -> Iterator[dict]:
        """Predictions for a file (or an open text stream) of any size, one at a time in input
        order; the input is read and predicted a chunk at a time (`StreamSettings.chunk_size`)."""
        name, task = self.bound(head, options)
        for _, preds in predict_chunks(self.net, name, path, settings, fmt, task=task):
            yield from preds

    def predict_stream(self, path, output: str | Path | None = None, head: str | None = None,
                       fmt: str | None = None, settings: StreamSettings | None = None, write=None,
                       **options) -> StreamReport:
        """What `bertheads predict` does: predictions for a file of any size written to `output`
        (atomically) or, without one, to `write` (default: stdout) a chunk at a time; under
        torchrun the processes share the chunks (see `bertheads.inference.stream`)."""
        name, task = self.bound(head, options)
        with claimed_output(output, [path], self.folders()), api_logging(self.verbose):
            return predict_stream(self.net, name, path, None if output is None else str(output), settings, fmt,
                                  write, task)

    def set_options(self, head: str | None = None, **options) -> None:
        """Inference options for every later prediction (what the server's flags set): on
        `head`, or, when a model of several heads is given none, on each head whose kind takes
        the option (one that no head takes is a UserError)."""
        options = {k: v for k, v in options.items() if v is not None}
        if head is not None or len(self.net.tasks) == 1:
            self.task(head).options.set(**options)
            return
        for key, value in options.items():
            takers = [t for t in self.net.tasks.values() if key in t.options.declared()]
            if not takers:
                self.task(next(iter(self.net.tasks))).options.check({key: value})  # says why
            for task in takers:
                task.options.set(**{key: value})

    def render(self, predictions: list[dict], examples: list, fmt: str | None = None, head: str | None = None) -> str:
        """Predictions as the text `bertheads predict` writes (JSON lines unless the task has a format)."""
        return self.task(head).judging.render(predictions, examples, fmt)

    def evaluate(self, path, head: str | None = None, batch_size: int = INFERENCE_BATCH,
                 settings: StreamSettings | None = None, **options) -> dict:
        """The task's metrics on labelled data (a file, a DataFrame, a `datasets.Dataset` or a
        list of dicts), and the mean loss; a file is read a chunk at a time (see
        `stream.evaluate_stream` for what is held)."""
        path = as_rows(path, "evaluate") or path
        name, task = self.bound(head, options)
        settings = settings or StreamSettings(batch_size=batch_size)
        with api_logging(self.verbose):
            metrics = evaluate_stream(self.net, name, path, settings, task)
        if self.mode is not None:  # the figures are those of this runtime and precision
            metrics["mode"] = f"{self.mode.runtime} {self.mode.precision} on {self.mode.device}"
        return metrics

    def calibrate(self, data: str, out: str | Path, head: str | None = None,
                  batch_size: int = INFERENCE_BATCH) -> Model:
        """What `bertheads calibrate` does: this saved model with each head's temperature (or
        `head`'s) refitted on the labelled file `data`, written to the new folder `out` (the
        model's own folder is left as it is); the new model, loaded."""
        if self.directory is None:
            raise UserError("calibrate: the model is not saved; train it with an output directory")
        with api_logging(self.verbose):
            recalibrate(self.directory, data, out, head, batch_size)
        return load(out, runtime="torch", precision="fp32")

    def report(self, data: str | None = None, out: str | Path | None = None, head: str | None = None,
               audit: str | Path | None = None) -> Path:
        """Write the HTML report page of this saved model (see `bertheads.inference.report`; `audit`:
        a `bertheads audit` folder whose top suspects it shows); its path."""
        if self.directory is None:
            raise UserError("report: the model is not saved; train it with an output directory")
        return report(self.directory, data, out, head=head, audit=audit)

    def analyze(self, texts: list[str], batch_size: int = INFERENCE_BATCH, **given) -> list[dict]:
        """`{head: prediction}` per text from every head that answers, one encoder pass for the
        heads whose inputs encode alike. A head whose input form needs more than the text answers
        when that is given, one per text, by the name its form says (`second_texts` for pair
        heads, `questions` for question heads: see `GET /heads`); the other keywords are
        inference options, each given to the heads whose kind takes it."""
        extras, options = split_extras(self.net, given)
        return analyze(self.net, texts, extras, batch_size, **options)

    def analyze_stream(self, path, output: str | Path | None = None, settings: StreamSettings | None = None,
                       write=None, **options) -> StreamReport:
        """What `bertheads analyze` does: every head on each record of a file (or stream) of any
        size, a chunk at a time in input order, one JSON line each (see `inference.stream.analyze_stream`);
        `options`: inference options (`min_confidence`, ...), each given to the heads that take it."""
        with claimed_output(output, [path], self.folders(), "analyze"), api_logging(self.verbose):
            return analyze_stream(self.net, path, None if output is None else str(output), settings, write,
                                  **options)

    def folders(self) -> list[Path]:
        """The model folder this model was loaded from (an output never goes there)."""
        return [self.directory] if self.directory is not None else []


def load(directory: str | Path, settings: RuntimeSettings | None = None, **given) -> Model:
    """Load a model directory written by `bertheads train` (or `train(...)`). The keywords are
    `RuntimeSettings`' (over `settings`): `device` auto (the first GPU when there is one), cpu,
    cuda[:N], mps; `runtime` torch, onnx (ONNX Runtime) or openvino, the last two from the
    `DIR/onnx/` export (`bertheads export DIR --to onnx`); `precision` fp32, bf16, fp16 or int8;
    `gate_data`; `verify=False` skips the check of the encoder's weights against the hash saved
    with them; `encoder`: the checkpoint of a head-only model whose encoder is outside its folder
    (see `store.encoder_refs.reference_location`). `auto` takes the fastest mode this machine
    has whose lower precision passed the gate on the model's dev data (or `gate_data`);
    `Model.mode` says which ran and why."""
    settings = from_mapping(RuntimeSettings, given, base=settings or RuntimeSettings())
    with api_logging(settings.verbose), named_encoder(settings.encoder):
        net, mode = open_model(directory, settings.device, settings.runtime, settings.precision, settings.verify,
                               settings.gate_data, force=settings.force)
    model = Model(net, directory)
    model.mode, model.verbose = mode, settings.verbose
    return model


def records_given(inputs) -> bool:
    """A DataFrame, a Dataset or a list of dicts (read by column roles), not plain Python inputs."""
    if isinstance(inputs, (list, tuple)):
        return bool(inputs) and all(isinstance(i, dict) for i in inputs)
    return not isinstance(inputs, (str, Path)) and as_rows(inputs) is not None


def as_frame(predictions: list[dict], frame):
    """Predictions as a DataFrame with the input's index (one column per prediction field)."""
    return type(frame)(predictions, index=frame.index)


def predict(model: Model | str | Path, inputs, head: str | None = None, **options):
    """`load(model).predict(inputs, ...)` (a `Model` is used as it is)."""
    return (model if isinstance(model, Model) else load(model)).predict(inputs, head, **options)


def evaluate(model: Model | str | Path, data, head: str | None = None, **options) -> dict:
    """`load(model).evaluate(data, ...)` (a `Model` is used as it is)."""
    return (model if isinstance(model, Model) else load(model)).evaluate(data, head, **options)


def trained(net: BertHeads, out: str | Path | None, result: dict, settings: TrainSettings) -> Model:
    """The model a run saved (each lower precision this machine runs it in checked against fp32
    first), or, without `out`, the one in memory."""
    if out is not None:
        if os.environ.get("RANK", "0") == "0":
            gate_model(out, device=settings.device, exported=False, own=True)  # on the dev files this run read
        return load(out, runtime="torch", precision="fp32", verbose=settings.verbose)
    model = Model(net)
    model.metrics, model.verbose = result, settings.verbose
    return model


def train(kind: str, train=None, dev: str | None = None, out: str | Path | None = None, model: str = "default",
          settings: TrainSettings | None = None, limit: int | None = None, on_step=None, on_evaluate=None,
          into: str | Path | None = None, head_name: str | None = None, **options) -> Model:
    """Fine-tune (or, with mode="features", train a head on a frozen encoder) and save to `out`.

    `train` and `dev`: files, or data in memory (a pandas DataFrame, a `datasets.Dataset`, a
    list of dicts); a `DatasetDict` gives its "train" split, and its validation split as `dev`.

    `train=None` with a kind's settings that make a head alone (classify's
    `label_descriptions`): no training, the head as they make it (evaluated on `dev` if given).

    `options` are the task's settings (max_length, text_column, problem, layers, ...) and any
    training setting (epochs, lr, ...: over `settings`); an unknown name is refused with the
    closest known one suggested. This is joint training with a single task, the head named
    after its kind (`head_name` names it otherwise). `into`: a saved model of branch
    (`tune_layers`) or features heads that `out` gets with the trained head added (one of the
    same name replaced); the run trains on its checkpoint.

    Progress: a bar per epoch, for the dev evaluation after it and for `evaluate`, in a notebook
    or on a terminal; elsewhere lines on stderr with an ETA (`verbose=False`: warnings only).
    `on_step(step, loss)` is called after each optimizer step and `on_evaluate(epoch, dev)`
    after each evaluation (`dev`: {head: metrics}), for curves of your own.
    """
    task_class(kind)
    train, dev = split_dataset(train, dev)
    train, dev = as_rows(train, "train") or train, as_rows(dev, "dev") or dev
    given = check_given(options, kind_options(kind), TrainSettings)
    config = single_task(kind, train, dev, convert_options(kind, {k: v for k, v in given.items()
                                                                  if k not in names(TrainSettings)}), limit)
    # no settings given: the kind's own defaults (qa: batches of 16), as on the command line
    settings, _, _ = run_settings(config, settings, {k: v for k, v in given.items() if k in names(TrainSettings)})
    if head_name:
        config = named_head(config, head_name)
    with api_logging(settings.verbose):
        net, result, out = train_into(into, model, out, lambda source, to: train_tasks(
            config, to, source, settings, on_step=on_step, on_evaluate=on_evaluate))
        return trained(net, out, result, settings)


def named_head(config: MultiConfig, name: str) -> MultiConfig:
    """A one-task config whose head is called `name` (`head_name`) rather than after its kind."""
    if not config.single:
        raise UserError(f"{said('head_name')}: a config of several tasks names them itself")
    if not bundle.HEAD_NAME.match(name):
        raise UserError(f"{said('head_name', name)}: not a valid head name (letters, digits, '_', '.', '-')")
    return dataclasses.replace(config, tasks=[dataclasses.replace(config.tasks[0], name=name)])


def train_into(into: str | Path | None, model: str | None, out: str | Path | None, run) -> tuple:
    """`run(checkpoint, out)` (a training run), and with `into` (a saved model of branch or
    features heads) the trained heads added to its heads at `out` (a head of the same name
    replaced); the run trains on `into`'s checkpoint. Returns the run's (net, result) and `out`."""
    if into is None:
        return (*run(model or "default", out), out)
    if out is None:
        raise UserError(f"{said('into')}: needs {said('out')}, the model to write")
    bundle.check_writable_out(out, models=bundle.model_folders(into))
    source = into_source(into)
    Path(out).resolve().parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".bertheads-into-", dir=Path(out).resolve().parent) as scratch:
        trained_to = Path(scratch) / "heads"
        net, result = run(source if model in (None, "default") else model, trained_to)
        combine_models([into, trained_to], out, replace=True)
    return net, result, out


def audit(kind: str, train, dev=None, out: str | Path | None = None, model: str = "default",
          settings: TrainSettings | None = None, limit: int | None = None, **options) -> AuditResult:
    """The training rows whose given label the model disputes, ranked (`bertheads audit`):
    out-of-fold predictions from `folds` heads (each trained as `train` would, on the other
    folds; mode="features" trains them on the features cache in seconds), ranked by cleanlab.
    `train`/`dev` as `train` takes them; `options`: the task's settings, any training setting
    and the audit's (`AuditSettings`: folds, rows, top). With `out`, writes `out/issues.jsonl`
    and `out/summary.json`."""
    task_class(kind)
    train, dev = split_dataset(train, dev)
    train, dev = as_rows(train, "train") or train, as_rows(dev, "dev") or dev
    given = check_given(options, kind_options(kind), TrainSettings, AuditSettings)
    chosen = from_mapping(AuditSettings, {k: v for k, v in given.items() if k in names(AuditSettings)})
    config = single_task(kind, train, dev, convert_options(kind, {k: v for k, v in given.items()
                                                                  if k in kind_options(kind)}), limit)
    settings, _, _ = run_settings(config, settings, {k: v for k, v in given.items() if k in names(TrainSettings)})
    return audit_task(config, out, model, settings, chosen, limit)


def train_multi(config: MultiConfig | str | Path, out: str | Path | None, model: str | None = None,
                settings: TrainSettings | None = None, limit: int | None = None, on_step=None, on_evaluate=None,
                **options) -> Model:
    """Train every task of a config (a file or a `MultiConfig`) on one shared encoder; save the
    kept epoch to `out`. The file's settings apply over `settings`; `options` (any training
    setting, or head options such as max_length, mode, layers, which apply to every task unless
    a task sets its own) over the file's. Unknown names are refused with a suggestion.
    Progress and `on_step` / `on_evaluate` as in `train`."""
    if not isinstance(config, MultiConfig):
        config = read_config(config)
    given = {k: v for k, v in {"model": model, "limit": limit, **options}.items()
             if v is not None or k not in ("model", "limit")}
    settings, run, cli_options = run_settings(config, settings, given)
    if run.get("head_name"):
        config = named_head(config, run["head_name"])
    manifest = multi_task_manifest(config) if not config.single else None
    with api_logging(settings.verbose):
        net, result, out = train_into(run.get("into"), run.get("model"), out, lambda source, to: train_tasks(
            config, to, source, settings, run.get("limit"), cli_options, manifest, on_step=on_step,
            on_evaluate=on_evaluate))
        return trained(net, out, result, settings)


def distill(teacher: str | Path, out: str | Path | None, data: str | None = None, train: str | None = None,
            dev: str | None = None, model: str = "default", settings: TrainSettings | None = None,
            **options) -> Model:
    """A student of the `teacher` model (every head) on the checkpoint `model`, trained on the
    teacher's scores of the unlabelled `data` (and of `train`, whose gold labels it learns too),
    saved to `out` as `train` saves a model (`bertheads distill`). `options`: the distillation's
    settings (`DistillSettings`: soft_temperature, soft_weight, ...) and any training setting
    (epochs, lr, ...: over `settings`); an unknown name is refused with the closest known one."""
    given = check_given(options, DistillSettings, TrainSettings)
    chosen = from_mapping(DistillSettings, {"model": model, **{k: v for k, v in given.items()
                                                              if k in names(DistillSettings)}})
    settings = replace(settings or TrainSettings(), **{k: v for k, v in given.items() if k in names(TrainSettings)})
    files = DistillData(str(teacher), data, train, dev)
    with api_logging(settings.verbose):
        net, result = distill_model(files, out, settings, chosen)
        return trained(net, out, result, settings)


def combine(directories: list[str | Path], out: str | Path, names: list[str] | None = None) -> Model:
    """One model holding the heads of several models whose encoders are identical."""
    return load(combine_models(directories, out, names))
