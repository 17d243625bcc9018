"""Classification metrics: accuracy, F1, MCC with per-class figures and the confusion matrix
(single-label), Pearson/Spearman (regression), micro/macro F1 with per-label figures and the
per-label thresholds tuned for F1 (multi-label).

The label metrics are computed from counts (the confusion matrix, per-class true positives) with
numpy and follow scikit-learn's definitions exactly (tests compare them on hand-made and random
cases): importing sklearn.metrics costs about a second, which every `evaluate` and every
training run's dev evaluation would pay for a few sums."""

from __future__ import annotations

import numpy as np


def label_metrics(pred: np.ndarray, gold: np.ndarray, num_labels: int, names: list[str] | None = None) -> dict:
    """Accuracy, F1 (binary: of class 1; else macro over the classes), MCC, per-class
    precision, recall, F1 and support, and the confusion matrix (rows: gold class, columns:
    predicted class)."""
    names = names or [str(i) for i in range(num_labels)]
    pred, gold = np.asarray(pred, dtype=np.int64), np.asarray(gold, dtype=np.int64)
    confusion = np.bincount(gold * num_labels + pred, minlength=num_labels * num_labels).reshape(num_labels, num_labels)
    classes = per_class(pred[:, None] == np.arange(num_labels), gold[:, None] == np.arange(num_labels), names)
    f1s = [classes[n]["f1"] for n in names]
    return {
        "accuracy": float(np.trace(confusion) / max(1, len(gold))),
        "f1": float(f1s[1] if num_labels == 2 else np.mean(f1s)),
        "mcc": matthews(confusion),
        "examples": int(len(gold)),
        "per_class": classes,
        "confusion": {"labels": names, "matrix": confusion.tolist()},
    }


def matthews(confusion: np.ndarray) -> float:
    """Matthews correlation of a [gold, predicted] confusion matrix (the multi-class form;
    0 when either side is constant)."""
    c = confusion.astype(np.float64)
    n, correct = c.sum(), np.trace(c)
    true, predicted = c.sum(1), c.sum(0)
    denominator = np.sqrt((n * n - predicted @ predicted) * (n * n - true @ true))
    return float((correct * n - predicted @ true) / denominator) if denominator else 0.0


def per_class(pred: np.ndarray, gold: np.ndarray, names: list[str]) -> dict:
    """Precision, recall, F1 and support of each column of boolean [examples, classes] arrays
    (0 where a ratio has no denominator, as sklearn's zero_division=0)."""
    tp = (pred & gold).sum(0)
    predicted, support = pred.sum(0), gold.sum(0)
    out = {}
    for j, name in enumerate(names):
        precision = tp[j] / predicted[j] if predicted[j] else 0.0
        recall = tp[j] / support[j] if support[j] else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        out[name] = {"precision": float(precision), "recall": float(recall), "f1": float(f1),
                     "support": int(support[j])}
    return out


def regression_metrics(pred: np.ndarray, gold: np.ndarray) -> dict:
    from scipy.stats import pearsonr, spearmanr

    constant = np.allclose(pred, pred[0]) or np.allclose(gold, gold[0])
    return {
        "pearson": 0.0 if constant else float(pearsonr(pred, gold)[0]),
        "spearman": 0.0 if constant else float(spearmanr(pred, gold)[0]),
        "mse": float(np.mean((pred - gold) ** 2)),
        "examples": int(len(gold)),
    }


def multi_label_metrics(pred: np.ndarray, gold: np.ndarray, names: list[str] | None = None) -> dict:
    """Micro and macro F1, subset accuracy and per-label precision, recall, F1 and support of
    boolean [examples, labels] arrays."""
    pred, gold = np.asarray(pred, dtype=bool), np.asarray(gold, dtype=bool)
    names = names or [str(i) for i in range(gold.shape[1])]
    labels = per_class(pred, gold, names)
    tp, predicted, support = int((pred & gold).sum()), int(pred.sum()), int(gold.sum())
    return {
        "micro_f1": 2 * tp / (predicted + support) if predicted + support else 0.0,
        "macro_f1": float(np.mean([labels[n]["f1"] for n in names])),
        "subset_accuracy": float(np.mean(np.all(pred == gold, axis=1))),
        "examples": int(len(gold)),
        "per_label": labels,
    }


def tune_thresholds(probs: np.ndarray, gold: np.ndarray) -> np.ndarray:
    """Per label, the decision threshold with the best F1 on these scores: a label is
    predicted when its score is at least the threshold. Candidates lie halfway between
    neighbouring distinct scores; among equal F1 the one nearest 0.5 wins. A label with no
    positive example keeps 0.5."""
    out = np.full(probs.shape[1], 0.5)
    for j in range(probs.shape[1]):
        p, g = probs[:, j], gold[:, j].astype(bool)
        if not g.any():
            continue
        order = np.argsort(-p, kind="stable")
        sp, sg = p[order], g[order]
        last = np.r_[sp[1:] != sp[:-1], True]  # predicting the top k: only where scores change
        tp = np.cumsum(sg)[last]
        k = np.flatnonzero(last) + 1
        f1 = 2 * tp / (k + g.sum())
        below = np.r_[sp[1:], sp[-1] - 1.0][last]  # the next lower score
        cuts = (sp[last] + below) / 2
        best = np.flatnonzero(np.isclose(f1, f1.max()))
        out[j] = cuts[best[np.argmin(np.abs(cuts[best] - 0.5))]]
    return np.clip(out, 0.0, 1.0)


CHANCE = 0.05  # |MCC|, |Pearson r| or micro F1 below this: chance level; an MCC at -CHANCE or lower: below it
WEAK = 0.1  # an MCC below this, with an accuracy under the majority class's share: no better than that class
MIN_EXAMPLES = 10  # fewer labelled inputs tell nothing either way


def learned_nothing(problem: str, metrics: dict) -> str | None:
    """What in a classify head's metrics says it learned nothing (see `Judging.learned_nothing`)."""
    if problem == "regression":
        r = metrics.get("pearson")
        if r is not None and (not np.isfinite(r) or abs(r) < CHANCE):
            return f"its predictions do not follow the targets (Pearson r {r:.2f})"
        return None
    if problem == "multi_label":
        f1 = metrics.get("micro_f1")
        return f"it gets none of the labels right (micro F1 {f1:.2f})" if f1 is not None and f1 < CHANCE else None
    confusion = metrics.get("confusion")
    if not confusion or metrics.get("examples", 0) < MIN_EXAMPLES:
        return None
    matrix = np.asarray(confusion["matrix"])
    if (matrix.sum(1) > 0).sum() < 2:
        return None  # one gold class: nothing to tell apart
    predicted = matrix.sum(0)
    if (predicted > 0).sum() == 1:
        label = confusion["labels"][int(predicted.argmax())]
        return f"it predicts {label!r} for every input (MCC {metrics['mcc']:.2f})"
    mcc = metrics["mcc"]
    accuracy, gold = np.trace(matrix) / matrix.sum(), matrix.sum(1)
    majority = gold.max() / matrix.sum()
    if accuracy < majority and mcc < WEAK:  # (a model with a real MCC may trade accuracy for the rare classes)
        label = confusion["labels"][int(gold.argmax())]
        return (f"it does worse than always answering {label!r} (accuracy {accuracy:.3f} against {majority:.3f}, "
                f"MCC {mcc:.2f})")
    if mcc <= -CHANCE:
        return f"its predictions are worse than chance (MCC {mcc:.2f})"
    if abs(mcc) < CHANCE:
        return f"its predictions are no better than chance (MCC {mcc:.2f})"
    return None
