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

from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch
from torch import nn

from bertheads.base import schema
from bertheads.base.errors import UserError
from bertheads.tasks.options import NoOptions, Options, option
from bertheads.tasks.parts import (
    CardText,
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

__all__ = ["TASKS", "CardText", "Exporting", "HeadSettings", "Judging", "Modeling", "NoOptions", "Parts",
           "Publishing", "Reading", "Scoring", "Task", "TextInput", "copy_linear", "init_linear", "option", "softmax"]


@dataclass
class HeadSettings:
    """Settings shared by every head; each kind's spec extends these (the flags of a run's head
    options are `training.settings.HeadOptions`; a kind's own are its spec's `setting` fields)."""

    max_length: int = MAX_LENGTH
    mode: str = "finetune"  # or "features": frozen encoder, only the head learns
    layers: list[int] = schema.settled(factory=lambda: [-1], tags=("shape",))
    combine: str = schema.settled("concat", tags=("shape",))
    dropout: float = 0.1
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
