"""The parts a task kind is made of, each a small class in a module of the kind's own folder;
a `Task` (`tasks/base.py`) holds one of each (`task.reading`, `task.modeling`, ...) and every
caller names the part it asks. A part holds its task, whose spec, head and options it reads.
What a part leaves out has the default here.

```
Reading     its data: files and Python values -> examples                       KIND/reading.py
Modeling    its head, loss and training recipe: examples -> features -> loss       KIND/head.py
Judging     its decoding and metric: head outputs -> predictions and metrics     KIND/judging.py
Scoring     what its scores mean: calibration, abstention, audit and select     KIND/judging.py
Publishing  what it shows: GET /heads, the report, the model card, typed columns  KIND/publishing.py
Exporting   how `export --to hf` (and the ONNX graph) hold it                     KIND/publishing.py
Distilling  what a student of it learns from it as a teacher (optional)        KIND/distilling.py
```
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from bertheads.base.errors import UserError
from bertheads.base.schema import said, to_dict
from bertheads.tasks.calibration import Temperature
from bertheads.tasks.forms import TEXT, InputForm
from bertheads.tasks.options import NoOptions
from bertheads.tasks.recipes import FIXED, Recipe, recipe_for

ABSTAINED = "abstained"  # the field a prediction below --min-confidence says true in (`Scoring.abstain`)


@dataclass
class TextInput:
    """One encoder input as read from a file: a text, an optional second text, its line, and
    what the format adds ("id", "words": character spans of given words)."""

    text: str
    pair: str | None = None
    line: int | None = None
    extra: dict = field(default_factory=dict)

    def texts(self) -> dict:
        """Its texts as `extract`'s index records them."""
        return {"text": self.text, "pair": self.pair}


class Part:
    """A part of a task: it holds the task, whose settings (`spec`) it reads."""

    def __init__(self, task) -> None:
        self.task = task

    @property
    def spec(self) -> Any:
        return self.task.spec


class Reading(Part):
    """Its data: examples from the kind's file formats (with file and line in every error),
    from rows in memory, and from Python values; plain texts for `extract`."""

    form: InputForm = TEXT  # what one input is (`tasks/forms.py`); a kind may make it a property of the spec
    formats: ClassVar[tuple[str, ...]] = ()  # the formats `read` takes (predict's --format)
    text_formats: ClassVar[tuple[str, ...]] = ()  # the formats `read_texts` reads for `extract`
    generic_reader: ClassVar[bool] = False  # reads tables no other kind claims (classify)
    counts_lines: ClassVar[bool] = True  # False: records are not lines (progress counts records)

    def read(self, path, need_labels: bool = True, fmt: str | None = None) -> list:
        """The examples of a file (or rows in memory); labels required with `need_labels`.
        Call options (`task.options.values`) a kind reads inputs by are its own to read."""
        raise NotImplementedError

    def iter_read(self, path, need_labels: bool = True, fmt: str | None = None, keep: tuple[str, ...] = (),
                  bad=None):
        """`read` one example at a time as the input is read; `keep`: input fields carried into
        each prediction; `bad(error)`: told of a bad record, which is then skipped (None: raise)."""
        yield from self.read(path, need_labels, fmt)

    def from_inputs(self, inputs: list) -> list:
        """Examples from Python values, one per input of the kind's form."""
        raise NotImplementedError

    @classmethod
    def read_texts(cls, path: str | None, fmt: str) -> list[TextInput]:
        """Plain encoder inputs from the kind's own formats (`text_formats`), for `extract`."""
        raise NotImplementedError

    @classmethod
    def sniff_format(cls, path: str) -> str | None:
        """The kind's own format a file's name (or first bytes) shows, else None."""
        return None

    @classmethod
    def claims_records(cls, keys: set[str]) -> bool:
        """Whether JSON Lines records with these keys are inputs of this kind."""
        return False

    def blank_record(self, example) -> dict:
        """An unlabelled input as a record of the kind's training format with its label left
        empty (what `bertheads select` writes)."""
        raise UserError(f"{self.task.kind} heads have no selection of inputs")


@dataclass(frozen=True)
class AuditReader:
    """What a kind's `audit --mode features` folds train by default on the frozen states, when
    it is not the head `train` would train: its name (in the audit's log and summary) and the
    head options it sets (those the run leaves at the kind's defaults) besides `layers`: the
    last `last_layers` of the encoder (as many as it has); its `epochs` where the run gives none;
    `unless`: head options that, when given, make the trained head the reader."""

    name: str
    options: dict
    last_layers: int = 1
    epochs: int | None = None
    unless: tuple[str, ...] = ()

    def options_for(self, num_layers: int) -> dict:
        """Its options for an encoder of `num_layers` layers, `layers` among them."""
        count = max(1, min(self.last_layers, num_layers))
        return {**self.options, "layers": ",".join(str(-i) for i in range(1, count + 1))}


class Modeling(Part):
    """Its head, loss and training recipe: the features an example is encoded to (several when
    it is cut into windows), the loss, what one input's encoder pass costs, and the recipe a
    run's data size calls for (`tasks/recipes.py`)."""

    recipes: ClassVar[tuple[Recipe, ...]] = FIXED  # the training recipe by the data's size
    training_defaults: ClassVar[dict] = {}  # `train KIND` defaults of run settings that differ
    prepare_options: ClassVar[tuple[str, ...]] = ()  # run settings the kind's `prepare` takes (classify: limit)

    @classmethod
    def start_weights(cls, spec: Any, encoder) -> dict | None:
        """The checkpoint's weights a fresh head's first layer starts from (None: none)."""
        return None

    def recipe(self, examples: int, how: str = "auto") -> Recipe:
        """The row of this kind's recipe table for `examples` training examples (`how` "fixed":
        its last row), as this head's settled spec can take it."""
        return recipe_for(type(self).recipes, examples, how)

    def encode(self, examples: list, tokenizer, with_labels: bool = True, path: str | None = None) -> list[dict]:
        """Training features (with the loss's targets)."""
        raise NotImplementedError

    def encode_for_inference(self, examples: list, tokenizer, with_labels: bool = False) -> tuple[list[dict], list[int]]:
        """Features and their owners: `owner[i]` is the example feature i belongs to;
        `with_labels` adds the loss's targets (for the dev loss)."""
        raise NotImplementedError

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def dev_loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The loss an evaluation reports (the same during training and after loading): by default
        the training loss."""
        return self.loss(logits, batch)

    def encoder_cost(self, counts: tuple[int, ...]) -> tuple[tuple, int]:
        """The encoder pass one input of this head costs, from the token counts (no special
        tokens) of its texts (`form.texts`): `(key, tokens)`, heads with equal keys sharing the
        pass. One text is cut at max_length, two are packed as a pair."""
        length = int(self.spec.max_length)
        if len(counts) == 2:
            return ("two", length), min(counts[0] + counts[1] + 3, length)
        if counts[0] + 2 <= length:
            return ("whole",), counts[0] + 2
        return ("cut", length), length

    def output_hint(self) -> str:
        """What in the spec decides the head's output size, for weight-shape messages."""
        return ""

    def pair_labels(self, features: list[dict]) -> list[frozenset]:
        """`--mode contrastive`: each training feature's labels; two features sharing one are a
        positive pair, others a negative one. A kind that takes no contrastive tuning says so."""
        raise UserError(f"{said('mode', 'contrastive')}: {self.task.kind} heads do not take contrastive "
                        f"tuning (it pairs whole texts by their label); use {said('mode', 'features')} or finetune")


def learned_nothing_line(head: str, why: str) -> str:
    """The one-line warning of a head that learned nothing: what it means and what to try."""
    return (f"head {head!r} learned nothing: {why}; its outputs are no better than a guess. With a few hundred "
            f"examples or fewer, try {said('mode', 'features')}, {said('batch_size', 8)} or more epochs ({said('epochs')}) "
            f"(docs/little-data.md)")


class Judging(Part):
    """Its decoding and metric: the outputs of one example's features merged (`collect`),
    predictions (`decode`), their text (`render`), and the metrics, a chunk at a time."""

    main_metric: ClassVar[str]  # the dev metric that keeps an epoch by default
    metric_scale: ClassVar[float] = 1.0  # 100 when the metrics are percentages (SQuAD EM/F1)

    def collect(self, feature_outputs: list, owner: list[int], examples: list, features: list) -> list:
        """One output per example: the outputs of its features merged (windows joined, spans chosen)."""
        raise NotImplementedError

    def decode(self, outputs: list, examples: list) -> list[dict]:
        """What `predict` writes, a JSON-able dict per example (the call options bound to the task,
        `task.options.values`, say how)."""
        raise NotImplementedError

    def metrics(self, outputs: list, examples: list, path=None, during_training: bool = False) -> dict:
        """What `evaluate` reports (`during_training` after an epoch: what training settles
        from dev, a threshold, may be settled here)."""
        raise NotImplementedError

    def metric_part(self, outputs: list, examples: list, path=None):
        """What `metrics` needs of one chunk of a streamed evaluation (by default everything)."""
        return outputs, examples

    def metrics_from_parts(self, parts: list, path=None, during_training: bool = False) -> dict:
        """`metrics` over all the chunks' parts (see `metric_part`)."""
        return self.metrics([o for p in parts for o in p[0]], [e for p in parts for e in p[1]], path, during_training)

    def learned_nothing(self, metrics: dict) -> str | None:
        """What in `metrics` (of labelled data) says the head learned nothing: one class for every
        input, chance-level agreement or worse (below the majority class), an entity type never found, no answer ever right; None
        when nothing does (or there is too little to tell)."""
        return None

    def render(self, predictions: list[dict], examples: list, fmt: str | None = None) -> str:
        """The text `predict` writes: JSON lines unless the kind has a format of its own."""
        return "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in predictions)

    def part_rows(self, part, positions: list[int]):
        """`metric_part`'s result for the inputs at `positions` (each element indexed by input)."""
        return tuple(x[positions] if isinstance(x, np.ndarray) else [x[i] for i in positions] for x in part)


class Scoring(Part):
    """What its scores mean: the decisions a temperature is fitted on (the math:
    `tasks/calibration.py`), abstention below a confidence, and what `audit` and `select` read
    of a head (the labels it disputes, how unsure it is, the classes it was trained on)."""

    audit_reader: ClassVar[AuditReader | None] = None  # the audit's fold head on frozen states (None: the trained head's)

    def calibration_rows(self, outputs: list, examples: list, path=None) -> tuple[np.ndarray, np.ndarray] | None:
        """The decisions a temperature is fitted and measured on, from labelled outputs: each
        row's candidates' raw logits (`-inf` pads) and the right one's index (-1: none is right).
        None: the head has no scores to calibrate (the default)."""
        return None

    def no_calibration(self) -> str:  # why the head has no temperature when it has no rows
        return "this head gives no scores to calibrate"

    def temperature(self) -> float:
        """What the scores' logits are divided by now: the fitted temperature, unless there is
        none or calibration is off (`spec.calibrate`)."""
        t = getattr(self.spec, "temperature", None)
        return float(t) if t and getattr(self.spec, "calibrate", True) else 1.0

    def calibrator(self):
        """How the head's scores are calibrated (`calibration.Temperature`: one temperature)."""
        return Temperature()

    def confidence_part(self, outputs: list, examples: list, path=None) -> tuple[np.ndarray, np.ndarray] | None:
        """Each row's top score at the temperature in use and whether it is right (for the
        risk-coverage table and `--target-accuracy`); None without rows."""
        rows = self.calibration_rows(outputs, examples, path)
        calibrator = self.calibrator()
        return None if rows is None else calibrator.pairs(*rows, calibrator.in_use(self.task))

    def input_confidence(self, outputs: list, examples: list) -> np.ndarray | None:
        """Per input, what `--min-confidence` compares, where decisions are not inputs (then
        `calibration.metric_coverage` uses it); None: the decisions' table is that table."""
        return None

    def abstain(self, prediction: dict, confidence: float | None, min_confidence: float | None) -> dict:
        """`prediction` with `"abstained"` (whether its `confidence` is below `min_confidence`)
        when a minimum is given."""
        if min_confidence is None:
            return prediction
        return {**prediction, ABSTAINED: confidence is not None and confidence < float(min_confidence)}

    def disputes(self, outputs: list, examples: list, path=None) -> Disputes:
        """What `bertheads audit` ranks of the examples, from one output per example (out of
        fold; called with none first, to refuse a head it cannot audit before any training): by
        default nothing, the kind has no audit."""
        raise UserError(f"{self.task.kind} heads have no audit")

    def uncertainty(self, outputs: list) -> list[np.ndarray]:
        """What `bertheads select` weighs: per example, the probabilities (units x classes) of
        its units (one row for a whole-input judgment, one per token for a tagger)."""
        raise UserError(f"{self.task.kind} heads have no selection of inputs")

    def class_counts(self, examples: list) -> dict[str, int]:
        """How many of each class the head decides among `examples` (labelled) hold, by the
        names predictions show: what training saves (`trained_counts`) for `select` to read.
        By default none: a kind without classes (QA's spans) has no count."""
        return {}

    def scarce_classes(self, fewest: int) -> dict[str, int]:
        """The classes the head was trained on fewer than `fewest` examples of (a head saved
        before training counted them: none)."""
        return {name: n for name, n in self.spec.trained_counts.items() if n < fewest}


@dataclass(frozen=True)
class ListOf:
    """A column type: a list of `item` (a column type)."""

    item: Any


@dataclass(frozen=True)
class Struct:
    """A column type: named fields, each a column type (`str`, `int`, `float`, `bool`, `ListOf`,
    `Struct`); what a prediction's columns are typed as, for Parquet, Arrow and Spark."""

    fields: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, **fields) -> Struct:
        return cls(tuple(fields.items()))


@dataclass
class Disputes:
    """What an audit ranks, from one head's out-of-fold outputs (`Judging.disputes`): units
    (an example, or a token of one) whose given label is judged. `units[i]` holds `example`
    (the index of its example) and what the kind shows of it (its text, a token's character
    offsets); `labels[i]` is the given label's class index (a list of them for multi-label
    units); `probs` the out-of-fold probabilities (units x classes), or None when the kind
    scores units itself (`scores`: lower is more suspect, in [0, 1])."""

    units: list[dict]
    labels: list
    names: list[str]
    probs: np.ndarray | None = None
    multi_label: bool = False
    scores: np.ndarray | None = None
    suggested: list | None = None  # with `scores`: what the model prefers, per unit
    flagged: np.ndarray | None = None  # with `scores`: the units the kind calls label issues
    unit: str = "row"  # what a unit is ("row", "token", "question"), for the summary


@dataclass
class CardText:
    """What a model card says of one head in its kind's words (`Task.card_text`)."""

    outputs: str  # what one prediction holds
    raw_outputs: str  # what the head's raw outputs are (an ONNX graph's output)
    pipeline_tag: str | None = None  # the Hugging Face Hub's task tag (None: none fits)
    labels: list[str] = field(default_factory=list)  # what the head chooses among (empty: nothing named)
    labels_title: str = "labels"  # what they are called
    limits: list[str] = field(default_factory=list)  # what the head cannot do, a sentence each
    example: Any = "A sample text."  # one input as `Model.predict` takes it


class Publishing(Part):
    """What it shows: the head in `GET /heads`, its figures in the report, its lines in the
    model card, and a prediction as typed columns."""

    shows: ClassVar[str] = "json"  # the web page's drawing: "scores", "entities", "answer" or "json"

    def describe(self) -> dict:
        """The head as `GET /heads` lists it (the name is added by the caller): its input form
        and how the page draws its predictions (`shows`)."""
        return {"kind": self.task.kind, **self.task.reading.form.describe(), "shows": self.shows}

    def report_section(self, outputs: list, examples: list, metrics: dict, section) -> None:
        """Add the kind's figures and tables for a labelled data file to the report's `section`
        (a `tasks.figures.Section`); by default, the metrics table alone."""
        section.notes.append(f"no figures for {self.task.kind} heads beyond the metrics")

    def card_text(self) -> CardText:
        """What the model card says of this head; by default its help line, the transformers
        pipeline task as the Hub's tag and an input of its form."""
        return CardText(outputs=self.task.help, raw_outputs="the head's raw scores",
                        pipeline_tag=self.task.exporting.hf_pipeline, example=self.task.reading.form.example)

    def output_labels(self) -> list:
        """The labels the head's predictions name, in output order (`Model.labels`); none by default."""
        return []

    # -- a prediction as typed columns (engines/batches.py: Ray, Spark, Dask, Parquet) ----------
    def output_columns(self) -> Struct:
        """A prediction's fields as typed columns (see `Struct`); by default the prediction as
        one JSON string, for a kind that names no types."""
        return Struct.of(prediction=str)

    def output_row(self, prediction: dict) -> dict:
        """One prediction's values for `output_columns` (a missing field is null)."""
        return {"prediction": json.dumps(prediction, ensure_ascii=False)}

    def columns(self) -> Struct:
        """The typed columns of this task as bound (`options.bind`): `output_columns`, with
        `abstained` when it has a `min_confidence`, as its JSON lines carry it. What every
        table output reads (Parquet, `BatchPredictor`, Ray, Spark, Dask)."""
        columns = self.output_columns()
        if self.task.options.values.min_confidence is None:
            return columns
        return Struct((*columns.fields, (ABSTAINED, bool)))

    def row(self, prediction: dict) -> dict:
        """One prediction's values for `columns`."""
        row = self.output_row(prediction)
        if self.task.options.values.min_confidence is not None:
            row[ABSTAINED] = prediction.get(ABSTAINED)
        return row


class Exporting(Part):
    """How `export --to hf` holds it (a transformers AutoModelFor... class and pipeline), and
    what an export cannot take."""

    hf_auto_class: ClassVar[str | None] = None  # transformers AutoModelFor... class (None: no export)
    hf_pipeline: ClassVar[str | None] = None  # transformers pipeline task name

    def usage(self, path: str) -> str:
        """Python lines that run the `export --to hf` directory at `path` (a transformers
        pipeline of `hf_pipeline` with `pipeline_options`, on the card's example)."""
        options = "".join(f", {k}={v!r}" for k, v in self.pipeline_options().items())
        return (f"from transformers import pipeline\n\n"
                f"pipe = pipeline({self.hf_pipeline!r}, model={path!r}{options})\n"
                f"print(pipe({self.task.publishing.card_text().example!r}))\n")

    def check(self, name: str, to: str) -> None:
        """Refuse (UserError) a head that `to` ("hf": no `hf_auto_class` model computes it; "onnx":
        the graph cannot hold its layers) cannot take."""
        if to == "hf" and self.hf_auto_class is None:
            raise UserError(f"head {name!r}: {self.task.kind} heads have no transformers equivalent")

    def configure(self, config) -> None:
        """Set the head's outputs on the transformers config (by default its labels, `id2label`)."""
        set_labels(config, [str(label) for label in self.task.publishing.output_labels()])

    def copy_head(self, model: nn.Module, name: str) -> None:
        """Copy the head's weights into the transformers model's head (UserError: no fit)."""
        raise UserError(f"head {name!r}: {self.task.kind} heads have no transformers equivalent")  # pragma: no cover

    def outputs(self, out) -> torch.Tensor:
        """The transformers model's outputs in the head's own layout (to compare them)."""
        return out.logits

    def pipeline_options(self) -> dict:
        """Keywords the transformers pipeline should be given for this head."""
        return {}

    def fold_temperature(self, model: nn.Module) -> str | None:
        """Fold the head's temperature into the transformers model where that gives the
        pipeline the calibrated scores (classify, tag: `calibration.fold_into_output_layer`);
        what was done, in a sentence (None: no temperature in use). By default: not folded."""
        t = self.task.scoring.temperature() if getattr(self.spec, "temperature", None) else None
        return None if t in (None, 1.0) else f"temperature {t:g} not folded: the pipeline's scores are not bertheads'"


class Distilling(Part):
    """How a student of this head learns from a teacher (`training/distill.py`): the student's
    spec, the teacher's scores in a form no tokenizer shapes, the targets they give the
    student's own features, and the loss. A kind that writes none cannot be distilled. A task
    does not hold one: distillation makes it, `Distilling.of(task)`."""

    @classmethod
    def of(cls, task) -> Distilling:
        """The distilling part of `task`'s kind, holding the task."""
        return type(task).parts.distilling(task)

    def student_spec(self) -> Any:
        """A copy of this head's spec for a student on another encoder: what the data settled
        (labels, tags, ...) kept; what the encoder or a fit settled (layers, head layout,
        temperature) left to settle again."""
        spec = type(self.spec).from_saved(to_dict(self.spec))
        spec.mode, spec.layers, spec.combine, spec.head_family = "finetune", [-1], "concat", None
        spec.temperature, spec.trained_counts = None, {}
        return spec

    def teacher_scores(self, outputs: list, owner: list[int], examples: list, features: list) -> list:
        """A teacher's raw scores of each example from its features' outputs, in a form that
        does not depend on its tokenizer (what distillation caches and a student's tokens read)."""
        raise UserError(f"{self.task.kind} heads cannot be distilled")

    def soft_targets(self, examples: list, scores: list, tokenizer, with_labels: bool) -> list[dict]:
        """A student's training features for `examples`, each carrying the teacher's `scores`
        mapped onto its own tokens (and the gold labels `with_labels`)."""
        raise UserError(f"{self.task.kind} heads cannot be distilled")

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor], temperature: float,
             soft_weight: float) -> torch.Tensor:
        """The student's loss on a batch of `soft_targets` features: the teacher's scores at
        `temperature`, with the gold labels where a feature has them (`soft_weight`: the
        teacher's share there)."""
        raise UserError(f"{self.task.kind} heads cannot be distilled")


@dataclass(frozen=True)
class Parts:
    """What a kind is made of: the class of each part its tasks hold, and its call options
    (the flags `predict`, `evaluate` and `serve` add for its heads: a dataclass of `option`s)."""

    reading: type[Reading] = Reading
    modeling: type[Modeling] = Modeling
    judging: type[Judging] = Judging
    scoring: type[Scoring] = Scoring
    publishing: type[Publishing] = Publishing
    exporting: type[Exporting] = Exporting
    options: type = NoOptions
    distilling: type[Distilling] = Distilling  # (a kind that writes none cannot be distilled)


def set_labels(config, labels: list[str]) -> None:
    """A transformers config's outputs: their number, `id2label` and `label2id`."""
    config.num_labels = len(labels)
    config.id2label = dict(enumerate(labels))
    config.label2id = {label: i for i, label in enumerate(labels)}


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis (an empty array as it is)."""
    if not len(x):
        return x
    z = x - x.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)
