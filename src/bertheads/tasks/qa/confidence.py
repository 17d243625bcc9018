"""What a qa head's score means once calibrated: a question's candidates are its n best spans
and, when it may answer nothing, the null answer (its score less the null threshold, so the
top candidate is the decision the threshold makes); a softmax over them, divided by the
temperature, gives the probability that the answer given is right."""

from __future__ import annotations

import numpy as np

from bertheads.tasks.calibration import probabilities
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
                       nothing: bool) -> float:
    """The calibrated probability of the answer given: the null answer's when it answers nothing."""
    row = probabilities(candidates(o, n_best, threshold, with_null)[None, :], temperature)[0]
    return float(row[-1] if nothing and (with_null or not len(o.scores)) else row[0])


def shown_score(o: QAOutput, nothing: bool, n_best: int, threshold: float | None, with_null: bool,
                temperature: float | None) -> float | None:
    """The score a prediction shows: with a `temperature`, the calibrated probability that the
    answer is right (`answer_probability`); without, P(start) * P(end) in its window (the
    null answer's when it answers nothing), as the transformers pipeline reports it."""
    if temperature is None:
        return o.null_probability if nothing else None if o.probabilities is None else float(o.probabilities[0])
    return answer_probability(o, n_best, threshold, with_null, temperature, nothing)


def answer_scores(task, outputs: list[QAOutput], threshold: float | None) -> list:
    """Each question's shown score (`shown_score`, rounded) under `threshold`, calibrated when
    the head has a temperature in use."""
    spec = task.spec
    temperature = task.temperature() if spec.temperature and spec.calibrate else None
    with_null = bool(spec.unanswerable) or threshold is not None
    return [None if (v := shown_score(o, answers_nothing(o, threshold), spec.n_best, threshold, with_null,
                                      temperature)) is None else round(float(v), 6) for o in outputs]


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
