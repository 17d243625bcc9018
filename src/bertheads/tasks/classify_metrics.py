"""Classification metrics: accuracy, F1, MCC with per-class figures and the confusion matrix
(single-label), Pearson/Spearman (regression), micro/macro F1 with per-label figures and the
per-label thresholds tuned for F1 (multi-label)."""

from __future__ import annotations

import numpy as np


def label_metrics(pred: np.ndarray, gold: np.ndarray, num_labels: int, names: list[str] | None = None) -> dict:
    """Accuracy, F1 (binary, or macro over the classes), MCC, per-class precision, recall, F1
    and support, and the confusion matrix (rows: gold class, columns: predicted class)."""
    from sklearn.metrics import accuracy_score, confusion_matrix, f1_score, matthews_corrcoef

    average = "binary" if num_labels == 2 else "macro"
    labels = list(range(num_labels))
    names = names or [str(i) for i in labels]
    return {
        "accuracy": float(accuracy_score(gold, pred)),
        "f1": float(f1_score(gold, pred, average=average, labels=labels if average == "macro" else None,
                             zero_division=0)),
        "mcc": float(matthews_corrcoef(gold, pred)),
        "examples": int(len(gold)),
        "per_class": per_class(pred[:, None] == np.arange(num_labels), gold[:, None] == np.arange(num_labels), names),
        "confusion": {"labels": names, "matrix": confusion_matrix(gold, pred, labels=labels).tolist()},
    }


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
    from sklearn.metrics import f1_score

    names = names or [str(i) for i in range(gold.shape[1])]
    return {
        "micro_f1": float(f1_score(gold, pred, average="micro", zero_division=0)),
        "macro_f1": float(f1_score(gold, pred, average="macro", zero_division=0)),
        "subset_accuracy": float(np.mean(np.all(pred == gold, axis=1))),
        "examples": int(len(gold)),
        "per_label": per_class(pred.astype(bool), gold.astype(bool), names),
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
