"""Whole-sequence judgments from one vector per input (the final [CLS] vector, or the mean or
max of the tokens: `ClassifySpec.pooling`): one text or a pair of texts, single-label
classification, regression, or multi-label. The task holds its parts: reading
(`reading.py`), head, loss and recipe (`head.py`), decoding, metrics and what scores mean
(`judging.py`), what it shows and how it exports (`publishing.py`); its settings are `spec.py`,
its formats `formats.py`."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from bertheads.base.errors import UserError
from bertheads.base.schema import said
from bertheads.base.values import fraction
from bertheads.encoder.layers import POOLINGS
from bertheads.tasks.base import Parts, Task, option
from bertheads.tasks.classify.distilling import ClassifyDistilling
from bertheads.tasks.classify.formats import check_label_names, infer_labels, normalise_label, read_file
from bertheads.tasks.classify.head import ClassifyHead, ClassifyModeling
from bertheads.tasks.classify.judging import ClassifyJudging, ClassifyScoring
from bertheads.tasks.classify.publishing import ClassifyExporting, ClassifyPublishing
from bertheads.tasks.classify.reading import ClassifyReading
from bertheads.tasks.classify.spec import ClassifySpec
from bertheads.tasks.families import Family, pooling, settle_family

log = logging.getLogger(__name__)


@dataclass
class ClassifyOptions:
    """What a call of `predict` or the server may add for classify heads."""

    min_score: float | None = option(None, "single-label: no label (null) when the best score is below this",
                                     type=fraction, at=("predict", "serve"))


class ClassifyTask(Task):
    kind = "classify"
    spec_type = ClassifySpec
    help = "labels or scores for a text or a text pair, read from [CLS] (or the tokens' mean or max)"
    parts = Parts(ClassifyReading, ClassifyModeling, ClassifyJudging, ClassifyScoring, ClassifyPublishing,
                  ClassifyExporting, options=ClassifyOptions, distilling=ClassifyDistilling)

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
    def prepare(cls, path: str, spec: ClassifySpec, encoder, limit: int | None = None) -> list:
        """Read the training file (its first `limit` examples), decide the problem type (unless
        the spec names it) and label map; the examples."""
        examples = read_file(path, spec, limit=limit)
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
        return examples


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
