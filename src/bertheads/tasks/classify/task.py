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
from bertheads.tasks.base import Parts, Task, option
from bertheads.tasks.classify.descriptions import settle_descriptions
from bertheads.tasks.classify.distilling import ClassifyDistilling
from bertheads.tasks.classify.formats import check_label_names, infer_labels, normalise_label, read_file
from bertheads.tasks.classify.head import ClassifyHead, ClassifyModeling, settle_pooling
from bertheads.tasks.classify.judging import ClassifyJudging, ClassifyScoring
from bertheads.tasks.classify.publishing import ClassifyExporting, ClassifyPublishing
from bertheads.tasks.classify.reading import ClassifyReading
from bertheads.tasks.classify.spec import ClassifySpec
from bertheads.tasks.families import settle_family

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
    def prepare(cls, path: str | None, spec: ClassifySpec, encoder, limit: int | None = None) -> list:
        """Read the training file (its first `limit` examples), decide the problem type (unless
        the spec names it) and label map; the examples. Without a file, the labels are those
        the label descriptions name (and no examples)."""
        if path is None:
            if not spec.label_descriptions:
                raise UserError(f"{said('train')}: required (or {said('label_descriptions')} for a head without "
                                f"training rows)")
            spec.problem = spec.problem or "single_label"
            if spec.problem not in ("single_label", "multi_label"):
                raise UserError(f"{said('problem', spec.problem)}: label descriptions make single-label or "
                                f"multi-label heads")
            settle_descriptions(spec, path, zero_label=True)
            spec.label_weights, spec.class_weights = [], None
            log.info(f"no training rows: the head predicts the label whose description is most similar to the text "
                     f"({len(spec.labels)} labels: {', '.join(map(str, spec.labels))})")
            return []
        examples = read_file(path, spec, limit=limit)
        spec.problem, spec.labels = infer_labels(examples, path, spec.problem)
        if spec.label_names:
            check_label_names(spec, path)
        spec.pair = any(e.pair is not None for e in examples)
        if spec.label_descriptions and spec.pair:
            raise UserError(f"{said('label_descriptions')}: they describe single texts, and {path} holds text pairs")
        settle_descriptions(spec, path, zero_label=False)
        spec.label_weights = []
        if spec.class_weights == "none":
            spec.class_weights = None
        if spec.class_weights == "balanced":
            if spec.problem != "single_label":
                raise UserError(f"{said('class_weights', 'balanced')}: only for single-label classification, "
                                f"{path} is {spec.problem.replace('_', '-')}")
            counts = np.bincount([spec.labels.index(normalise_label(e.label)) for e in examples],
                                 minlength=len(spec.labels))
            spec.label_weights = [round(len(examples) / (len(spec.labels) * max(int(c), 1)), 8) for c in counts]
        return examples
