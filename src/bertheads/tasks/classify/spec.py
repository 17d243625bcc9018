"""What a classify head is: its saved settings (`ClassifySpec`) and the choices they take."""

from __future__ import annotations

from dataclasses import dataclass, field

from bertheads.tasks.base import HeadSettings

PROBLEMS = ("single_label", "regression", "multi_label")
LONG_INPUTS = ("truncate", "windows")
POOLS = ("mean", "max")


@dataclass
class ClassifySpec(HeadSettings):
    problem: str = "single_label"
    labels: list = field(default_factory=list)  # label values in output order (empty for regression)
    text_column: str | None = None
    pair_column: str | None = None
    label_column: str | None = None
    pair: bool = False  # whether training inputs were pairs
    class_weights: str | None = None  # "balanced": the loss weighs each label by n / (labels * its count)
    label_weights: list = field(default_factory=list)  # the weights, in label order (empty: all 1)
    threshold: float | None = None  # multi-label: one decision threshold for every label (fixed)
    thresholds: list | None = None  # multi-label: per-label thresholds tuned on dev for F1
    label_names: list | None = None  # names shown for `labels` (same order), e.g. negative, positive

    def shown_labels(self) -> list:
        """The labels as predictions show them: their names when given, else the values."""
        return list(self.label_names) if self.label_names else list(self.labels)
    long_input: str = "truncate"  # or "windows": a longer input is cut into overlapping windows
    pool: str = "mean"  # windows: how a document's window outputs are pooled ("mean" or "max")
    stride: int = 32  # windows: tokens shared by neighbouring windows
    # how the head reads the tokens: "cls", "mean" or "max" once built ("auto": the checkpoint's
    # declared pooling in features mode, else the family's head; None in a spec saved before
    # this field: the family's head, [CLS] for all but a mean-pooling ModernBERT)
    pooling: str | None = "auto"
