"""Whole-sequence judgments from one vector per input (the final [CLS] vector, or the mean or
max of the tokens: `ClassifySpec.pooling`): one text or a pair of texts, single-label
classification, regression, or multi-label (the task, its head, loss and decoding; its
settings are `spec.py`, its formats `formats.py`)."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from bertheads.base.errors import UserError, where
from bertheads.base.values import fraction, non_negative_int
from bertheads.encoder.layers import POOLINGS, LayerCombine, pool_tokens
from bertheads.tasks.base import CardText, HeadSettings, Task, TextInput, init_linear, option, softmax
from bertheads.tasks.classify.formats import (  # noqa: F401  (infer_labels, normalise_label: bench and tests)
    ClassifyExample,
    check_label_names,
    infer_labels,
    iter_file,
    label_name_list,
    normalise_label,
    read_file,
    report,
    to_float,
)
from bertheads.tasks.classify.metrics import (  # noqa: F401  (label_metrics: bench and tests import it from here)
    label_metrics,
    multi_label_metrics,
    regression_metrics,
    tune_thresholds,
)
from bertheads.tasks.classify.report import classify_section
from bertheads.tasks.classify.spec import LONG_INPUTS, POOLS, PROBLEMS, ClassifySpec
from bertheads.tasks.families import (
    FAMILIES,
    Family,
    activation,
    copy_into,
    copy_start,
    dense_block,
    init_head_linear,
    pooling,
    settle_family,
    start_weights,
)
from bertheads.text.encoding import encode_texts, encode_windows
from bertheads.text.readers import (
    BadLine,
    source_name,
)

log = logging.getLogger(__name__)

HF_PROBLEM_TYPES = {"single_label": "single_label_classification", "regression": "regression",
                    "multi_label": "multi_label_classification"}




@dataclass
class ClassifyOptions:
    """What `predict`, `evaluate` and the server may change of a classify head."""

    threshold: float | None = option(None, "multi-label classify: one threshold for every label instead of the "
                                           "saved ones", type=fraction)
    min_score: float | None = option(None, "single-label classify: no label (null) when the best score is below "
                                           "this", type=fraction, commands=("predict", "serve"))
    long_input: str | None = option(None, "classify: override the saved way of reading texts longer than "
                                          "--max-length", choices=LONG_INPUTS, commands=("predict", "serve"), spec=True)
    pool: str | None = option(None, "classify, --long-input windows: override the saved pooling", choices=POOLS,
                              commands=("predict", "serve"), spec=True)


class ClassifyHead(nn.Module):
    """The sequence head of the checkpoint's family (`tasks/families.py`): BERT's pooler (dense
    + tanh over [CLS]), dropout and a linear layer; RoBERTa's, ELECTRA's, DeBERTa's, DistilBERT's
    or ModernBERT's own layout for those checkpoints. It reads one vector per input: [CLS], or
    the mean or max of the tokens the attention mask keeps (`pooling`, settled by
    `ClassifyTask.build`; `family_pooling` is what the family's transformers class reads)."""

    token_level = False

    def __init__(self, hidden_size: int, num_outputs: int, settings: HeadSettings, pooler_state=None,
                 family: Family | None = None, config=None) -> None:
        super().__init__()
        family = family or FAMILIES["bert"]
        self.layers = tuple(settings.layers)
        self.combine = LayerCombine(len(self.layers), settings.combine)
        size = self.combine.output_size(hidden_size)
        if family.init == "bert":  # as bertheads always built it (same weights for the same seed)
            self.pooler = init_linear(nn.Linear(size, size))
            self.norm = None
        else:
            dense, self.norm = dense_block(family, config, size)
            self.pooler = init_head_linear(dense, family, config, "dense")
        copy_start(self.pooler, self.norm, pooler_state)
        self.activation = activation(family, config)
        self.dropout_first = family.dropout_first
        self.family_pooling = pooling(family, config)
        chosen = getattr(settings, "pooling", None)
        self.pooling = chosen if chosen in POOLINGS else self.family_pooling
        self.dropout = nn.Dropout(settings.dropout)
        if family.init == "bert":
            self.out = init_linear(nn.Linear(size, num_outputs))
        else:
            self.out = init_head_linear(nn.Linear(size, num_outputs), family, config, "out")

    def forward(self, hidden, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        states = self.combine(hidden)
        # [CLS], or the mean/max of every token the mask keeps, specials included (cached pooled
        # states come as one position with a mask of ones)
        cls = pool_tokens(states, batch.get("attention_mask"), self.pooling)
        if self.dropout_first:
            cls = self.dropout(cls)
        pooled = self.activation(self.pooler(cls))
        if self.norm is not None:
            pooled = self.norm(pooled)
        return self.out(self.dropout(pooled))


class ClassifyTask(Task):
    kind = "classify"
    spec_type = ClassifySpec
    prepare_options = ("problem", "limit")
    help = "labels or scores for a text or a text pair, read from [CLS] (or the tokens' mean or max)"
    options_type = ClassifyOptions
    shows = "scores"
    hf_auto_class = "AutoModelForSequenceClassification"
    hf_pipeline = "text-classification"

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
        parser.add_argument("--threshold", type=fraction,
                            help="multi-label: one decision threshold for every label (default: one per label, "
                                 "tuned on --dev for F1 after each epoch; 0.5 without --dev)")
        parser.add_argument("--label-names", type=label_name_list, default=None,
                            help="names for the labels in sorted order, e.g. negative,positive for 0/1 labels; "
                                 "predictions show the names, files may use either")
        parser.add_argument("--long-input", choices=LONG_INPUTS, default="truncate",
                            help="a text longer than --max-length: cut at it, or cut into overlapping windows "
                                 "whose outputs are pooled (training: each window learns the text's label)")
        parser.add_argument("--pool", choices=POOLS, default="mean",
                            help="--long-input windows: pool the windows' outputs (logits) by mean or max")
        parser.add_argument("--stride", type=non_negative_int, default=32,
                            help="--long-input windows: tokens shared by neighbouring windows")

    @property
    def main_metric(self) -> str:  # type: ignore[override]
        return {"single_label": "accuracy", "regression": "pearson", "multi_label": "micro_f1"}[self.spec.problem]

    @classmethod
    def build(cls, spec: ClassifySpec, encoder, pooler_state=None) -> ClassifyTask:
        """A fresh head of the encoder's family (or the family the spec records); `pooler_state`:
        the checkpoint's weights its dense layer (and norm) start from."""
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

    # -- reading ------------------------------------------------------------------------
    read_file = staticmethod(read_file)
    iter_file = staticmethod(iter_file)

    @classmethod
    def prepare(cls, path: str, spec: ClassifySpec, encoder, problem: str | None = None, limit: int | None = None):
        """Read the training file (its first `limit` examples), decide the problem type and label
        map, build the task."""
        examples = cls.read_file(path, spec, limit=limit)
        spec.problem, spec.labels = infer_labels(examples, path, problem)
        if isinstance(spec.label_names, str):  # the API may give "negative,positive"
            try:
                spec.label_names = label_name_list(spec.label_names)
            except argparse.ArgumentTypeError as exc:
                raise UserError(f"label_names: {exc}") from None
        if spec.label_names:
            check_label_names(spec, path)
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
        return cls.build(spec, encoder, start_weights(settle_family(spec, encoder), encoder)), examples

    def read(self, path: str | None, need_labels: bool = True, fmt: str | None = None,
             **_) -> list[ClassifyExample]:
        examples = self.read_file(path, self.spec, fmt, need_labels)
        if need_labels:
            for e in examples:
                self.label_target(e, path)  # fail early on unseen or non-numeric labels
        return examples

    def iter_read(self, path, need_labels: bool = True, fmt: str | None = None, keep: tuple[str, ...] = (),
                  bad: BadLine | None = None, **_) -> Iterator[ClassifyExample]:
        """`read`, one example at a time (see `iter_file`)."""
        name = source_name(path)
        for e in self.iter_file(path, self.spec, fmt, need_labels, keep, bad):
            if need_labels:
                try:
                    self.label_target(e, name)
                except UserError as exc:
                    report(exc, bad)
                    continue
            yield e

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
        if key not in spec.labels and spec.label_names and str(key) in spec.label_names:
            return spec.label_names.index(str(key))
        if key not in spec.labels:
            raise UserError(f"{where(path, example.line)}: label {label!r} was not seen in training "
                            f"(known: {', '.join(map(str, spec.labels))})")
        return spec.labels.index(key)

    def encode(self, examples: list[ClassifyExample], tokenizer, with_labels: bool = True,
               path: str | None = None) -> list[dict]:
        """One feature per example, or with `long_input="windows"` one per window (each window
        of a training text learns the text's label)."""
        return self.encode_with_owner(examples, tokenizer, with_labels, path)[0]

    def encode_with_owner(self, examples: list[ClassifyExample], tokenizer, with_labels: bool = True,
                          path: str | None = None) -> tuple[list[dict], list[int]]:
        spec = self.spec
        texts, pairs = [e.text for e in examples], [e.pair for e in examples]
        if spec.long_input == "windows":
            check_windows(spec)
            feats, owner = encode_windows(tokenizer, texts, pairs, spec.max_length, spec.stride)
        else:
            feats, owner = encode_texts(tokenizer, texts, pairs, spec.max_length), list(range(len(examples)))
        if with_labels:
            targets = [self.label_target(e, path) for e in examples]
            for f, k in zip(feats, owner):
                f["labels"] = targets[k]
        return feats, owner

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
        """One feature per example (longer inputs are truncated, as in training), or one per window."""
        return self.encode_with_owner(examples, tokenizer, with_labels)

    def output_hint(self) -> str:
        count = 1 if self.spec.problem == "regression" else len(self.spec.labels)
        return f" ({self.spec.problem}, {len(self.spec.labels)} labels: {count} outputs)"

    def describe(self) -> dict:
        return {**super().describe(), "labels": [str(x) if not isinstance(x, (int, str)) else x
                                                 for x in self.spec.shown_labels()], "problem": self.spec.problem}

    def report_section(self, outputs: list, examples: list, metrics: dict, section) -> None:
        classify_section(self, outputs, examples, metrics, section)

    # -- the model card ------------------------------------------------------------------------
    def card_text(self) -> CardText:
        spec = self.spec
        labels = [str(label) for label in spec.shown_labels()]
        inputs = "texts and pairs" if spec.pair else "texts"
        longer = (f"{inputs} longer than {spec.max_length} tokens are cut into overlapping windows whose scores "
                  f"are pooled ({spec.pool})" if spec.long_input == "windows"
                  else f"{inputs} longer than {spec.max_length} tokens are cut at that length")
        limits = [longer[0].upper() + longer[1:] + "."]
        if spec.pair:
            limits.append("It reads a pair of texts (the second after the separator); a single text is not "
                          "what it was trained on.")
        if spec.problem == "regression":
            return CardText(outputs="`value`: a number on the scale of the training labels",
                            raw_outputs="`[batch, 1]`: the value", pipeline_tag=self.hf_pipeline,
                            limits=["The value is learned from the training labels; nothing keeps it within "
                                    "their range.", *limits], example=self.card_example())
        if spec.problem == "multi_label":
            return CardText(outputs="`labels`: every label whose probability passes its threshold, and `scores`: "
                                    "a probability per label (sigmoid)",
                            raw_outputs=f"`[batch, {len(labels)}]`: one score (logit) per label, in the order listed",
                            pipeline_tag=self.hf_pipeline, labels=labels,
                            limits=["Only the labels of the training file exist; each is chosen when its "
                                    "probability passes its threshold (tuned on the dev set for F1 unless one "
                                    "was fixed).", *limits], example=self.card_example())
        return CardText(outputs="`label`: the most probable label, and `scores`: a probability per label (softmax)",
                        raw_outputs=f"`[batch, {len(labels)}]`: one score (logit) per label, in the order listed",
                        pipeline_tag=self.hf_pipeline, labels=labels,
                        limits=[f"Every input gets one of the {len(labels)} training labels, also an input that "
                                f"fits none of them (`--min-score` leaves an unsure one without a label).", *limits],
                        example=self.card_example())

    def card_example(self):
        return ("A first text.", "A second text.") if self.spec.pair else "A sample text."

    def hf_usage(self, path: str) -> str:
        """The text-classification pipeline; a pair as `text` and `text_pair`, every label's
        score for a multi-label head."""
        example = self.card_example()
        if isinstance(example, tuple):
            example = {"text": example[0], "text_pair": example[1]}
        options = ", top_k=None" if self.spec.problem == "multi_label" else ""
        return (f"from transformers import pipeline\n\n"
                f"pipe = pipeline({self.hf_pipeline!r}, model={path!r}{options})\n"
                f"print(pipe({example!r}))\n")

    # -- export --to hf: the head's layers into the family's own class (`families.py` key maps) --
    def hf_labels(self) -> list[str]:
        """The labels as predictions show them (their `--label-names` when given), so the
        transformers pipeline answers with the same names; regression has its one output."""
        return ["value"] if self.spec.problem == "regression" else [str(label) for label in self.spec.shown_labels()]

    def hf_check(self, name: str) -> None:
        super().hf_check(name)
        if self.head.pooling != self.head.family_pooling:
            raise UserError(f"head {name!r} reads the {self.head.pooling} of its tokens (pooling {self.head.pooling}), "
                            f"but the transformers {self.hf_auto_class} of its family reads "
                            f"{'the first token' if self.head.family_pooling == 'cls' else 'their ' + self.head.family_pooling}, "
                            f"so it has no transformers equivalent; export it with --to onnx")

    def hf_configure(self, config) -> None:
        super().hf_configure(config)
        config.problem_type = HF_PROBLEM_TYPES[self.spec.problem]

    def hf_copy_head(self, model: nn.Module, name: str) -> None:
        family = FAMILIES[self.spec.head_family or "bert"]
        copy_into(model, self.head, family.sequence_keys, f"head {name!r}")

    # -- plain inputs for `extract`: classify's tables are the generic reader -----------------
    text_formats = ("tsv", "csv", "jsonl")
    generic_reader = True

    @classmethod
    def read_texts(cls, path: str | None, fmt: str) -> list[TextInput]:
        return [TextInput(e.text, e.pair, e.line) for e in cls.read_file(path, ClassifySpec(), fmt, need_labels=False)]

    def collect(self, feature_outputs: list[np.ndarray], owner: list[int], examples, features) -> list[np.ndarray]:
        """One output per example: its feature's, or its windows' pooled (mean or max of the logits)."""
        if len(feature_outputs) == len(examples):
            return list(feature_outputs)
        groups: list[list[int]] = [[] for _ in examples]
        for i, k in enumerate(owner):
            groups[k].append(i)
        pool = np.max if self.spec.pool == "max" else np.mean
        return [feature_outputs[g[0]] if len(g) == 1 else pool(np.stack([feature_outputs[i] for i in g]), axis=0)
                for g in groups]

    def label_thresholds(self, threshold: float | None = None) -> np.ndarray:
        """Multi-label decision thresholds: `threshold` if given, else the spec's fixed one,
        else the per-label ones tuned on dev, else 0.5."""
        n = len(self.spec.labels)
        if threshold is None:
            threshold = self.spec.threshold
        if threshold is not None:
            return np.full(n, float(threshold))
        if self.spec.thresholds and len(self.spec.thresholds) == n:
            return np.asarray(self.spec.thresholds, dtype=float)
        return np.full(n, 0.5)

    def decode(self, logits: list[np.ndarray], examples=None, threshold: float | None = None,
               min_score: float | None = None, **_) -> list[dict]:
        """Head outputs to `{"label", "scores"}` (or `{"value"}`, or `{"labels", "scores"}`),
        after the example's carried fields (`id`, --keep-fields) when it has any. Single-label:
        `min_score` gives `"label": null` when the best score is below it."""
        preds = self.decode_scores(logits, threshold, min_score)
        if examples is None:
            return preds
        return [{**e.extra, **p} if getattr(e, "extra", None) else p for p, e in zip(preds, examples)]

    def decode_scores(self, logits: list[np.ndarray], threshold: float | None = None,
                      min_score: float | None = None) -> list[dict]:
        if not logits:
            return []
        arr = np.stack(logits)
        shown = self.spec.shown_labels()
        names = [str(label) for label in shown]
        if self.spec.problem == "regression":
            return [{"value": float(v)} for v in arr[:, 0]]
        if self.spec.problem == "multi_label":
            probs = sigmoid(arr)
            cut = self.label_thresholds(threshold)
            return [{"labels": [shown[j] for j in np.flatnonzero(p >= cut)],
                     "scores": {n: round(float(x), 6) for n, x in zip(names, p)}} for p in probs]
        probs = softmax(arr)
        best = probs.argmax(-1)
        return [{"label": None if min_score is not None and p[b] < min_score else shown[b],
                 "scores": {n: round(float(x), 6) for n, x in zip(names, p)}}
                for b, p in zip(best, probs)]

    def metrics(self, logits: list[np.ndarray], examples: list[ClassifyExample], path=None,
                threshold: float | None = None, during_training: bool = False, **_) -> dict:
        """Accuracy, F1, MCC with per-class figures and the confusion matrix (single-label),
        micro/macro F1 with per-label figures (multi-label; after an epoch the per-label
        thresholds are tuned here unless one was fixed), or Pearson/Spearman (regression)."""
        return self.metrics_from_parts([self.metric_part(logits, examples, path)], path, threshold=threshold,
                                       during_training=during_training)

    def metric_part(self, logits: list[np.ndarray], examples: list[ClassifyExample], path=None, **_):
        """A chunk's outputs and gold targets as arrays (the examples are not kept)."""
        return np.stack(logits), [self.label_target(e, path) for e in examples]

    def metrics_from_parts(self, parts: list, path=None, threshold: float | None = None,
                           during_training: bool = False, **_) -> dict:
        arr = np.concatenate([p[0] for p in parts])
        gold = [g for p in parts for g in p[1]]
        names = [str(label) for label in self.spec.shown_labels()]  # per_class keyed as predictions name them
        if self.spec.problem == "regression":
            return regression_metrics(arr[:, 0], np.asarray(gold, dtype=float))
        if self.spec.problem == "multi_label":
            probs, truth = sigmoid(arr), np.asarray(gold) >= 0.5
            if during_training and self.spec.threshold is None and threshold is None:
                self.spec.thresholds = [round(float(t), 6) for t in tune_thresholds(probs, truth)]
            cut = self.label_thresholds(threshold)
            result = multi_label_metrics(probs >= cut, truth, names)
            result["thresholds"] = {n: round(float(t), 4) for n, t in zip(names, cut)}
            return result
        return label_metrics(arr.argmax(-1), np.asarray(gold), len(self.spec.labels), names)


# -- helpers ---------------------------------------------------------------------------
def settle_pooling(spec: ClassifySpec, encoder, family: Family) -> None:
    """The spec's `pooling` settled: "auto" is the pooling the checkpoint declares (a
    sentence-transformers `Pooling` module) for a frozen encoder (`mode` features), else the
    family's own head; None (a spec saved before the field) is the family's own head."""
    own = pooling(family, getattr(encoder, "config", None))
    if spec.pooling is None:
        spec.pooling = own
    elif spec.pooling == "auto":
        declared = None
        if spec.mode == "features" and hasattr(encoder, "declared_pooling"):
            declared = encoder.declared_pooling()
        spec.pooling = declared or own
        if declared and declared != own:
            log.info(f"the head reads the {declared} of the tokens, the pooling the checkpoint declares "
                     f"(--pooling cls: [CLS])")
    if spec.pooling not in POOLINGS:
        raise UserError(f"--pooling: expected auto, {', '.join(POOLINGS)}, got {spec.pooling!r}")


def check_windows(spec: ClassifySpec) -> None:
    if spec.long_input not in LONG_INPUTS:
        raise UserError(f"--long-input: expected one of {', '.join(LONG_INPUTS)}, got {spec.long_input!r}")
    if spec.pool not in POOLS:
        raise UserError(f"--pool: expected one of {', '.join(POOLS)}, got {spec.pool!r}")
    if not 0 <= spec.stride < spec.max_length - 3:
        raise UserError(f"--stride {spec.stride}: must be at least 0 and below --max-length minus 3")


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))
