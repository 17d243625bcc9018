"""What a classify head is: its settings (`ClassifySpec`: the `bertheads train classify` flags,
config fields and keywords, saved with the head) and the choices they take."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bertheads.base.schema import setting, settled
from bertheads.base.values import comma_text, fraction, name_list, non_negative_int
from bertheads.tasks.base import HeadSettings, SavedValue, finite, unique_values

PROBLEMS = ("single_label", "regression", "multi_label")
LONG_INPUTS = ("truncate", "windows")
POOLS = ("mean", "max")
WEIGHTS = ("none", "balanced")
PREDICTING = ("predict", "serve")  # the commands that may override how a saved head reads long texts


def description_items(value):
    """A config's or keyword's label descriptions as the flag's list of items: a mapping
    {label: text}, a list of "LABEL: text" items (or files), or one such item."""
    if isinstance(value, dict):
        return [f"{k}: {v}" for k, v in value.items()]
    if isinstance(value, (str, Path)):
        return [str(value)]
    return list(value)


@dataclass
class ClassifySpec(HeadSettings):
    text_column: str | None = setting(None, "column (or JSON key) of the text (default: found by its name: "
                                            "sentence, text, sentence1, question, ...)")
    pair_column: str | None = setting(None, "column of the second text of a pair (default: found by its name: "
                                            "sentence2, hypothesis, question2, ...)")
    label_column: str | None = setting(None, "column of the label (default: found by its name: label, score, "
                                             "class, ...)")
    header: bool = setting(True, "TSV and CSV files have no header row: their columns are text, label "
                                 "(text, text_b, label with three; text alone with one)", negate=True)
    # settled from the training labels when not given (`ClassifyTask.prepare`)
    problem: str | None = setting(None, "default: decided from the training labels", choices=PROBLEMS,
                                  tags=("shape",))
    class_weights: str | None = setting(None, "single-label: 'balanced' weighs each label's loss by n / (labels * "
                                              "its count)", choices=WEIGHTS)
    threshold: float | None = setting(None, "multi-label: one decision threshold for every label (default: one "
                                            "per label, tuned on --dev for F1 after each epoch; 0.5 without --dev)",
                                      type=fraction, at=("predict", "evaluate", "serve"))
    label_names: list | None = setting(None, "names for the labels in sorted order, e.g. negative,positive for 0/1 "
                                             "labels; predictions show the names, files may use either",
                                       type=name_list, coerce=comma_text)
    label_descriptions: list | None = setting(
        None, "a text like each label's, as 'LABEL: TEXT' (or a file of such lines): without --train the head "
              "predicts the label whose description is most similar to the text (cosine of the pooled vectors); "
              "with --train it starts from them (docs/little-data.md)", nargs="+", coerce=description_items,
        metavar="'LABEL: TEXT'")
    long_input: str = setting("truncate", "a text longer than --max-length: cut at it, or cut into overlapping "
                                          "windows whose outputs are pooled (training: each window learns the "
                                          "text's label)", choices=LONG_INPUTS, at=PREDICTING)
    pool: str = setting("mean", "--long-input windows: pool the windows' outputs (logits) by mean or max",
                        choices=POOLS, at=PREDICTING)
    stride: int = setting(32, "--long-input windows: tokens shared by neighbouring windows", type=non_negative_int)
    # how the head reads the tokens: "cls", "mean" or "max" once built ("auto": the checkpoint's
    # declared pooling in features mode, else the family's head; None in a spec saved before
    # this field: the family's head, [CLS] for all but a mean-pooling ModernBERT). Its flag is
    # the head option --pooling, which every kind of a run takes.
    pooling: str | None = settled("auto", tags=("shape",))
    # what training settled
    labels: list = settled(factory=list, tags=("shape",))  # label values in output order (empty for regression)
    pair: bool = settled(False, tags=("shape",))  # whether training inputs were pairs
    # one linear layer over the L2-normalised pooled vector, started from the label descriptions
    cosine: bool = settled(False, tags=("shape",))
    # one linear layer over each read layer's pooled vector L2-normalised, merged, normalised
    # again and scaled (`head.READER_SCALE`): the reader `audit --mode features` trains by default
    normalised: bool = settled(False, tags=("shape",))
    label_weights: list = field(default_factory=list)  # the class weights, in label order (empty: all 1)
    thresholds: list | None = None  # multi-label: per-label thresholds tuned on dev for F1

    @classmethod
    def check_saved(cls, data: dict, num_layers: int | None = None, max_tokens: int | None = None) -> None:
        """Besides every head's checks: labels and label names each once, a name per label, and
        per-label thresholds (in [0, 1]) and weights (0 or more) one per label."""
        super().check_saved(data, num_layers, max_tokens)
        unique_values(data, "labels", "labels")
        unique_values(data, "label_names", "label names")
        labels = data.get("labels") or []
        names = data.get("label_names")
        if names is not None:
            if not all(isinstance(n, str) and n for n in names):
                raise SavedValue("label_names", "a list of names", names)
            if len(names) != len(labels):
                raise SavedValue("label_names", f"{len(labels)} names, one per label", names)
        for name, expected, ok in (("thresholds", "a number from 0 to 1", lambda v: finite(v) and 0 <= v <= 1),
                                   ("label_weights", "a finite number of 0 or more", lambda v: finite(v) and v >= 0)):
            values = data.get(name)
            if not values:
                continue
            if len(values) != len(labels):
                raise SavedValue(name, f"{len(labels)} values, one per label", values)
            for i, value in enumerate(values):
                if not ok(value):
                    raise SavedValue(f"{name}[{i}]", expected, value)

    @classmethod
    def needs_rows(cls, options: dict) -> bool:
        """Label descriptions make a head without training rows."""
        return not options.get("label_descriptions")

    @property
    def starts_trained(self) -> bool:
        """A head from label descriptions predicts by similarity before any step."""
        return bool(self.cosine)

    @classmethod
    def from_saved(cls, data: dict) -> ClassifySpec:
        """A saved spec; one saved before `pooling` reads as its family's head ([CLS] but for a
        mean-pooling ModernBERT)."""
        return super().from_saved({"pooling": None, **data})

    def shown_labels(self) -> list:
        """The labels as predictions show them: their names when given, else the values."""
        return list(self.label_names) if self.label_names else list(self.labels)
