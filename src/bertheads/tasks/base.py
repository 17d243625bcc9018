"""The `Task` interface: a decision kind bound to its settings (`spec`) and its head. The
training loop, the bundle and every face talk to a task through it. A kind implements four
small parts (`tasks/parts.py`), each in a module of its folder, and the few members here:

```
class KindTask(KindReading, KindModeling, KindJudging, KindPublishing, Task):
    kind, help, spec_type        its name, its one line, its settings (a `HeadSettings` dataclass)
    form                         what one input is (`tasks/forms.py`; one text by default)
    build(spec, encoder)         a fresh head on the encoder
    prepare(path, spec, encoder) read the training file, settle the spec (labels, ...): (task, examples)
```
This module also gathers what a kind's modules need (`HeadSettings`, `option`, the parts and
helpers), so a new kind imports from one place (see `tests/test_fourth_kind.py`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

import torch
from torch import nn

from bertheads.base import schema
from bertheads.base.errors import UserError
from bertheads.tasks.forms import TEXT, InputForm
from bertheads.tasks.options import NoOptions, Options, option
from bertheads.tasks.parts import CardText, Judging, Modeling, Publishing, Reading, TextInput, softmax
from bertheads.tasks.recipes import FIXED, Recipe, recipe_for
from bertheads.tasks.registry import COMMANDS, TASKS
from bertheads.text.encoding import MAX_LENGTH

CALIBRATING = ("predict", "evaluate", "analyze", "serve")  # the commands that may turn calibration off

__all__ = ["COMMANDS", "TASKS", "CardText", "HeadSettings", "NoOptions", "Task", "TextInput", "copy_linear",
           "init_linear", "option", "softmax"]


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
                                           "is right about nine times in ten (--no-calibrate: keep the raw softmax); "
                                           "at predict, evaluate, analyze and serve: use the head's temperature or "
                                           "not", toggle=True, group="calibration", at=CALIBRATING)
    # fitted on dev at the end of training (`calibration.calibrate_head`): the scores are a softmax of
    # the logits divided by it; None: not fitted (no --dev, --no-calibrate, or a head without scores)
    temperature: float | None = schema.settled(None)
    # each class's count in the training examples (`Curating.class_counts`; empty: none counted)
    trained_counts: dict = schema.settled(factory=dict)


class Task(Options, Reading, Modeling, Judging, Publishing):
    """A decision kind bound to its settings (`spec`) and its head module (see the module's
    docstring for what a kind writes, `tasks/parts.py` for the parts)."""

    kind: ClassVar[str]
    help: ClassVar[str] = ""
    spec_type: ClassVar[type]
    form: InputForm = TEXT  # a kind may make it a property of the spec (classify: pairs)
    training_defaults: ClassVar[dict] = {}  # `train KIND` defaults of run settings that differ
    recipes: ClassVar[tuple[Recipe, ...]] = FIXED  # the training recipe by the data's size (`tasks/recipes.py`)
    prepare_options: ClassVar[tuple[str, ...]] = ()  # run settings `prepare` takes (classify: limit)

    def __init__(self, spec: Any, head: nn.Module) -> None:
        self.spec = spec
        self.head = head
        self.fixed_options: dict[str, Any] = {}  # call options set for good (`set_options`)

    def recipe(self, examples: int, how: str = "auto") -> Recipe:
        """The row of this kind's recipe table for `examples` training examples (`how` "fixed":
        its last row), as this head's settled spec can take it."""
        return recipe_for(type(self).recipes, examples, how)

    @classmethod
    def build(cls, spec: Any, encoder, pooler_state=None) -> Task:  # pragma: no cover - interface
        """A fresh head on `encoder` (`pooler_state`: checkpoint weights its first layer starts from)."""
        raise NotImplementedError

    @classmethod
    def prepare(cls, path, spec: Any, encoder, **prepare_options) -> tuple[Task, list]:  # pragma: no cover
        """Read the training file, settle what the spec learns from it (labels, tags); the task and
        its training examples."""
        raise NotImplementedError

    def to_manifest(self) -> dict:
        return {"kind": self.kind, "spec": asdict(self.spec)}

    @classmethod
    def spec_from_dict(cls, data: dict) -> Any:
        """A saved spec; one saved before head families has BERT's head layout."""
        names = {f.name for f in fields(cls.spec_type)}
        if "head_family" in names:
            data = {"head_family": "bert", **data}
        return cls.spec_type(**{k: v for k, v in data.items() if k in names})


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
