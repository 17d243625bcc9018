"""What a qa head writes beside its metrics: the answers by id (the official scripts' input) and
the n best spans of each question with their scores and probabilities."""

from __future__ import annotations

import json

from bertheads.store.atomic import atomic_write_text
from bertheads.store.guard import check_target
from bertheads.tasks.qa.formats import QAExample
from bertheads.tasks.qa.spans import QAOutput


def probability(value) -> float | None:
    return None if value is None else round(float(value), 6)


def write_predictions(path: str, preds: list[str], outputs: list[QAOutput], examples: list[QAExample],
                      data=None) -> None:
    """`{id: answer}` (what the official scripts read), and beside it `NAME.nbest.json`:
    `{id: [{"text", "start", "end", "score", "probability"}, ...]}` with the null score
    (neither over the labelled file `data` nor into a model folder)."""
    target = check_target(path, inputs=[data], flag="predictions_out")
    check_target(target.with_name(target.stem + ".nbest.json"), inputs=[data], flag="predictions_out")
    answers = {e.id: p for e, p in zip(examples, preds)}
    atomic_write_text(target, json.dumps(answers, ensure_ascii=False, indent=1) + "\n")
    nbest = {e.id: {"null_score": round(o.null_score, 4),
                    "spans": [{"text": e.context[int(s):int(t)], "start": int(s), "end": int(t),
                               "score": round(float(v), 4),
                               **({} if o.probabilities is None else {"probability": probability(p)})}
                              for v, p, (s, t) in zip(o.scores, o.probabilities if o.probabilities is not None
                                                      else o.scores, o.spans)]}
             for o, e in zip(outputs, examples)}
    atomic_write_text(target.with_name(target.stem + ".nbest.json"), json.dumps(nbest, ensure_ascii=False) + "\n")
