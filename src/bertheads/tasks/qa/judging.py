"""Decoding answer spans from a question's windows, and the SQuAD metrics (`spans.py`, `metrics.py`)."""

from __future__ import annotations

import numpy as np

from bertheads.tasks.calibration import Temperature
from bertheads.tasks.parts import Disputes, Judging, Scoring
from bertheads.tasks.qa.confidence import NullScaled, answer_scores, calibration_rows
from bertheads.tasks.qa.formats import QAExample
from bertheads.tasks.qa.metrics import (
    answered_none,
    best_threshold,
    exact,
    f1_v1,
    f1_v2,
    gold_v2,
    max_over,
    normalize_answer,
    scores_from_parts,
    squad_v1_scores,
    squad_v2_scores,
)
from bertheads.tasks.qa.predictions import write_predictions
from bertheads.tasks.qa.spans import (
    QAOutput,
    answers_nothing,
    best_spans,
    merge_windows,
    null_minus_best,
    paragraph_match_gaps,
    span_context,
    window_choice_parts,
)


class QAJudging(Judging):
    """A qa head's decoding and metrics: each question's best span over all its windows (or no
    answer, past the null threshold), the SQuAD v1.1 and v2.0 scores."""

    main_metric = "f1"
    metric_scale = 100.0  # SQuAD's EM and F1 are percentages

    def learned_nothing(self, metrics: dict) -> str | None:  # `metrics.py`
        return answered_none(metrics)

    def collect(self, feature_outputs: list[np.ndarray], owner: list[int], examples: list[QAExample],
                features: list[dict]) -> list[QAOutput]:
        """Each question's n best spans over all its windows, and its null score (see
        `spec.window_choice` for how spans of different windows compare; with
        `spec.paragraph_match`, a span in a paragraph that matches the question's words worse
        than the best paragraph does loses that weight times the gap)."""
        spec = self.spec
        relative, by_context = window_choice_parts(spec.window_choice)
        per_example: list[list[tuple]] = [[] for _ in examples]
        owners = np.asarray(owner, dtype=np.int64)
        change = owners[1:] != owners[:-1]  # an example's windows are consecutive
        first, last = np.r_[True, change], np.r_[change, True]
        gaps = paragraph_match_gaps(features, owner) * spec.paragraph_match if spec.paragraph_match else None
        chunk = 1024
        for lo in range(0, len(features), chunk):
            part = range(lo, min(lo + chunk, len(features)))
            ctx = np.array([features[i]["_context"] for i in part], dtype=np.int64)
            scores, starts, ends, null, norm = best_spans([feature_outputs[i] for i in part], ctx,
                                                          spec.n_best, spec.max_answer_length, with_norm=True)
            probs = np.exp(scores - norm[:, None])  # before the scores are made relative or weighed
            null_probs = np.exp(null - norm)
            if relative:
                scores = scores - null[:, None]
            if gaps is not None:
                scores = scores + gaps[lo: lo + len(part), None]
            room = span_context(starts, ends, ctx, first[part.start:part.stop], last[part.start:part.stop])
            for j, i in enumerate(part):
                offsets = features[i]["_offsets"]
                # (a window shorter than the batch's longest has fewer spans than n_best: the rest
                # score -inf and may point past its tokens, so they are looked up clipped, then dropped)
                at_start, at_end = np.minimum(starts[j], len(offsets) - 1), np.minimum(ends[j], len(offsets) - 1)
                keep = np.isfinite(scores[j]) & (offsets[at_end, 1] > offsets[at_start, 0])  # no empty text
                chars = np.stack([offsets[starts[j][keep], 0], offsets[ends[j][keep], 1]], axis=1)
                per_example[owner[i]].append((scores[j][keep], chars, float(null[j]),
                                              room[j][keep] if by_context else None, probs[j][keep],
                                              float(null_probs[j])))
        return [merge_windows(parts, spec.n_best, relative) for parts in per_example]

    def threshold(self) -> float | None:
        """The null threshold in use (a call's `null_threshold` overrides the saved one)."""
        return None if self.spec.null_threshold is None else float(self.spec.null_threshold)

    def decode(self, outputs: list[QAOutput], examples: list[QAExample]) -> list[dict]:
        """`{"answer", "start", "end", "score", "raw_score"}`, `context[start:end] == answer` ("" at 0
        when it answers nothing): `score` as `confidence.shown_score` says, `raw_score` what spans
        are ranked and thresholded by (start + end logits, relative to the window's null score
        with `window_choice` relative). `min_confidence` adds `"abstained"`."""
        threshold = self.threshold()
        min_confidence = self.task.options.values.min_confidence
        out = []
        for o, e, score in zip(outputs, examples, answer_scores(self.task, outputs, threshold)):
            nothing = answers_nothing(o, threshold)
            s, t = (0, 0) if nothing else (int(x) for x in o.spans[0])
            pred = self.task.scoring.abstain({"answer": e.context[s:t], "start": s, "end": t, "score": score,
                                 "raw_score": round(o.null_score if nothing else float(o.scores[0]), 4)},
                                score, min_confidence)
            out.append({**({"id": e.id} if e.has_id else {}), **e.extra, **pred})
        return out

    def metrics(self, outputs: list[QAOutput], examples: list[QAExample], path=None,
                during_training: bool = False) -> dict:
        """SQuAD EM and F1 (v2.0's with HasAns/NoAns when some questions have no answer).
        After an epoch (`during_training`) a v2.0 model's null threshold is tuned here."""
        spec = self.spec
        best_text = [e.context[int(o.spans[0][0]):int(o.spans[0][1])] if len(o.scores) else ""
                     for o, e in zip(outputs, examples)]
        if during_training and spec.unanswerable and spec.tune_threshold:
            diffs = np.array([null_minus_best(o) for o in outputs])
            has_answer = np.array([bool(e.answers) for e in examples])
            span_f1 = np.array([max_over(f1_v2, t, gold_v2(e.answers)) if e.answers else 0.0
                                for t, e in zip(best_text, examples)])
            spec.null_threshold = best_threshold(diffs, has_answer, span_f1)
        threshold = self.threshold()
        preds = ["" if answers_nothing(o, threshold) else text for o, text in zip(outputs, best_text)]
        if any(not e.answers for e in examples):
            result = squad_v2_scores(preds, examples)
        else:
            result = squad_v1_scores(preds, examples)
        if spec.unanswerable or threshold is not None:
            result["null_threshold"] = None if threshold is None else round(float(threshold), 4)
        predictions_out = self.task.options.values.predictions_out
        if predictions_out:
            write_predictions(predictions_out, preds, outputs, examples, path)
        return result

    def metric_part(self, outputs: list[QAOutput], examples: list[QAExample], path=None):
        """A chunk's per-question scores (v1.1 and v2.0 forms: which one applies is known only at
        the end) under the saved or given null threshold. With `predictions_out` every output
        and example is kept, as the prediction files hold them all."""
        if self.task.options.values.predictions_out:
            return super().metric_part(outputs, examples)
        threshold = self.threshold()
        preds = ["" if answers_nothing(o, threshold) else e.context[int(o.spans[0][0]):int(o.spans[0][1])]
                 for o, e in zip(outputs, examples)]
        has = np.array([bool(e.answers) for e in examples], dtype=bool)
        v1 = np.array([(max_over(exact, p, e.answers), max_over(f1_v1, p, e.answers)) if e.answers else (0.0, 0.0)
                       for p, e in zip(preds, examples)]).reshape(-1, 2)
        v2 = np.array([(max_over(exact, p, gold_v2(e.answers)), max_over(f1_v2, p, gold_v2(e.answers)))
                       for p, e in zip(preds, examples)]).reshape(-1, 2)
        return has, v1, v2

    def metrics_from_parts(self, parts: list, path=None, during_training: bool = False) -> dict:
        if self.task.options.values.predictions_out:
            return super().metrics_from_parts(parts, path, during_training)
        result = scores_from_parts(parts)
        threshold = self.threshold()
        if self.spec.unanswerable or threshold is not None:
            result["null_threshold"] = None if threshold is None else round(float(threshold), 4)
        return result


class QAScoring(Scoring):
    """What a qa head's scores mean: its answers' confidence, calibrated apart for null
    answers (`confidence.py`), the answers it disputes (audit) and how unsure it is (select)."""

    def input_confidence(self, outputs: list[QAOutput], examples: list[QAExample]) -> np.ndarray:
        """A question's shown score, as `--min-confidence` compares it (0 where there is none)."""
        return np.array([0.0 if s is None else s for s in answer_scores(self.task, outputs, self.task.judging.threshold())])

    def calibration_rows(self, outputs: list[QAOutput], examples: list[QAExample], path=None):  # `confidence.py`
        t = self.task.judging.threshold()
        return calibration_rows(outputs, examples, self.spec.n_best, t, bool(self.spec.unanswerable) or t is not None)

    def calibrator(self):  # `confidence.py`: a head that may answer nothing calibrates null answers apart
        return NullScaled() if self.spec.unanswerable or self.task.judging.threshold() is not None else Temperature()

    def disputes(self, outputs: list[QAOutput], examples: list[QAExample], path=None) -> Disputes:
        """Gold answers against out-of-fold spans (`question_disputes`; `uncertainty`: `answer_shares`)."""
        return question_disputes(outputs, examples, self.task.judging.threshold())

    def uncertainty(self, outputs: list[QAOutput]) -> list[np.ndarray]:
        return [answer_shares(o)[None] for o in outputs]



def answer_shares(o: QAOutput) -> np.ndarray:
    """A question's n best spans' probabilities and no answer's (last), as shares of their sum."""
    probs = o.probabilities if o.probabilities is not None else np.exp(o.scores - np.max(o.scores, initial=0))
    row = np.append(np.asarray(probs, dtype=float), float(o.null_probability or 0.0))
    return row / row.sum() if row.sum() > 0 else np.full(len(row), 1 / len(row))


def question_disputes(outputs: list[QAOutput], examples: list[QAExample], threshold) -> Disputes:
    """The score of a question is the share of the probability (its n best spans and no answer,
    P(start) * P(end) each) on spans whose text is a gold answer (on no answer, for an
    unanswerable question); it is flagged when the model's own answer is none of the gold ones."""
    units, given, suggested, scores, flagged = [], [], [], [], []
    for k, (o, e) in enumerate(zip(outputs, examples)):
        gold = {normalize_answer(a) for a in e.answers}
        shares = answer_shares(o)
        texts = [e.context[int(a):int(b)] for a, b in o.spans]
        on_gold = sum(float(p) for p, t in zip(shares, texts) if normalize_answer(t) in gold) if gold else shares[-1]
        best = "" if answers_nothing(o, threshold) or not texts else texts[0]
        units.append({"example": k, "id": e.id, "question": e.question, "record": e.record,
                      "gold_answers": list(e.answers)})
        given.append(e.answers[0] if e.answers else "")
        suggested.append(best)
        scores.append(float(on_gold))
        flagged.append((normalize_answer(best) not in gold) if gold else best != "")
    return Disputes(units, given, [], None, scores=np.asarray(scores), suggested=suggested,
                    flagged=np.asarray(flagged, dtype=bool), unit="question")
