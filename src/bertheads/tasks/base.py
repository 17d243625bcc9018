"""The `Task` interface: a decision kind bound to its settings (`spec`) and its head. The
training loop, the bundle and every face talk to a task through it, naming the part they ask
(`task.reading.read(...)`, `task.judging.decode(...)`). A kind writes its parts
(`tasks/parts.py`), each in a module of its folder, and the few members here:

```
class KindTask(Task):
    kind, help, spec_type        its name, its one line, its settings (a `HeadSettings` dataclass)
    parts = Parts(KindReading, KindModeling, ..., options=KindOptions)   what it is made of
    build(spec, encoder)         a fresh head on the encoder
    prepare(path, spec, encoder) read the training file, settle the spec (labels, ...): (task, examples)
```
A task holds `spec`, `head`, `options` (its inference options, `tasks/options.py`) and one
object of each part class.
This module also gathers what a kind's modules need (`HeadSettings`, `option`, the parts and
helpers), so a new kind imports from one place (see `tests/test_fourth_kind.py`).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch
from torch import nn

from bertheads.base import schema
from bertheads.base.errors import UserError
from bertheads.encoder.layers import COMBINES
from bertheads.tasks.options import NoOptions, Options, option
from bertheads.tasks.parts import (
    CardText,
    Distilling,
    Exporting,
    Judging,
    Modeling,
    Parts,
    Publishing,
    Reading,
    Scoring,
    TextInput,
    softmax,
)
from bertheads.tasks.registry import TASKS
from bertheads.text.encoding import MAX_LENGTH

CALIBRATING = ("predict", "evaluate", "analyze", "serve")  # the commands that may turn calibration off
# the temperatures a saved head may hold: wider than a fit reaches (`calibration.T_RANGE`, 0.05..20), narrow
# enough that logits divided by one stay finite numbers (1e-300 gives NaN scores, -1 flips every label)
SAVED_TEMPERATURES = (1e-3, 1e3)

__all__ = ["TASKS", "CardText", "Distilling", "Exporting", "HeadSettings", "Judging", "Modeling", "NoOptions", "Parts",
           "Publishing", "Reading", "SavedValue", "Scoring", "Task", "TextInput", "copy_linear", "finite", "init_linear",
           "option", "softmax", "unique_values"]


class SavedValue(ValueError):
    """A saved spec's value a head cannot use: its `field` (a dotted path), what was `expected`
    and the value (`saved/manifest.py` words it with the file and the head)."""

    def __init__(self, field: str, expected: str, value: Any) -> None:
        super().__init__(f"{field}: expected {expected}, got {shown(value)}")
        self.field, self.expected, self.value = field, expected, value


def shown(value: Any) -> str:
    """A saved value as the file spells it (JSON), cut short."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def finite(value: Any) -> bool:
    return is_number(value) and math.isfinite(value)


def unique_values(data: dict, name: str, what: str = "values") -> None:
    """`data[name]`, a list, names each value once (a duplicate would collapse two outputs into one key)."""
    values = data.get(name)
    if isinstance(values, list):
        seen = set()
        for value in values:
            key = json.dumps(value)
            if key in seen:
                raise SavedValue(name, f"distinct {what}", value)
            seen.add(key)


@dataclass
class HeadSettings:
    """Settings shared by every head; each kind's spec extends these (the flags of a run's head
    options are `training.settings.HeadOptions`; a kind's own are its spec's `setting` fields)."""

    max_length: int = MAX_LENGTH
    mode: str = "finetune"  # or "features": frozen encoder, only the head learns
    layers: list[int] = schema.settled(factory=lambda: [-1], tags=("shape",))
    combine: str = schema.settled("concat", tags=("shape",))
    dropout: float = 0.1
    tune_layers: int | None = schema.settled(None, tags=("shape",))  # the head's own top layers (a branch); None: none
    head_family: str | None = None  # whose head layout (`tasks/families.py`); None: the encoder's, settled at build
    calibrate: bool = schema.setting(True, "fit a temperature on --dev after each evaluation so that a score of 0.9 "
                                           "is right about nine times in ten (on 100 decisions or more, 10 of them "
                                           "wrong; else none, and the run says why) (--no-calibrate: keep the raw "
                                           "softmax); "
                                           "at predict, evaluate, analyze and serve: use the head's temperature or "
                                           "not", toggle=True, group="calibration", at=CALIBRATING)
    # fitted on dev at the end of training (`calibration.calibrate_head`): the scores are a softmax of
    # the logits divided by it; None: not fitted (no --dev, --no-calibrate, or a head without scores)
    temperature: float | None = schema.settled(None)
    # each class's count in the training examples (`Scoring.class_counts`; empty: none counted)
    trained_counts: dict = schema.settled(factory=dict)

    @classmethod
    def needs_rows(cls, options: dict) -> bool:
        """Whether a head of these settings (a task's options) needs training rows; a kind whose
        settings alone can make a head says when not (its `prepare` then takes no file)."""
        return True

    @property
    def starts_trained(self) -> bool:
        """Whether a fresh head of these settings predicts before any step (classify's from label
        descriptions): training evaluates its start as epoch 0, a candidate to keep."""
        return False

    @classmethod
    def check_saved(cls, data: dict, num_layers: int | None = None, max_tokens: int | None = None) -> None:
        """Each value a head reads from a saved spec (`data`, its types already checked against the
        dataclass's) is one it can use: SavedValue names the first that is not. `num_layers` and
        `max_tokens`: the encoder's (None: not known here, left to building the head). Every
        number finite; a setting's choices and value type as its flag takes them; `max_length`
        within the checkpoint's positions; `layers` among the encoder's; `temperature` null or in
        `SAVED_TEMPERATURES`; `dropout` in [0, 1); `trained_counts` counts. A kind adds its own."""
        for f in fields(cls):
            value = data.get(f.name)
            if value is None:
                continue
            if isinstance(value, float) and not math.isfinite(value):
                raise SavedValue(f.name, "a finite number", value)
            choices = f.metadata.get("choices")
            if choices and value not in choices:
                raise SavedValue(f.name, f"one of {', '.join(map(str, choices))}", value)
            kind_of_value = f.metadata.get("type")
            if kind_of_value is not None and is_number(value):
                try:
                    kind_of_value(str(value))
                except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
                    expected = str(exc).split(", got ")[0].removeprefix("expected ")
                    raise SavedValue(f.name, expected, value) from None
        length = data.get("max_length")
        if max_tokens is not None and is_number(length) and length > max_tokens:
            raise SavedValue("max_length", f"at most {max_tokens} (the tokens the encoder's checkpoint reads)", length)
        layers = data.get("layers")
        if isinstance(layers, list):
            if not layers:
                raise SavedValue("layers", "at least one layer", layers)
            for layer in layers:
                if num_layers is not None and not -(num_layers + 1) <= layer <= num_layers:
                    raise SavedValue("layers", f"layers from {-(num_layers + 1)} to {num_layers} (0: the embeddings; "
                                               f"the encoder has {num_layers} layers)", layer)
        if data.get("combine") is not None and data["combine"] not in COMBINES:
            raise SavedValue("combine", f"one of {', '.join(COMBINES)}", data["combine"])
        temperature = data.get("temperature")
        low, high = SAVED_TEMPERATURES
        if temperature is not None and not (finite(temperature) and low <= temperature <= high):
            raise SavedValue("temperature", f"null or a finite number from {low:g} to {high:g}", temperature)
        dropout = data.get("dropout")
        if dropout is not None and not (finite(dropout) and 0 <= dropout < 1):
            raise SavedValue("dropout", "a number from 0 to below 1", dropout)
        counts = data.get("trained_counts")
        if counts is not None:
            if not isinstance(counts, dict):
                raise SavedValue("trained_counts", "an object of labels to counts", counts)
            for label, count in counts.items():
                if not (isinstance(count, int) and not isinstance(count, bool) and count >= 0):
                    raise SavedValue(f"trained_counts.{label}", "an integer of 0 or more", count)

    @classmethod
    def from_saved(cls, data: dict) -> Any:
        """A saved spec; one saved before head families has BERT's head layout."""
        names = {f.name for f in fields(cls)}
        if "head_family" in names:
            data = {"head_family": "bert", **data}
        return cls(**{k: v for k, v in data.items() if k in names})


class Task:
    """A decision kind bound to its settings (`spec`) and its head module, holding one of each
    of its kind's parts (see the module's docstring for what a kind writes)."""

    kind: ClassVar[str]
    help: ClassVar[str] = ""
    spec_type: ClassVar[type]
    parts: ClassVar[Parts] = Parts()

    def __init__(self, spec: Any, head: nn.Module) -> None:
        self.spec = spec
        self.head = head
        self.options = Options(self)
        parts = type(self).parts
        self.reading = parts.reading(self)
        self.modeling = parts.modeling(self)
        self.judging = parts.judging(self)
        self.scoring = parts.scoring(self)
        self.publishing = parts.publishing(self)
        self.exporting = parts.exporting(self)

    @classmethod
    def build(cls, spec: Any, encoder, pooler_state=None) -> Task:  # pragma: no cover - interface
        """A fresh head on `encoder` (`pooler_state`: checkpoint weights its first layer starts from)."""
        raise NotImplementedError

    @classmethod
    def prepare(cls, path, spec: Any, encoder, **prepare_options) -> list:  # pragma: no cover - interface
        """Read the training file, settle what the spec learns from it (labels, tags); its training
        examples. The head is built after, once the run's mode is settled (`build`, starting from
        `parts.modeling.start_weights`)."""
        raise NotImplementedError


def copy_linear(target: nn.Module, source: nn.Linear, what: str) -> None:
    """Copy a linear layer's weights into `target`, a linear layer of the same shape."""
    if not isinstance(target, nn.Linear) or target.weight.shape != source.weight.shape:
        raise UserError(f"{what}: the transformers model has no layer of this shape, so the head has no equivalent")
    with torch.no_grad():
        target.weight.copy_(source.weight)
        target.bias.copy_(source.bias)


def init_linear(layer: nn.Linear, std: float = 0.02) -> nn.Linear:
    """BERT's initialisation for new layers."""
    nn.init.normal_(layer.weight, mean=0.0, std=std)
    nn.init.zeros_(layer.bias)
    return layer
