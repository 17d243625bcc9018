"""Whole-sequence judgments from the final [CLS] vector: one text or a pair of texts,
single-label classification, regression, or multi-label.

Formats: GLUE TSV (SST-2, MRPC, RTE/MNLI, QNLI, STS-B headers), CSV and JSONL with a header
or keys naming the columns; predict also takes plain lines (a TAB separates a pair).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from bertheads.errors import UserError, where
from bertheads.layers import LayerCombine
from bertheads.packing import encode_texts
from bertheads.readers import file_format, find_column, read_jsonl, read_lines, read_table
from bertheads.tasks.base import HeadSettings, Task, TextInput, init_linear

TEXT_COLUMNS = ["sentence", "text", "sentence1", "#1 string", "premise", "question1", "text_a", "sentence_a",
                "question", "content", "review"]
PAIR_COLUMNS = ["sentence2", "#2 string", "hypothesis", "question2", "text_b", "sentence_b"]
LABEL_COLUMNS = ["label", "labels", "quality", "score", "gold_label", "target", "class"]
PROBLEMS = ("single_label", "regression", "multi_label")
_INT = re.compile(r"^[+-]?\d+$")


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


@dataclass
class ClassifyExample:
    text: str
    pair: str | None = None
    label: object = None  # raw value as read (str, int, float or list)
    line: int | None = None


class ClassifyHead(nn.Module):
    """The BERT recipe: pooler (dense + tanh over [CLS]), dropout, linear layer to the outputs."""

    token_level = False

    def __init__(self, hidden_size: int, num_outputs: int, settings: HeadSettings, pooler_state=None) -> None:
        super().__init__()
        self.layers = tuple(settings.layers)
        self.combine = LayerCombine(len(self.layers), settings.combine)
        size = self.combine.output_size(hidden_size)
        self.pooler = init_linear(nn.Linear(size, size))
        if pooler_state is not None and tuple(pooler_state["weight"].shape) == (size, size):
            with torch.no_grad():
                self.pooler.weight.copy_(pooler_state["weight"])
                self.pooler.bias.copy_(pooler_state["bias"])
        self.dropout = nn.Dropout(settings.dropout)
        self.out = init_linear(nn.Linear(size, num_outputs))

    def forward(self, hidden, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        states = self.combine(hidden)
        cls = states[:, 0]
        return self.out(self.dropout(torch.tanh(self.pooler(cls))))


class ClassifyTask(Task):
    kind = "classify"
    spec_type = ClassifySpec
    prepare_options = ("problem",)
    help = "labels or scores for a text or a text pair, read from [CLS]"

    @classmethod
    def add_arguments(cls, parser) -> None:
        parser.add_argument("--text-column", help="column (or JSON key) of the text (default: found by its name: "
                                                  "sentence, text, sentence1, question, ...)")
        parser.add_argument("--pair-column", help="column of the second text of a pair (default: found by its name: "
                                                  "sentence2, hypothesis, question2, ...)")
        parser.add_argument("--label-column", help="column of the label (default: found by its name: label, score, "
                                                   "class, ...)")
        parser.add_argument("--problem", choices=PROBLEMS, help="default: decided from the training labels")
        parser.add_argument("--class-weights", choices=("none", "balanced"), default=None,
                            help="single-label: 'balanced' weighs each label's loss by n / (labels * its count)")

    @property
    def main_metric(self) -> str:  # type: ignore[override]
        return {"single_label": "accuracy", "regression": "pearson", "multi_label": "micro_f1"}[self.spec.problem]

    @classmethod
    def build(cls, spec: ClassifySpec, encoder, pooler_state=None) -> ClassifyTask:
        outputs = 1 if spec.problem == "regression" else len(spec.labels)
        return cls(spec, ClassifyHead(encoder.info.hidden_size, outputs, spec, pooler_state))

    # -- reading ------------------------------------------------------------------------
    @staticmethod
    def read_file(path: str | None, spec: ClassifySpec, fmt: str | None = None,
                  need_labels: bool = True) -> list[ClassifyExample]:
        """Read examples; updates `spec`'s column names when they are detected."""
        kind = file_format(path, fmt)
        examples: list[ClassifyExample] = []
        if kind == "lines":
            for line_no, line in read_lines(path):
                text, _, pair = line.partition("\t")
                if not text.strip():
                    raise UserError(f"{where(path, line_no)}: empty text")
                examples.append(ClassifyExample(text, pair if "\t" in line else None, None, line_no))
            if need_labels:
                raise UserError(f"{where(path)}: plain text has no labels; use TSV, CSV or JSONL with a label column")
            return examples
        if kind in ("tsv", "csv"):
            columns, rows = read_table(path, kind)
        else:
            rows_list = list(read_jsonl(path))
            columns = list(dict.fromkeys(k for _, obj in rows_list for k in obj))
            rows = iter(rows_list)
        text_col, pair_col, label_col = detect_columns(columns, spec, path, need_labels)
        for line_no, row in rows:
            text = row.get(text_col)
            if text is None:
                raise UserError(f"{where(path, line_no)}: missing field {text_col!r}")
            if not isinstance(text, str) or not text.strip():
                raise UserError(f"{where(path, line_no)}: empty text in column {text_col!r}")
            pair = None
            if pair_col:
                pair = row.get(pair_col)
                if pair is None:
                    raise UserError(f"{where(path, line_no)}: missing field {pair_col!r}")
                if not isinstance(pair, str) or not pair.strip():
                    raise UserError(f"{where(path, line_no)}: empty text in column {pair_col!r}")
            label = row.get(label_col) if label_col else None
            if label_col and need_labels and (label is None or (isinstance(label, str) and not label.strip())):
                raise UserError(f"{where(path, line_no)}: missing label in column {label_col!r}")
            if isinstance(label, str):
                label = label.strip()
            examples.append(ClassifyExample(text, pair, label, line_no))
        if not examples:
            raise UserError(f"{where(path)}: no examples")
        return examples

    @classmethod
    def prepare(cls, path: str, spec: ClassifySpec, encoder, problem: str | None = None):
        """Read the training file, decide the problem type and label map, build the task."""
        examples = cls.read_file(path, spec)
        spec.problem, spec.labels = infer_labels(examples, path, problem)
        spec.pair = any(e.pair is not None for e in examples)
        spec.label_weights = []
        if spec.class_weights == "none":
            spec.class_weights = None
        if spec.class_weights == "balanced":
            if spec.problem != "single_label":
                raise UserError(f"--class-weights balanced: only for single-label classification, "
                                f"{path} is {spec.problem.replace('_', '-')}")
            counts = np.bincount([spec.labels.index(normalise_label(e.label)) for e in examples],
                                 minlength=len(spec.labels))
            spec.label_weights = [round(len(examples) / (len(spec.labels) * int(c)), 8) for c in counts]
        return cls.build(spec, encoder, encoder.pooler_state), examples

    def read(self, path: str | None, need_labels: bool = True, fmt: str | None = None,
             **_) -> list[ClassifyExample]:
        examples = self.read_file(path, self.spec, fmt, need_labels)
        if need_labels:
            for e in examples:
                self.label_target(e, path)  # fail early on unseen or non-numeric labels
        return examples

    def from_inputs(self, inputs: list, **_) -> list[ClassifyExample]:
        """Examples from Python values: a string, or a (text, pair) tuple."""
        out = []
        for i, item in enumerate(inputs):
            if isinstance(item, str):
                text, pair = item, None
            elif isinstance(item, (tuple, list)) and len(item) == 2:
                text, pair = item
            else:
                raise UserError(f"input {i}: expected a text or a (text, text) pair, got {type(item).__name__}")
            if not text or not str(text).strip():
                raise UserError(f"input {i}: empty text")
            out.append(ClassifyExample(str(text), None if pair is None else str(pair)))
        return out

    # -- encoding -----------------------------------------------------------------------
    def label_target(self, example: ClassifyExample, path=None):
        spec = self.spec
        label = example.label
        if spec.problem == "regression":
            value = to_float(label)
            if value is None:
                raise UserError(f"{where(path, example.line)}: label {label!r} is not a number")
            return value
        if spec.problem == "multi_label":
            if not isinstance(label, list):
                raise UserError(f"{where(path, example.line)}: expected a list of labels, got {label!r}")
            vec = [0.0] * len(spec.labels)
            for item in label:
                key = normalise_label(item)
                if key not in spec.labels:
                    raise UserError(f"{where(path, example.line)}: label {item!r} was not seen in training "
                                    f"(known: {', '.join(map(str, spec.labels))})")
                vec[spec.labels.index(key)] = 1.0
            return vec
        key = normalise_label(label)
        if key not in spec.labels:
            raise UserError(f"{where(path, example.line)}: label {label!r} was not seen in training "
                            f"(known: {', '.join(map(str, spec.labels))})")
        return spec.labels.index(key)

    def encode(self, examples: list[ClassifyExample], tokenizer, with_labels: bool = True,
               path: str | None = None) -> list[dict]:
        feats = encode_texts(tokenizer, [e.text for e in examples], [e.pair for e in examples],
                             self.spec.max_length)
        if with_labels:
            for f, e in zip(feats, examples):
                f["labels"] = self.label_target(e, path)
        return feats

    # -- loss and decoding ---------------------------------------------------------------
    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        labels = batch["labels"]
        if self.spec.problem == "regression":
            return F.mse_loss(logits.squeeze(-1), labels.float())
        if self.spec.problem == "multi_label":
            return F.binary_cross_entropy_with_logits(logits, labels.float())
        weight = None
        if self.spec.label_weights:
            weight = torch.tensor(self.spec.label_weights, dtype=logits.dtype, device=logits.device)
        return F.cross_entropy(logits, labels.long(), weight=weight)

    def encode_for_inference(self, examples: list[ClassifyExample], tokenizer,
                             with_labels: bool = False) -> tuple[list[dict], list[int]]:
        """One feature per example (longer inputs are truncated, as in training)."""
        return self.encode(examples, tokenizer, with_labels=with_labels), list(range(len(examples)))

    def output_hint(self) -> str:
        count = 1 if self.spec.problem == "regression" else len(self.spec.labels)
        return f" ({self.spec.problem}, {len(self.spec.labels)} labels: {count} outputs)"

    def describe(self) -> dict:
        return {**super().describe(), "labels": [str(x) if not isinstance(x, (int, str)) else x
                                                 for x in self.spec.labels], "problem": self.spec.problem}

    # -- plain inputs for `extract`: classify's tables are the generic reader -----------------
    text_formats = ("tsv", "csv", "jsonl")
    generic_reader = True

    @classmethod
    def read_texts(cls, path: str | None, fmt: str) -> list[TextInput]:
        return [TextInput(e.text, e.pair, e.line) for e in cls.read_file(path, ClassifySpec(), fmt, need_labels=False)]

    def collect(self, feature_outputs: list[np.ndarray], owner: list[int], examples, features) -> list[np.ndarray]:
        return list(feature_outputs)

    def decode(self, logits: list[np.ndarray], examples=None, **_) -> list[dict]:
        """Head outputs to `{"label", "scores"}` (or `{"value"}`, or `{"labels", "scores"}`)."""
        if not logits:
            return []
        arr = np.stack(logits)
        names = [str(label) for label in self.spec.labels]
        if self.spec.problem == "regression":
            return [{"value": float(v)} for v in arr[:, 0]]
        if self.spec.problem == "multi_label":
            probs = 1.0 / (1.0 + np.exp(-arr))
            return [{"labels": [self.spec.labels[j] for j in np.flatnonzero(p >= 0.5)],
                     "scores": {n: round(float(x), 6) for n, x in zip(names, p)}} for p in probs]
        probs = softmax(arr)
        best = probs.argmax(-1)
        return [{"label": self.spec.labels[b], "scores": {n: round(float(x), 6) for n, x in zip(names, p)}}
                for b, p in zip(best, probs)]

    def metrics(self, logits: list[np.ndarray], examples: list[ClassifyExample], path=None, **_) -> dict:
        arr = np.stack(logits)
        gold = [self.label_target(e, path) for e in examples]
        if self.spec.problem == "regression":
            return regression_metrics(arr[:, 0], np.asarray(gold, dtype=float))
        if self.spec.problem == "multi_label":
            return multi_label_metrics(arr >= 0.0, np.asarray(gold) >= 0.5)
        return label_metrics(arr.argmax(-1), np.asarray(gold), len(self.spec.labels))


# -- helpers ---------------------------------------------------------------------------
def detect_columns(columns: list[str], spec: ClassifySpec, path, need_labels: bool):
    """Text, pair and label columns from the header (or the spec's stored/overridden names).

    To predict (`need_labels` False), a stored column name the file lacks is found again by
    its role, so a model trained on a TSV `sentence` column reads JSONL `{"text": ...}`; the
    spec is then left as it was."""
    if not need_labels and (spec.text_column not in (None, *columns) or spec.pair_column not in (None, *columns)):
        roles = ClassifySpec(pair=spec.pair)
        return detect_columns(columns, roles, path, need_labels)
    lower = [c.lower() for c in columns]
    text_col = find_column(columns, TEXT_COLUMNS, spec.text_column, path, "text")
    if not spec.text_column and "question" in lower and "sentence" in lower:  # QNLI
        text_col = columns[lower.index("question")]
    if text_col is None:
        raise UserError(f"{where(path, 1)}: no text column found (columns: {', '.join(columns)}); "
                        f"name one with --text-column")
    if spec.pair_column:
        pair_col = find_column(columns, [], spec.pair_column, path, "second text")
    elif text_col.lower() == "question" and "sentence" in lower:
        pair_col = columns[lower.index("sentence")]
    else:
        pair_col = find_column(columns, PAIR_COLUMNS, None, path, "second text")
    if spec.pair and pair_col is None:
        raise UserError(f"{where(path, 1)}: the model reads text pairs but no second text column was found "
                        f"(columns: {', '.join(columns)}); name one with --pair-column")
    if not need_labels and spec.label_column and spec.label_column not in columns:
        label_col = None  # labels are optional for predict
    else:
        label_col = find_column(columns, LABEL_COLUMNS, spec.label_column, path, "label")
    if need_labels and label_col is None:
        raise UserError(f"{where(path, 1)}: no label column found (columns: {', '.join(columns)}); "
                        f"name one with --label-column")
    spec.text_column, spec.pair_column = text_col, pair_col
    if label_col:
        spec.label_column = label_col
    return text_col, pair_col, label_col


def normalise_label(value):
    """Labels compare as ints when they look like ints, else as stripped strings."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    text = str(value).strip()
    return int(text) if _INT.match(text) else text


def to_float(value) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def infer_labels(examples: list[ClassifyExample], path, problem: str | None) -> tuple[str, list]:
    """Problem type and label list from training labels: lists make it multi-label, numbers
    with a fraction make it regression, anything else single-label (ints sort numerically)."""
    values = [e.label for e in examples]
    if problem and problem not in PROBLEMS:
        raise UserError(f"--problem: expected one of {', '.join(PROBLEMS)}, got {problem!r}")
    if problem == "multi_label" or (problem is None and any(isinstance(v, list) for v in values)):
        for e in examples:
            if not isinstance(e.label, list):
                raise UserError(f"{where(path, e.line)}: expected a list of labels like the other rows, got {e.label!r}")
        labels = sorted({normalise_label(x) for v in values for x in v}, key=sort_key)
        return "multi_label", labels
    numeric = [to_float(v) for v in values]
    fractional = any(x is not None and not float(x).is_integer() for x in numeric) or any(
        isinstance(v, str) and "." in v and to_float(v) is not None for v in values)
    if problem == "regression" or (problem is None and fractional):
        for e, x in zip(examples, numeric):
            if x is None:
                raise UserError(f"{where(path, e.line)}: label {e.label!r} is not a number")
        return "regression", []
    labels = sorted({normalise_label(v) for v in values}, key=sort_key)
    if len(labels) < 2:
        raise UserError(f"{where(path)}: training data has only one label ({labels[0]!r}); need at least two")
    return "single_label", labels


def sort_key(label):
    return (0, label, "") if isinstance(label, int) else (1, 0, str(label))


def softmax(x: np.ndarray) -> np.ndarray:
    z = x - x.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def label_metrics(pred: np.ndarray, gold: np.ndarray, num_labels: int) -> dict:
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    average = "binary" if num_labels == 2 else "macro"
    return {
        "accuracy": float(accuracy_score(gold, pred)),
        "f1": float(f1_score(gold, pred, average=average, labels=list(range(num_labels)) if average == "macro" else None,
                             zero_division=0)),
        "mcc": float(matthews_corrcoef(gold, pred)),
        "examples": int(len(gold)),
    }


def regression_metrics(pred: np.ndarray, gold: np.ndarray) -> dict:
    from scipy.stats import pearsonr, spearmanr

    constant = np.allclose(pred, pred[0]) or np.allclose(gold, gold[0])
    return {
        "pearson": 0.0 if constant else float(pearsonr(pred, gold)[0]),
        "spearman": 0.0 if constant else float(spearmanr(pred, gold)[0]),
        "mse": float(np.mean((pred - gold) ** 2)),
        "examples": int(len(gold)),
    }


def multi_label_metrics(pred: np.ndarray, gold: np.ndarray) -> dict:
    from sklearn.metrics import f1_score

    return {
        "micro_f1": float(f1_score(gold, pred, average="micro", zero_division=0)),
        "macro_f1": float(f1_score(gold, pred, average="macro", zero_division=0)),
        "subset_accuracy": float(np.mean(np.all(pred == gold, axis=1))),
        "examples": int(len(gold)),
    }
