"""What every task kind provides: reading its formats, encoding, its head, loss, decoding
and metrics. The training loop and the bundle only talk to this interface."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from bertheads.base import schema
from bertheads.base.errors import UserError
from bertheads.text.encoding import MAX_LENGTH

TASKS: dict[str, type[Task]] = {}  # kind -> its Task class (`bertheads.tasks.register` adds one)
COMMANDS = ("predict", "evaluate", "serve")  # the commands whose flags inference options are


@dataclass
class TextInput:
    """One encoder input as read from a file: a text, an optional second text, its line, and
    what the format adds ("id", "words": character spans of given words)."""

    text: str
    pair: str | None = None
    line: int | None = None
    extra: dict = field(default_factory=dict)


def option(default: Any = None, help: str = "", *, commands: tuple[str, ...] = COMMANDS, spec: bool = False,
           **kwargs) -> Any:
    """An inference option of a kind (a `schema.setting`): the `commands` whose flags it is, and
    whether it overrides the saved spec field of its name (`spec=True`) or is passed on to
    `read`, `from_inputs`, `decode` and `metrics` as a keyword."""
    return schema.setting(default, help, extra={"commands": tuple(commands), "spec": spec}, **kwargs)


@dataclass
class NoOptions:
    """The inference options of a kind that has none."""


@dataclass
class HeadSettings:
    """Settings shared by every head; each kind's spec extends these."""

    max_length: int = MAX_LENGTH
    mode: str = "finetune"  # or "features": frozen encoder, only the head learns
    layers: list[int] = field(default_factory=lambda: [-1])
    combine: str = "concat"
    dropout: float = 0.1
    head_family: str | None = None  # whose head layout (`tasks/families.py`); None: the encoder's, settled at build


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


EXAMPLES = {"text": "A sample text.", "pair": ("A first text.", "A second text."),
            "question": {"question": "Where does the tower stand?",
                         "context": "The tower was finished in 1889 and stands in Paris."}}


class Task:
    """A decision kind bound to its settings (`spec`) and its head module.

    Each kind implements:
      build(spec, encoder, pooler_state=None) -> Task        (classmethod) fresh head
      prepare(path, spec, encoder, **prepare_options)       (classmethod) read the training
          file, settle label maps etc. in `spec`, return (task, training examples)
      read(path, need_labels=True, fmt=None, **options) -> examples (file/line errors as UserError)
      from_inputs(inputs, **options) -> examples             Python values for `predict`
      encode(examples, tokenizer, with_labels=True, path=None) -> list of features
      loss(logits, batch) -> scalar tensor
      encode_for_inference(examples, tokenizer, with_labels=False) -> (features, owner): owner[i]
          is the index of the example feature i belongs to (several when an input is cut into
          windows); with_labels adds the loss's targets (for the dev loss)
      collect(feature_outputs, owner, examples, features) -> one output per example (head
          outputs of the features of each example merged: windows joined, spans chosen, ...)
      (`model.head_outputs(model, name, examples)` = encode_for_inference + run_heads + collect;
       a multi-head model runs several heads in one pass when their features are identical)
      decode(outputs, examples, **options) -> list of JSON-able dicts (what `predict` writes)
      metrics(outputs, examples, path=None, **options) -> dict (what `evaluate` reports);
          `during_training=True` when called after an epoch
      render(predictions, examples, fmt) -> str              text `predict` writes (JSONL default)
      describe() -> dict                                     what the server's /heads shows
      report_section(outputs, examples, metrics, section)    the report page's figures for the head
      hf_* (see "export")                                    how `export --to hf` writes the head
      card_text() -> CardText, hf_usage(path) -> str         what the model card (README.md) says
          of the head: outputs, labels, limits, the Hub's pipeline tag; the transformers snippet
      read_texts(path, fmt) -> list[TextInput]               (classmethod) plain encoder inputs
          from the kind's own file formats, for `extract` (`text_formats` lists them)

    Class attributes: `kind`, `help`, `main_metric`, `spec_type`, `training_defaults` (CLI
    defaults that differ, e.g. qa's max_length 384), `input_form` (what one input is: "text",
    "pair" or "question"; a classify head trained on pairs reads pairs), `text_formats`,
    `options_type` (the inference options, a dataclass of `option` fields), `shows` (how the
    web page draws a prediction), `counts_lines` (a streamed input's progress counts lines).
    """

    help: ClassVar[str] = ""
    training_defaults: ClassVar[dict] = {}  # CLI defaults that differ: max_length, batch_size

    kind: ClassVar[str]
    main_metric: ClassVar[str]
    spec_type: ClassVar[type]
    reads_pairs: ClassVar[bool] = False
    text_formats: ClassVar[tuple[str, ...]] = ()  # formats `read_texts` reads for `extract`
    generic_reader: ClassVar[bool] = False  # reads tables no other kind claims (classify)
    metric_scale: ClassVar[float] = 1.0  # 100 when the metrics are percentages (SQuAD EM/F1)
    prepare_options: ClassVar[tuple[str, ...]] = ()  # extra keyword options `prepare` takes
    options_type: ClassVar[type] = NoOptions  # inference options (predict/evaluate/serve flags)
    shows: ClassVar[str] = "json"  # the web page's drawing: "scores", "entities", "answer" or "json"
    counts_lines: ClassVar[bool] = True  # False: records are not lines (progress counts records)
    hf_auto_class: ClassVar[str | None] = None  # transformers AutoModelFor... class (None: no export)
    hf_pipeline: ClassVar[str | None] = None  # transformers pipeline task name

    def __init__(self, spec: Any, head: nn.Module) -> None:
        self.spec = spec
        self.head = head
        self.fixed_options: dict[str, Any] = {}  # call options set for good (`set_options`)

    # -- inference options --------------------------------------------------------------
    @classmethod
    def option_fields(cls) -> dict[str, dataclasses.Field]:
        """name -> field of the kind's inference options."""
        return {f.name: f for f in dataclasses.fields(cls.options_type)}

    def declared_options(self) -> dict[str, dataclasses.Field]:
        """The inference options of this head's kind (as registered)."""
        return TASKS.get(self.kind, type(self)).option_fields()

    def check_options(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """`given` (None values dropped) checked and converted like their flags; a name another
        kind declares is refused as "FLAG is for KIND heads", any other unknown name with the
        closest known one suggested."""
        own = self.declared_options()
        out = {}
        for name, value in given.items():
            if value is None:
                continue
            if name not in own:
                raise UserError(self.unknown_option(name, own))
            f = own[name]

            def fail(message: str, f=f, value=value) -> None:
                raise UserError(f"{schema.flag_of(f)} {value}: {message}")
            out[name] = schema.convert(f, value, fail)
        return out

    def unknown_option(self, name: str, own: Mapping[str, Any]) -> str:
        """Why `name` is no option of this head: another kind's, or a misspelling."""
        others = {kind: cls.option_fields() for kind, cls in TASKS.items() if kind != self.kind}
        takers = [kind for kind, fs in others.items() if name in fs]
        if takers:
            flag = schema.flag_of(others[takers[0]][name])
            return f"{flag} is for {' or '.join(takers)} heads, not {self.kind}"
        known = list(own) or [n for fs in others.values() for n in fs]
        close = schema.suggest(name, own) or schema.suggest(name, known)
        return f"unknown option {name!r}{close}"

    def set_options(self, **given: Any) -> None:
        """Options for every later prediction of this head: spec overrides replace the saved
        values, the others are passed to each call (a call's own keywords win)."""
        options = self.check_options(given)
        fields_ = self.declared_options()
        for name, value in options.items():
            if fields_[name].metadata.get("spec"):
                setattr(self.spec, name, value)
            else:
                self.fixed_options[name] = value

    @contextmanager
    def using_options(self, given: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        """For one call: the spec overrides among `given` applied (the saved values come back
        after), the keyword options to pass on (the fixed ones, then `given`'s) yielded."""
        options = self.check_options(given)
        fields_ = self.declared_options()
        overrides = {n: v for n, v in options.items() if fields_[n].metadata.get("spec")}
        saved = {n: getattr(self.spec, n) for n in overrides}
        for name, value in overrides.items():
            setattr(self.spec, name, value)
        try:
            yield {**self.fixed_options, **{n: v for n, v in options.items() if n not in overrides}}
        finally:
            for name, value in saved.items():
                setattr(self.spec, name, value)

    # -- manifest ---------------------------------------------------------------------
    def to_manifest(self) -> dict:
        return {"kind": self.kind, "spec": asdict(self.spec)}

    @classmethod
    def spec_from_dict(cls, data: dict) -> Any:
        """A saved spec; one saved before head families has BERT's head layout."""
        names = {f.name for f in fields(cls.spec_type)}
        if "head_family" in names:
            data = {"head_family": "bert", **data}
        return cls.spec_type(**{k: v for k, v in data.items() if k in names})

    @classmethod
    def add_arguments(cls, parser) -> None:
        """Kind-specific `bertheads train KIND` flags (their dests match spec fields)."""

    def iter_read(self, path, need_labels: bool = True, fmt: str | None = None, keep: tuple[str, ...] = (),
                  bad=None, **options):
        """`read` one example at a time as the input is read; `keep`: input fields carried into
        each prediction; `bad(error)`: told of a bad record, which is then skipped (None: raise)."""
        yield from self.read(path, need_labels, fmt, **options)

    def metric_part(self, outputs: list, examples: list, path=None, **options):
        """What `metrics` needs of one chunk of a streamed evaluation (by default everything)."""
        return outputs, examples

    def metrics_from_parts(self, parts: list, path=None, **options) -> dict:
        """`metrics` over all the chunks' parts (see `metric_part`)."""
        return self.metrics([o for p in parts for o in p[0]], [e for p in parts for e in p[1]], path, **options)

    def render(self, predictions: list[dict], examples: list, fmt: str | None = None) -> str:
        return "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in predictions)

    @property
    def input_form(self) -> str:
        """What one input is: "text", "pair" (two texts) or "question" (a question and a passage)."""
        return "pair" if getattr(self.spec, "pair", False) else "text"

    def describe(self) -> dict:
        """The head as the server's `/heads` lists it (the name is added by the caller): its
        input form and how the page draws its predictions (`shows`)."""
        return {"kind": self.kind, "inputs": self.input_form, "shows": self.shows}

    def report_section(self, outputs: list, examples: list, metrics: dict, section) -> None:
        """Add the kind's figures and tables for a labelled data file to the report's `section`
        (a `tasks.figures.Section`); by default, the metrics table alone."""
        section.notes.append(f"no figures for {self.kind} heads beyond the metrics")

    def onnx_check(self, name: str) -> None:
        """Refuse (UserError) a head whose layers the ONNX graph cannot hold."""

    # -- export --to hf ------------------------------------------------------------------
    def hf_check(self, name: str) -> None:
        """Refuse (UserError) a head that no `hf_auto_class` model computes."""
        if self.hf_auto_class is None:
            raise UserError(f"head {name!r}: {self.kind} heads have no transformers equivalent")

    def hf_labels(self) -> list[str]:
        """The output names the transformers config lists (`id2label`)."""
        raise UserError(f"{self.kind} heads have no transformers equivalent")  # pragma: no cover

    def hf_configure(self, config) -> None:
        """Set the head's outputs on the transformers config."""
        labels = self.hf_labels()
        config.num_labels = len(labels)
        config.id2label = dict(enumerate(labels))
        config.label2id = {label: i for i, label in enumerate(labels)}

    def hf_copy_head(self, model: nn.Module, name: str) -> None:
        """Copy the head's weights into the transformers model's head (UserError: no fit)."""
        raise UserError(f"head {name!r}: {self.kind} heads have no transformers equivalent")  # pragma: no cover

    def hf_outputs(self, out) -> torch.Tensor:
        """The transformers model's outputs in the head's own layout (to compare them)."""
        return out.logits

    def hf_pipeline_options(self) -> dict:
        """Keywords the transformers pipeline should be given for this head."""
        return {}

    # -- the model card (README.md of a saved model and of each export) ----------------------
    def card_text(self) -> CardText:
        """What the model card says of this head; by default its help line, the transformers
        pipeline task as the Hub's tag and an input of its `input_form`."""
        return CardText(outputs=self.help, raw_outputs="the head's raw scores", pipeline_tag=self.hf_pipeline,
                        example=EXAMPLES.get(self.input_form, EXAMPLES["text"]))

    def hf_usage(self, path: str) -> str:
        """Python lines that run the `export --to hf` directory at `path` (a transformers
        pipeline of `hf_pipeline` with `hf_pipeline_options`, on the card's example)."""
        options = "".join(f", {k}={v!r}" for k, v in self.hf_pipeline_options().items())
        return (f"from transformers import pipeline\n\n"
                f"pipe = pipeline({self.hf_pipeline!r}, model={path!r}{options})\n"
                f"print(pipe({self.card_text().example!r}))\n")

    def encoder_cost(self, tokens: int, second: int | None, question: int | None) -> tuple[tuple, int] | None:
        """The encoder pass one input of this head costs, from its texts' token counts (no special
        tokens): `(key, tokens)`, heads with equal keys sharing the pass; None when the input
        lacks what the head reads. Single texts cut at max_length; pairs need `second`."""
        length = int(self.spec.max_length)
        if self.input_form == "pair":
            return None if second is None else (("pair", length), min(tokens + second + 3, length))
        if tokens + 2 <= length:
            return ("whole",), tokens + 2
        return ("cut", length), length

    def output_hint(self) -> str:
        """What in the spec decides the head's output size, for weight-shape messages."""
        return ""

    # -- what `extract` asks of a kind (plain encoder inputs from the kind's own formats) ----
    @classmethod
    def sniff_format(cls, path: str) -> str | None:
        """The kind's own format a file's name (or first bytes) shows, else None."""
        return None

    @classmethod
    def claims_records(cls, keys: set[str]) -> bool:
        """Whether JSON Lines records with these keys are inputs of this kind."""
        return False

    @classmethod
    def read_texts(cls, path: str | None, fmt: str) -> list[TextInput]:  # pragma: no cover - interface
        raise NotImplementedError

    # -- what each kind implements ------------------------------------------------------
    @classmethod
    def build(cls, spec: Any, encoder, pooler_state=None) -> Task:  # pragma: no cover - interface
        raise NotImplementedError

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def dev_loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The loss an evaluation reports (the same during training and after loading): by default
        the training loss."""
        return self.loss(logits, batch)


def copy_linear(target: nn.Module, source: nn.Linear, what: str) -> None:
    """Copy a linear layer's weights into `target`, a linear layer of the same shape."""
    if not isinstance(target, nn.Linear) or target.weight.shape != source.weight.shape:
        raise UserError(f"{what}: the transformers model has no layer of this shape, so the head has no equivalent")
    with torch.no_grad():
        target.weight.copy_(source.weight)
        target.bias.copy_(source.bias)


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis (an empty array as it is)."""
    if not len(x):
        return x
    z = x - x.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def init_linear(layer: nn.Linear, std: float = 0.02) -> nn.Linear:
    """BERT's initialisation for new layers."""
    nn.init.normal_(layer.weight, mean=0.0, std=std)
    nn.init.zeros_(layer.bias)
    return layer
