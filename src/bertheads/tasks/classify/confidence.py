"""What a classify head's scores are judged on: its decisions (one per input, or one per input
and label for multi-label) and the confidence `--min-confidence` compares."""

from __future__ import annotations

import numpy as np


def decision_rows(logits: np.ndarray, gold: list, problem: str) -> tuple[np.ndarray, np.ndarray] | None:
    """Single-label: the logits and the gold label; multi-label: one row per input and label,
    [0, logit] (its sigmoid as a softmax) and whether the label applies; regression: none."""
    if problem == "regression" or not len(logits):
        return None
    if problem == "multi_label":
        flat = logits.reshape(-1)
        return np.stack([np.zeros_like(flat), flat], axis=1), (np.asarray(gold).reshape(-1) >= 0.5).astype(int)
    return logits, np.asarray(gold, dtype=int)


def top_confidence(prediction: dict, problem: str) -> float | None:
    """Single-label: the top score; multi-label: the least sure label's max(p, 1 - p);
    regression: none."""
    scores = prediction.get("scores")
    if not scores:
        return None
    if problem == "multi_label":
        return min(max(p, 1.0 - p) for p in scores.values())
    return max(scores.values())
