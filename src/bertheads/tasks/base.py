"""What every task kind provides: reading its formats, encoding, its head, loss, decoding
and metrics. The training loop and the bundle only talk to this interface."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

import torch
from torch import nn

from bertheads.text.encoding import MAX_LENGTH


@dataclass
class TextInput:
    """One encoder input as read from a file: a text, an optional second text, its line, and
    what the format adds ("id", "words": character spans of given words)."""

    text: str
    pair: str | None = None
    line: int | None = None
    extra: dict = field(default_factory=dict)


@dataclass
class HeadSettings:
    """Settings shared by every head; each kind's spec extends these."""

    max_length: int = MAX_LENGTH
    mode: str = "finetune"  # or "features": frozen encoder, only the head learns
    layers: list[int] = field(default_factory=lambda: [-1])
    combine: str = "concat"
    dropout: float = 0.1


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
      read_texts(path, fmt) -> list[TextInput]               (classmethod) plain encoder inputs
          from the kind's own file formats, for `extract` (`text_formats` lists them)

    Class attributes: `kind`, `help`, `main_metric`, `spec_type`, `training_defaults` (CLI
    defaults that differ, e.g. qa's max_length 384), `input_form` (what one input is: "text",
    "pair" or "question"; a classify head trained on pairs reads pairs), `text_formats`.
    """

    help: ClassVar[str] = ""
    training_defaults: ClassVar[dict] = {}  # CLI defaults that differ: max_length, batch_size

    kind: ClassVar[str]
    main_metric: ClassVar[str]
    spec_type: ClassVar[type]
    reads_pairs: ClassVar[bool] = False
    text_formats: ClassVar[tuple[str, ...]] = ()  # formats `read_texts` reads for `extract`
    generic_reader: ClassVar[bool] = False
    metric_scale: ClassVar[float] = 1.0  # 100 when the metrics are percentages (SQuAD EM/F1)  # reads tables no other kind claims (classify)
    prepare_options: ClassVar[tuple[str, ...]] = ()  # extra keyword options `prepare` takes

    def __init__(self, spec: Any, head: nn.Module) -> None:
        self.spec = spec
        self.head = head

    # -- manifest ---------------------------------------------------------------------
    def to_manifest(self) -> dict:
        return {"kind": self.kind, "spec": asdict(self.spec)}

    @classmethod
    def spec_from_dict(cls, data: dict) -> Any:
        names = {f.name for f in fields(cls.spec_type)}
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
        """The head as the server's `/heads` lists it (the name is added by the caller)."""
        return {"kind": self.kind, "inputs": self.input_form}

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


def init_linear(layer: nn.Linear, std: float = 0.02) -> nn.Linear:
    """BERT's initialisation for new layers."""
    nn.init.normal_(layer.weight, mean=0.0, std=std)
    nn.init.zeros_(layer.bias)
    return layer
