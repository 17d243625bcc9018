"""Decoding classify outputs and their metrics (`metrics.py` holds the formulas)."""

from __future__ import annotations

import numpy as np

from bertheads.base.errors import UserError
from bertheads.tasks.classify.confidence import decision_rows, top_confidence
from bertheads.tasks.classify.formats import ClassifyExample
from bertheads.tasks.classify.metrics import (
    label_metrics,
    learned_nothing,
    multi_label_metrics,
    regression_metrics,
    tune_thresholds,
)
from bertheads.tasks.parts import AuditReader, Disputes, Judging, Scoring, softmax


class ClassifyJudging(Judging):
    """A classify head's decoding and metrics: softmax labels with scores (or `min_score`'s
    null), multi-label thresholds, regression values; accuracy/F1/MCC, micro/macro F1, Pearson."""

    @property
    def main_metric(self) -> str:  # type: ignore[override]
        return {"single_label": "accuracy", "regression": "pearson", "multi_label": "micro_f1"}[self.spec.problem]

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

    def label_thresholds(self) -> np.ndarray:
        """Multi-label decision thresholds: the spec's fixed one (a call's `threshold`
        overrides it), else the per-label ones tuned on dev, else 0.5."""
        n = len(self.spec.labels)
        threshold = self.spec.threshold
        if threshold is not None:
            return np.full(n, float(threshold))
        if self.spec.thresholds and len(self.spec.thresholds) == n:
            return np.asarray(self.spec.thresholds, dtype=float)
        return np.full(n, 0.5)

    def decode(self, logits: list[np.ndarray], examples=None) -> list[dict]:
        """Head outputs to `{"label", "scores"}` (or `{"value"}`, or `{"labels", "scores"}`),
        after the example's carried fields (`id`, --keep-fields) when it has any. Single-label:
        `min_score` gives `"label": null` when the best score is below it. The scores are
        calibrated (the logits divided by the head's temperature); `min_confidence` adds
        `"abstained"` (`confidence.py` `top_confidence`)."""
        options = self.task.options.values
        min_confidence = options.min_confidence
        preds = self.decode_scores(logits, options.min_score)
        if min_confidence is not None:
            preds = [self.task.scoring.abstain(p, top_confidence(p, self.spec.problem), min_confidence) for p in preds]
        if examples is None:
            return preds
        return [{**e.extra, **p} if getattr(e, "extra", None) else p for p, e in zip(preds, examples)]

    def decode_scores(self, logits: list[np.ndarray], min_score: float | None = None) -> list[dict]:
        if not logits:
            return []
        arr = np.stack(logits)
        shown = self.spec.shown_labels()
        names = [str(label) for label in shown]
        if self.spec.problem == "regression":
            return [{"value": float(v)} for v in arr[:, 0]]
        t = self.task.scoring.temperature()
        if self.spec.problem == "multi_label":  # decided on the raw scores (the thresholds were tuned on them)
            cut = self.label_thresholds()
            return [{"labels": [shown[j] for j in np.flatnonzero(raw >= cut)],
                     "scores": {n: round(float(x), 6) for n, x in zip(names, p)}}
                    for raw, p in zip(sigmoid(arr), sigmoid(arr / t))]
        probs = softmax(arr / t)
        best = probs.argmax(-1)
        return [{"label": None if min_score is not None and p[b] < min_score else shown[b],
                 "scores": {n: round(float(x), 6) for n, x in zip(names, p)}}
                for b, p in zip(best, probs)]

    def metrics(self, logits: list[np.ndarray], examples: list[ClassifyExample], path=None,
                during_training: bool = False) -> dict:
        """Accuracy, F1, MCC with per-class figures and the confusion matrix (single-label),
        micro/macro F1 with per-label figures (multi-label; after an epoch the per-label
        thresholds are tuned here unless one was fixed), or Pearson/Spearman (regression)."""
        return self.metrics_from_parts([self.metric_part(logits, examples, path)], path, during_training)

    def metric_part(self, logits: list[np.ndarray], examples: list[ClassifyExample], path=None):
        """A chunk's outputs and gold targets as arrays (the examples are not kept)."""
        return np.stack(logits), [self.task.reading.label_target(e, path) for e in examples]

    def metrics_from_parts(self, parts: list, path=None, during_training: bool = False) -> dict:
        arr = np.concatenate([p[0] for p in parts])
        gold = [g for p in parts for g in p[1]]
        names = [str(label) for label in self.spec.shown_labels()]  # per_class keyed as predictions name them
        if self.spec.problem == "regression":
            return regression_metrics(arr[:, 0], np.asarray(gold, dtype=float))
        if self.spec.problem == "multi_label":
            probs, truth = sigmoid(arr), np.asarray(gold) >= 0.5
            if during_training and self.spec.threshold is None:
                self.spec.thresholds = [round(float(t), 6) for t in tune_thresholds(probs, truth)]
            cut = self.label_thresholds()
            result = multi_label_metrics(probs >= cut, truth, names)
            result["thresholds"] = {n: round(float(t), 4) for n, t in zip(names, cut)}
            return result
        return label_metrics(arr.argmax(-1), np.asarray(gold), len(self.spec.labels), names)

    def learned_nothing(self, metrics: dict) -> str | None:
        return learned_nothing(self.spec.problem, metrics)  # (metrics.py)


class ClassifyScoring(Scoring):
    """What a classify head's scores mean: its decisions for calibration, the labels it
    disputes (audit), how unsure it is (select) and its classes' counts."""

    # `audit --mode features`: a linear reader of the last 4 layers' pooled states, each
    # normalised, side by side, 10 epochs (SST-2's first 4,000 rows, 10% of the labels flipped,
    # seeds 0-2: precision at k 0.610 against the trained head's 0.550; 3 epochs 0.573, 20 0.603,
    # the layers' mean 0.547; seeds 3-5, untuned: 0.610 against 0.565, the cleanlab recipe 0.485; bench/RESULTS.md)
    audit_reader = AuditReader("linear over the last 4 layers' pooled vectors, each L2-normalised, side by side",
                               {"layer_combine": "concat", "normalised": True}, last_layers=4, epochs=10,
                               unless=("label_descriptions",))  # (a head from descriptions reads as it starts)

    def calibration_rows(self, logits: list[np.ndarray], examples: list[ClassifyExample], path=None):
        """Its decisions (`confidence.py`): per input, or per input and label (multi-label)."""
        arr = np.stack(logits).astype(np.float64) if logits else np.zeros((0, 1))
        return decision_rows(arr, [self.task.reading.label_target(e, path) for e in examples], self.spec.problem)

    def no_calibration(self) -> str:
        return "regression heads give values, not scores: nothing to calibrate"

    def disputes(self, logits: list[np.ndarray], examples: list[ClassifyExample], path=None) -> Disputes:
        """Each example's given label against its out-of-fold probabilities (softmax, or one
        sigmoid per label for multi-label); regression has no classes to dispute."""
        if self.spec.problem == "regression":
            raise UserError("regression heads have no audit (no classes to dispute)")
        multi = self.spec.problem == "multi_label"
        arr = np.stack(logits) if logits else np.zeros((0, len(self.spec.labels)))
        probs = sigmoid(arr) if multi else softmax(arr)
        targets = [self.task.reading.label_target(e, path) for e in examples]
        labels = [[j for j, v in enumerate(t) if v >= 0.5] for t in targets] if multi else [int(t) for t in targets]
        units = [{"example": i, "text": e.text, **({"pair": e.pair} if e.pair is not None else {})}
                 for i, e in enumerate(examples)]
        return Disputes(units, labels, [str(n) for n in self.spec.shown_labels()], probs, multi)

    def class_counts(self, examples: list[ClassifyExample]) -> dict[str, int]:
        """Examples per label (multi-label: the examples that have it); regression: none."""
        if self.spec.problem == "regression":
            return {}
        targets, n = [self.task.reading.label_target(e) for e in examples], len(self.spec.labels)
        hits = ((np.asarray(targets).reshape(-1, n) >= 0.5).sum(0) if self.spec.problem == "multi_label"
                else np.bincount(np.asarray(targets, dtype=np.int64), minlength=n))
        return dict(zip(map(str, self.spec.shown_labels()), hits.tolist()))

    def uncertainty(self, logits: list[np.ndarray]) -> list[np.ndarray]:
        """One row per example: its label probabilities (multi-label: each label's yes/no)."""
        if self.spec.problem == "regression":
            raise UserError("regression heads have no selection of inputs (no classes to be unsure of)")
        arr = np.stack(logits)
        if self.spec.problem == "multi_label":
            p = sigmoid(arr)
            return [np.stack([q, 1 - q], axis=-1) for q in p]
        return [row[None] for row in softmax(arr)]


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))
