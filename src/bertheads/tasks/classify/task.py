"""Whole-sequence judgments from one vector per input (the final [CLS] vector, or the mean or
max of the tokens: `ClassifySpec.pooling`): one text or a pair of texts, single-label
classification, regression, or multi-label. The task is the sum of its parts: reading
(`reading.py`), head and loss (`head.py`), decoding and metrics (`judging.py`), what it shows
(`publishing.py`); its settings are `spec.py`, its formats `formats.py`."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import numpy as np

from bertheads.base.errors import UserError
from bertheads.base.schema import said
from bertheads.base.values import fraction
from bertheads.encoder.layers import POOLINGS
from bertheads.tasks.base import Task, option
from bertheads.tasks.classify.formats import check_label_names, infer_labels, normalise_label
from bertheads.tasks.classify.head import ClassifyHead, ClassifyModeling
from bertheads.tasks.classify.judging import ClassifyJudging
from bertheads.tasks.classify.publishing import ClassifyPublishing
from bertheads.tasks.classify.reading import ClassifyReading
from bertheads.tasks.classify.spec import ClassifySpec
from bertheads.tasks.families import Family, pooling, settle_family, start_weights
from bertheads.tasks.forms import PAIR, TEXT, InputForm
from bertheads.tasks.recipes import Recipe

log = logging.getLogger(__name__)


@dataclass
class ClassifyOptions:
    """What a call of `predict` or the server may add for classify heads."""

    min_score: float | None = option(None, "single-label: no label (null) when the best score is below this",
                                     type=fraction, at=("predict", "serve"))


class ClassifyTask(ClassifyReading, ClassifyModeling, ClassifyJudging, ClassifyPublishing, Task):
    kind = "classify"
    spec_type = ClassifySpec
    prepare_options = ("limit",)
    # by the training data's size, as measured on SST-2 (bench/small_data.py, docs/little-data.md):
    # up to 200 examples SetFit's recipe (contrastive) beat the head alone on the frozen encoder;
    # at 800 and 1,000, contrastive on 40 pairs an example beat fine-tuning (by less at 1,000); at 2,000 batch 8
    # still beat batch 32 (5 seeds)
    recipes = (Recipe(200, "contrastive", 8, steps=300, epochs=(3, 20)),
               Recipe(1000, "contrastive", 8, steps=300, epochs=(3, 20), pairs_each=40),
               Recipe(2000, "finetune", 8, steps=300, epochs=(3, 20)),
               Recipe(None, "finetune", 32))
    help = "labels or scores for a text or a text pair, read from [CLS] (or the tokens' mean or max)"
    options_type = ClassifyOptions

    def recipe(self, examples: int, how: str = "auto") -> Recipe:
        """The table's row; contrastive mode pairs single labelled texts, so text pairs and
        regression fine-tune instead (with the row's batch size and step budget)."""
        row = super().recipe(examples, how)
        if row.mode == "contrastive" and (self.spec.pair or self.spec.problem == "regression"):
            return replace(row, mode="finetune")
        return row

    @classmethod
    def build(cls, spec: ClassifySpec, encoder, pooler_state=None) -> ClassifyTask:
        """A fresh head of the encoder's family (or the family the spec records); `pooler_state`:
        the checkpoint's weights its dense layer (and norm) start from."""
        spec.problem = spec.problem or "single_label"  # (a head built without its data; `prepare` decides)
        outputs = 1 if spec.problem == "regression" else len(spec.labels)
        family = settle_family(spec, encoder)
        settle_pooling(spec, encoder, family)
        return cls(spec, ClassifyHead(encoder.info.hidden_size, outputs, spec, pooler_state, family,
                                      getattr(encoder, "config", None)))

    @classmethod
    def spec_from_dict(cls, data: dict) -> ClassifySpec:
        """A saved spec; one saved before `pooling` reads as its family's head ([CLS] but for a
        mean-pooling ModernBERT)."""
        return super().spec_from_dict({"pooling": None, **data})

    @classmethod
    def prepare(cls, path: str, spec: ClassifySpec, encoder, limit: int | None = None):
        """Read the training file (its first `limit` examples), decide the problem type (unless
        the spec names it) and label map, build the task."""
        examples = cls.read_file(path, spec, limit=limit)
        spec.problem, spec.labels = infer_labels(examples, path, spec.problem)
        if spec.label_names:
            check_label_names(spec, path)
        spec.pair = any(e.pair is not None for e in examples)
        spec.label_weights = []
        if spec.class_weights == "none":
            spec.class_weights = None
        if spec.class_weights == "balanced":
            if spec.problem != "single_label":
                raise UserError(f"{said('class_weights', 'balanced')}: only for single-label classification, "
                                f"{path} is {spec.problem.replace('_', '-')}")
            counts = np.bincount([spec.labels.index(normalise_label(e.label)) for e in examples],
                                 minlength=len(spec.labels))
            spec.label_weights = [round(len(examples) / (len(spec.labels) * int(c)), 8) for c in counts]
        return cls.build(spec, encoder, start_weights(settle_family(spec, encoder), encoder)), examples

    @property
    def form(self) -> InputForm:
        """A head trained on pairs reads pairs."""
        return PAIR if self.spec.pair else TEXT


# -- helpers ---------------------------------------------------------------------------
def settle_pooling(spec: ClassifySpec, encoder, family: Family) -> None:
    """The spec's `pooling` settled: "auto" is the pooling the checkpoint declares (a
    sentence-transformers `Pooling` module) for a head on a frozen encoder (`mode` features, and
    contrastive: the encoder is tuned on the sentence embeddings it was made for), else the
    family's own head; None (a spec saved before the field) is the family's own head."""
    own = pooling(family, getattr(encoder, "config", None))
    if spec.pooling is None:
        spec.pooling = own
    elif spec.pooling == "auto":
        declared = None
        if spec.mode in ("features", "contrastive") and hasattr(encoder, "declared_pooling"):
            declared = encoder.declared_pooling()
        spec.pooling = declared or own
        if declared and declared != own:
            log.info(f"the head reads the {declared} of the tokens, the pooling the checkpoint declares "
                     f"({said('pooling', 'cls')}: [CLS])")
    if spec.pooling not in POOLINGS:
        raise UserError(f"{said('pooling')}: expected auto, {', '.join(POOLINGS)}, got {spec.pooling!r}")
