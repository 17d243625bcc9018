"""What a qa head is: its settings (`QASpec`: the `bertheads train qa` flags, config fields and
keywords, saved with the head)."""

from __future__ import annotations

from dataclasses import dataclass

from bertheads.base.schema import setting
from bertheads.base.values import non_negative_float, non_negative_int, positive_int
from bertheads.tasks.base import HeadSettings, SavedValue, finite
from bertheads.tasks.qa.spans import WINDOW_CHOICES

PREDICTING = ("predict", "evaluate", "serve")  # the commands that may override how a saved head reads passages


@dataclass
class QASpec(HeadSettings):
    max_length: int = 384
    stride: int = setting(128, "tokens shared by neighbouring windows", type=non_negative_int, group="answer spans")
    max_question_length: int = setting(64, "questions are cut to N tokens", type=positive_int, group="answer spans")
    n_best: int = setting(20, "start and end candidates per window", type=positive_int, group="answer spans")
    max_answer_length: int = setting(30, "longest answer in tokens", type=positive_int, group="answer spans")
    # answer "" when null score - best span > this (None: never)
    null_threshold: float | None = setting(None, "SQuAD v2: answer nothing when null - best span score exceeds this "
                                                 "(default: tuned on --dev for the best F1)", type=float,
                                           group="answer spans", at=("predict", "evaluate", "serve"))
    window_choice: str = setting("relative", "how spans of a long passage's windows compare: relative (default: span "
                                             "score minus its window's null score), raw (start + end, as run_qa), "
                                             "+context (a span two windows share is scored where it has the most "
                                             "context)", choices=WINDOW_CHOICES, group="answer spans", at=PREDICTING)
    paragraph_match: float = setting(6.0, "for a passage of several paragraphs: a span loses W x how much worse its "
                                          "paragraph's words match the question's than the best paragraph's do (a "
                                          "share in [0, 1]; 0: off)", type=non_negative_float, metavar="W",
                                     group="answer spans", at=PREDICTING)
    negative_windows: int = setting(0, "training: also pair each question with K other passages of the file as "
                                       "answerless windows (1 helps long passages, at twice the windows)",
                                    type=non_negative_int, metavar="K", group="answer spans")
    paragraph_windows: bool = setting(True, "read each paragraph of a passage (split at blank lines, else at line "
                                            "breaks; short ones join the next) in windows of its own, as SQuAD's "
                                            "paragraphs are read (default); --no-paragraph-windows: windows run "
                                            "across paragraph ends", toggle=True, group="answer spans", at=PREDICTING)
    topic_segments: bool = setting(True, "with --paragraph-windows: a paragraph longer than one window (a passage "
                                         "without line breaks) is cut where its sentences change subject, and each "
                                         "segment is read and matched as a paragraph (default); --no-topic-segments: "
                                         "plain windows", toggle=True, group="answer spans", at=PREDICTING)
    shared_norm: bool = setting(False, "training: the windows of a question (its own and, with --negative-windows, "
                                       "other passages') are batched together and share one softmax over their "
                                       "passage tokens, besides each window's own loss, so span scores compare "
                                       "across windows and paragraphs", group="answer spans")
    join_passages: int = setting(0, "training: read each question's passage joined with the K nearest other "
                                    "passages of the file, in file order, so answers sit at varied places among real "
                                    "text and the windows without the answer learn 'not here'",
                                 type=non_negative_int, metavar="K", group="answer spans")
    # what training settled
    unanswerable: bool = False  # the training data had questions without an answer (SQuAD v2.0)
    tune_threshold: bool = True  # tune `null_threshold` on the dev set (off when it was given)
    # fitted on dev with the temperature when the head may answer nothing (`confidence.NullScaled`):
    # (a, b) of sigmoid(a * margin + b), a null answer's probability of being right
    null_scaling: list[float] | None = None

    @classmethod
    def check_saved(cls, data: dict, num_layers: int | None = None, max_tokens: int | None = None) -> None:
        """Besides every head's checks: `null_scaling`, when fitted, two finite numbers."""
        super().check_saved(data, num_layers, max_tokens)
        scaling = data.get("null_scaling")
        if scaling is not None and not (len(scaling) == 2 and all(finite(v) for v in scaling)):
            raise SavedValue("null_scaling", "two finite numbers (a, b)", scaling)

    @classmethod
    def from_saved(cls, data: dict) -> QASpec:
        """Models saved before `window_choice`, `paragraph_windows`, `paragraph_match` and
        `topic_segments` existed keep the raw comparison, the windows across paragraphs, no
        paragraph match and plain windows over flat text, as they were tuned."""
        return super().from_saved({"window_choice": "raw", "paragraph_windows": False, "paragraph_match": 0.0,
                                   "topic_segments": False, **data})
