"""What a qa head's score means once calibrated: a question's candidates are its n best spans
and, when it may answer nothing, the null answer (its score less the null threshold, so the
top candidate is the decision the threshold makes); a softmax over them, divided by the
temperature, gives the probability that the answer given is right. A SQuAD v2 head's null
answers are calibrated apart (`NullScaled`): how far the null score passed the best span says
little of whether the question really has no answer, so a logistic of that margin (fitted on
dev) gives a null answer's probability, and the temperature is fitted on the answered ones."""

from __future__ import annotations

import numpy as np

from bertheads.tasks.calibration import (
    confidence_pairs,
    ece,
    fit_logistic,
    fit_temperature,
    logistic,
    probabilities,
)
from bertheads.tasks.qa.formats import QAExample
from bertheads.tasks.qa.metrics import exact, max_over
from bertheads.tasks.qa.spans import QAOutput, answers_nothing


def candidates(o: QAOutput, n_best: int, threshold: float | None, with_null: bool) -> np.ndarray:
    """The question's candidate logits: its n best span scores, then the null answer's (with
    `with_null`, or when no span was found)."""
    scores = [float(x) for x in o.scores[:n_best]]
    if with_null or not scores:
        scores.append(o.null_score - (threshold or 0.0))
    return np.asarray(scores, dtype=np.float64)


def answer_probability(o: QAOutput, n_best: int, threshold: float | None, with_null: bool, temperature: float,
                       nothing: bool, null_scaling=None) -> float:
    """The calibrated probability of the answer given: the null answer's when it answers nothing
    (with `null_scaling`, the logistic of its margin over the best span)."""
    row = candidates(o, n_best, threshold, with_null)
    if nothing and null_scaling and len(row) > 1:
        return float(logistic(row[-1] - row[:-1].max(), null_scaling))
    p = probabilities(row[None, :], temperature)[0]
    return float(p[-1] if nothing and (with_null or not len(o.scores)) else p[0])


def shown_score(o: QAOutput, nothing: bool, n_best: int, threshold: float | None, with_null: bool,
                temperature: float | None, null_scaling=None) -> float | None:
    """The score a prediction shows: with a `temperature`, the calibrated probability that the
    answer is right (`answer_probability`); without, P(start) * P(end) in its window (the
    null answer's when it answers nothing), as the transformers pipeline reports it."""
    if temperature is None:
        return o.null_probability if nothing else None if o.probabilities is None else float(o.probabilities[0])
    return answer_probability(o, n_best, threshold, with_null, temperature, nothing, null_scaling)


def answer_scores(task, outputs: list[QAOutput], threshold: float | None) -> list:
    """Each question's shown score (`shown_score`, rounded) under `threshold`, calibrated when
    the head has a temperature in use."""
    spec = task.spec
    calibrated = bool(spec.temperature or spec.null_scaling) and spec.calibrate
    temperature, null_scaling = NullScaled().in_use(task) if calibrated else (None, None)
    with_null = bool(spec.unanswerable) or threshold is not None
    return [None if (v := shown_score(o, answers_nothing(o, threshold), spec.n_best, threshold, with_null,
                                      temperature, null_scaling)) is None else round(float(v), 6) for o in outputs]


def calibration_rows(outputs: list[QAOutput], examples: list[QAExample], n_best: int, threshold: float | None,
                     with_null: bool) -> tuple[np.ndarray, np.ndarray]:
    """One row per question: its candidates (`-inf` pads) and the first that is right (a span
    whose text is exactly a gold answer, SQuAD-normalised, or the null answer for a question
    without one); -1 when none is."""
    rows = [candidates(o, n_best, threshold, with_null) for o in outputs]
    logits = np.full((len(rows), max((len(r) for r in rows), default=1)), -np.inf)
    gold = np.full(len(rows), -1, dtype=int)
    for i, (row, o, e) in enumerate(zip(rows, outputs, examples)):
        logits[i, : len(row)] = row
        spans = min(len(o.scores), n_best)
        if not e.answers:
            gold[i] = len(row) - 1 if spans < len(row) else -1
            continue
        right = [j for j in range(spans) if max_over(exact, e.context[int(o.spans[j][0]):int(o.spans[j][1])],
                                                     e.answers)]
        gold[i] = right[0] if right else -1
    return logits, gold


def null_margins(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of candidates (the null answer last): whether the null answer is the decision,
    and its margin over the best span (0 where the row has no span)."""
    finite = np.isfinite(logits)
    last = finite.sum(1) - 1
    rows = np.arange(len(logits))
    null = np.where(last >= 0, logits[rows, np.maximum(last, 0)], -np.inf)
    spans = np.where(finite & (np.arange(logits.shape[1])[None, :] < last[:, None]), logits, -np.inf)
    best = spans.max(1) if logits.shape[1] else np.full(len(logits), -np.inf)
    has_span = np.isfinite(best)
    decided = has_span & (null >= best)
    return decided, np.where(has_span, null - np.where(has_span, best, 0.0), 0.0)


class NullScaled:
    """The calibrator of a head that may answer nothing (`calibration.cross_fitted`'s protocol):
    params (temperature, null scaling); the temperature fitted on the questions answered with a
    span, the logistic on the null answers' margins (`null_margins`). The decisions never move."""

    def fit(self, logits: np.ndarray, gold: np.ndarray):
        nulls, margin = null_margins(logits)
        right = logits.argmax(-1) == gold
        t = fit_temperature(logits[~nulls], gold[~nulls]) if (~nulls).any() else None
        scaling = fit_logistic(margin[nulls], right[nulls]) if nulls.sum() >= 2 else None
        return None if t is None and scaling is None else (t, scaling)

    def pairs(self, logits: np.ndarray, gold: np.ndarray, params) -> tuple[np.ndarray, np.ndarray]:
        t, scaling = params or (None, None)
        conf, right = confidence_pairs(logits, gold, t or 1.0)
        if scaling:
            nulls, margin = null_margins(logits)
            conf = np.where(nulls, logistic(margin, scaling), conf)
        return conf, right

    def measure(self, logits: np.ndarray, gold: np.ndarray, params) -> dict:
        """ECE and Brier of the decisions' confidence (Brier: its squared distance to right or wrong)."""
        conf, right = self.pairs(logits, gold, params)
        return {"ece": round(ece(conf, right), 6), "brier": round(float(((conf - right) ** 2).mean()), 6),
                "accuracy": round(float(right.mean()), 6), "mean_confidence": round(float(conf.mean()), 6)}

    def named(self, params) -> dict:
        if params is None:  # nothing fitted (`fitted` would describe a fit)
            return {"temperature": None, "null_scaling": None, "brier_of": "the decision's confidence"}
        t, scaling = params
        spans = "no answered question to fit a temperature on" if t is None else f"temperature {t:.4f} on the answered questions"
        nulls = ("null answers at the temperature" if scaling is None else
                 f"a null answer's probability sigmoid({scaling[0]:.4f} x its margin over the best span {scaling[1]:+.4f})")
        return {"temperature": t, "null_scaling": None if scaling is None else list(scaling),
                "fitted": f"{spans}; {nulls}", "brier_of": "the decision's confidence"}

    def halves(self, fitted: list) -> dict:
        return {"half_temperatures": [t for t, _ in fitted], "half_null_scalings": [s for _, s in fitted]}

    def keep(self, spec, named: dict) -> None:
        spec.temperature, spec.null_scaling = named.get("temperature"), named.get("null_scaling")

    def in_use(self, task):
        scaling = task.spec.null_scaling if task.spec.calibrate else None
        return task.scoring.temperature(), None if scaling is None else tuple(scaling)

