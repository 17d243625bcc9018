"""What every task kind provides: reading its formats, encoding, its head, loss, decoding
and metrics. The training loop and the bundle only talk to this interface."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

import torch
from torch import nn

from bertheads.packing import INFERENCE_BATCH


@dataclass
class HeadSettings:
    """Settings shared by every head; each kind's spec extends these."""

    max_length: int = 128
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
      encode_for_inference(examples, tokenizer) -> (features, owner): owner[i] is the index of
          the example feature i belongs to (several when an input is cut into windows)
      collect(feature_outputs, owner, examples, features) -> one output per example (head
          outputs of the features of each example merged: windows joined, spans chosen, ...)
      (`outputs(model, name, examples)` = encode_for_inference + run_heads + collect, below; a
       multi-head model runs several heads in one pass when their features are identical)
      decode(outputs, examples, **options) -> list of JSON-able dicts (what `predict` writes)
      metrics(outputs, examples, path=None, **options) -> dict (what `evaluate` reports);
          `during_training=True` when called after an epoch
      render(predictions, examples, fmt) -> str              text `predict` writes (JSONL default)
    """

    help: ClassVar[str] = ""
    training_defaults: ClassVar[dict] = {}  # CLI defaults that differ: max_length, batch_size

    kind: ClassVar[str]
    main_metric: ClassVar[str]
    spec_type: ClassVar[type]
    reads_pairs: ClassVar[bool] = False
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

    def render(self, predictions: list[dict], examples: list, fmt: str | None = None) -> str:
        import json

        return "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in predictions)

    def outputs(self, model, name: str, examples: list, batch_size: int = INFERENCE_BATCH, progress: str | None = None) -> list:
        """The head's outputs for each example: encode, run the encoder and head, merge windows."""
        from bertheads.model import run_heads

        features, owner = self.encode_for_inference(examples, model.encoder.tokenizer)
        feature_outputs = run_heads(model, features, [name], batch_size, progress=progress)[name]
        return self.collect(feature_outputs, owner, examples, features)

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
