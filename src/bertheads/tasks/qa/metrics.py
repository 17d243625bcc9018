"""SQuAD v1.1 and v2.0 scores with the official evaluation scripts' formulas (answer
normalisation, EM, F1, the HasAns/NoAns breakdown) and the v2.0 null-threshold search."""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from bertheads.tasks.qa.formats import QAExample

PUNCTUATION = set(string.punctuation)
ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text: str) -> str:
    """Lowercase, drop punctuation, the articles a/an/the and extra whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in PUNCTUATION)
    return " ".join(ARTICLES.sub(" ", text).split())


def exact(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1_v1(prediction: str, gold: str) -> float:
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def f1_v2(prediction: str, gold: str) -> float:
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred or not ref:  # a no-answer is right only against a no-answer
        return float(pred == ref)
    return f1_v1(prediction, gold)


def gold_v2(answers: list[str]) -> list[str]:
    """v2.0's gold answers: those that do not normalize to nothing, or [""] for none."""
    return [a for a in answers if normalize_answer(a)] or [""]


def max_over(metric, prediction: str, golds: list[str]) -> float:
    return max(metric(prediction, g) for g in golds)


def squad_v1_scores(preds: list[str], examples: list[QAExample]) -> dict:
    """SQuAD v1.1: EM and F1 in percent, the maximum over each question's gold answers."""
    em = [max_over(exact, p, e.answers) for p, e in zip(preds, examples)]
    f1 = [max_over(f1_v1, p, e.answers) for p, e in zip(preds, examples)]
    return {"exact_match": 100.0 * float(np.mean(em)), "f1": 100.0 * float(np.mean(f1)),
            "examples": len(examples)}


def squad_v2_scores(preds: list[str], examples: list[QAExample]) -> dict:
    """SQuAD v2.0: EM and F1 in percent, overall and for questions with (HasAns) and
    without (NoAns) an answer."""
    em = np.array([max_over(exact, p, gold_v2(e.answers)) for p, e in zip(preds, examples)])
    f1 = np.array([max_over(f1_v2, p, gold_v2(e.answers)) for p, e in zip(preds, examples)])
    has = np.array([bool(e.answers) for e in examples])
    out = {"exact_match": 100.0 * float(em.mean()), "f1": 100.0 * float(f1.mean()), "examples": len(examples)}
    for name, mask in (("HasAns", has), ("NoAns", ~has)):
        if mask.any():
            out[f"{name}_exact"] = 100.0 * float(em[mask].mean())
            out[f"{name}_f1"] = 100.0 * float(f1[mask].mean())
            out[f"{name}_total"] = int(mask.sum())
    return out


def best_threshold(diffs: np.ndarray, has_answer: np.ndarray, span_f1: np.ndarray) -> float:
    """The null threshold with the best dev F1: a question is answered when its null - best
    span score is at most the threshold. Starting from "answer nothing", answering a question
    gains its span's F1 if it has an answer and loses 1 if it has none."""
    order = np.argsort(diffs, kind="stable")
    d = diffs[order]
    gain = np.cumsum(np.where(has_answer, span_f1, -1.0)[order])
    realisable = np.r_[d[1:] != d[:-1], True] & np.isfinite(d)  # ties move together
    if not realisable.any():
        return 0.0
    gain = np.where(realisable, gain, -np.inf)
    i = int(np.argmax(gain))
    if gain[i] <= 0:  # answering nothing is best
        return float(d[0] - 1.0) if np.isfinite(d[0]) else 0.0
    following = d[i + 1:][np.isfinite(d[i + 1:])]
    return float((d[i] + following[0]) / 2) if len(following) else float(d[i] + 1.0)


def scores_from_parts(parts: list) -> dict:
    """SQuAD EM and F1 over a streamed evaluation's chunks, each (has an answer, v1.1 scores,
    v2.0 scores) per question: v1.1's when every question has an answer, else v2.0's with the
    HasAns/NoAns breakdown."""
    has = np.concatenate([p[0] for p in parts])
    scores = np.concatenate([p[1] if has.all() else p[2] for p in parts])
    result = {"exact_match": 100.0 * float(scores[:, 0].mean()), "f1": 100.0 * float(scores[:, 1].mean()),
              "examples": len(has)}
    if not has.all():
        for name, mask in (("HasAns", has), ("NoAns", ~has)):
            if mask.any():
                result[f"{name}_exact"] = 100.0 * float(scores[mask, 0].mean())
                result[f"{name}_f1"] = 100.0 * float(scores[mask, 1].mean())
                result[f"{name}_total"] = int(mask.sum())
    return result


def answered_none(metrics: dict) -> str | None:
    """`Judging.learned_nothing` for qa: no answer right on the questions that have one (it
    always abstains, or its spans miss)."""
    answerable, f1 = metrics.get("HasAns_total", metrics.get("examples", 0)), metrics.get("HasAns_f1", metrics.get("f1"))
    return None if f1 is None or answerable < 10 or f1 >= 1.0 else (
        f"it gets none of the {answerable} questions that have an answer right (F1 {f1:.1f}: it abstains or its spans miss)")
