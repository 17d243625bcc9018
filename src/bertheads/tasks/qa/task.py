"""Extractive question answering: the answer is a span of the passage (SQuAD v1.1 and v2.0).

The question and the passage go in as a pair, `[CLS] question [SEP] passage [SEP]`. A passage
longer than the window is cut into overlapping windows (`--stride` tokens shared between
neighbours) whose offset mappings lead back to characters of the passage. The head scores
each token as the start and as the end of the answer; the best valid span over all windows
of a question wins. With SQuAD v2.0 training data the model may also answer nothing: when the
null score ([CLS] start + end) exceeds the best span's score by more than a threshold tuned
on the dev set.

Formats: SQuAD JSON (`{"data": [{"paragraphs": [{"context", "qas": [...]}]}]}`) and JSON
lines `{"id", "question", "context", "answers": {"text": [...], "answer_start": [...]}}`.
The task holds its parts: reading (`reading.py`, readers in `formats.py`), head, windows, loss
and recipe (`head.py`; passages and topic segments in `passages.py`, `segments.py`), decoding,
metrics and what scores mean (`judging.py`; span decoding across windows in `spans.py`, the SQuAD
scores in `metrics.py`), what it shows and how it exports (`publishing.py`); its settings are
`spec.py`, its input form `form.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from bertheads.base.errors import UserError
from bertheads.base.schema import said
from bertheads.tasks.base import Parts, Task, option
from bertheads.tasks.families import copy_start, settle_family
from bertheads.tasks.qa.distilling import QADistilling
from bertheads.tasks.qa.formats import read_examples
from bertheads.tasks.qa.head import QAHead, QAModeling
from bertheads.tasks.qa.judging import QAJudging, QAScoring
from bertheads.tasks.qa.publishing import QAExporting, QAPublishing
from bertheads.tasks.qa.reading import QAReading
from bertheads.tasks.qa.spans import window_choice_parts
from bertheads.tasks.qa.spec import QASpec


@dataclass
class QAOptions:
    """What a call of `predict` or `evaluate` may add for qa heads."""

    question: str | None = option(None, "one question (with --context)", at=("predict",))
    context: str | None = option(None, "the passage for --question", at=("predict",))
    predictions_out: str | None = option(None, "write {id: answer} JSON here (and an n-best file beside it)",
                                         at=("evaluate",), extra={"writes": True})


class QATask(Task):
    kind = "qa"
    spec_type = QASpec
    help = "answer spans in a passage for a question (SQuAD v1.1 / v2.0)"
    parts = Parts(QAReading, QAModeling, QAJudging, QAScoring, QAPublishing, QAExporting, options=QAOptions,
                  distilling=QADistilling)

    @classmethod
    def build(cls, spec: QASpec, encoder, pooler_state=None) -> QATask:
        """A fresh head; `pooler_state`: the checkpoint's weights a family's token block starts from."""
        family = settle_family(spec, encoder)
        head = QAHead(encoder.info.hidden_size, spec, family, getattr(encoder, "config", None))
        if head.dense is not None:
            copy_start(head.dense, head.norm, pooler_state)
        return cls(spec, head)

    @classmethod
    def prepare(cls, path: str, spec: QASpec, encoder) -> list:
        """Read the training file (answers that do not match their passage are skipped); the examples."""
        check_settings(spec, encoder)
        examples = read_examples(path, need_labels=True, strict=False)
        spec.unanswerable = any(not e.answers for e in examples)
        if spec.null_threshold is not None:
            spec.tune_threshold = False
        elif spec.unanswerable:
            spec.null_threshold = 0.0
        return examples


# -- settings ------------------------------------------------------------------------------
def check_settings(spec: QASpec, encoder) -> None:
    tokenizer = encoder.tokenizer
    limit = encoder.info.max_tokens
    if limit is not None and spec.max_length > limit:
        raise UserError(f"{said('max_length', spec.max_length)}: the encoder reads at most {limit} tokens")
    for name in ("stride", "max_question_length", "n_best", "max_answer_length"):
        if getattr(spec, name) < 1:
            raise UserError(f"{said(name)}: must be at least 1, got {getattr(spec, name)}")
    window_choice_parts(spec.window_choice)
    for name in ("negative_windows", "join_passages", "paragraph_match"):
        if getattr(spec, name) < 0:
            raise UserError(f"{said(name)}: must be at least 0, got {getattr(spec, name)}")
    room = spec.max_length - spec.max_question_length - tokenizer.num_special_tokens_to_add(pair=True)
    if room <= spec.stride:
        raise UserError(f"{said('stride', spec.stride)} must be smaller than the passage room in a window "
                        f"({room} tokens: {said('max_length', spec.max_length)} minus "
                        f"{said('max_question_length', spec.max_question_length)} and the special tokens)")

