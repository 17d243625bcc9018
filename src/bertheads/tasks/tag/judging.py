"""Decoding tag outputs into words, tags and entities, and their metrics (`scheme.py`)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from bertheads.base.errors import UserError, where
from bertheads.tasks.base import softmax
from bertheads.tasks.parts import Disputes, Judging, Scoring
from bertheads.tasks.tag.formats import TagExample, separator
from bertheads.tasks.tag.scheme import (
    entity_counts,
    entity_errors,
    entity_metrics,
    entity_spans,
    scheme_codes,
)


@dataclass
class WordScores:
    """What `collect` returns for one example: tag probabilities per word (and, for raw
    text, each word's character span)."""

    probs: np.ndarray  # (words, tags)
    spans: np.ndarray | None = None  # (words, 2) start, end offsets in the text


MIN_ENTITIES = 5  # entities of a type below which missing them all tells nothing


class TagJudging(Judging):
    """A tag head's decoding and metrics: one tag per word from the window where its first piece
    has the most context, entities by the scheme's rules, seqeval's entity scores."""

    main_metric = "f1"

    def learned_nothing(self, metrics: dict) -> str | None:
        """No entity found at all, or none of a type the data has at least `MIN_ENTITIES` of."""
        kinds = {t: m for t, m in (metrics.get("per_type") or {}).items() if m.get("support", 0) >= MIN_ENTITIES}
        missed = sorted(t for t, m in kinds.items() if m.get("recall", 0) == 0)
        if kinds and len(missed) == len(kinds):
            return f"it finds none of the entities (F1 {metrics.get('f1', 0):.2f})"
        counts = ", ".join(f"{kinds[t]['support']} {t}" for t in missed)
        return f"it never finds {' or '.join(missed)} entities (recall 0 on {counts})" if missed else None

    def collect(self, feature_outputs: list[np.ndarray], owner: list[int], examples, features) -> list[WordScores]:
        """One row of tag scores per word: from the example's only window, or from the window
        where the word's first piece has the most context."""
        rows, spans = self.word_rows(feature_outputs, owner, examples, features)
        t = self.task.scoring.temperature()  # the calibrated scores (the argmax, so every tag, is the same)
        probs = softmax(np.concatenate(rows).astype(np.float32) / np.float32(t)) if rows else np.zeros((0, len(self.spec.tags)))
        parts = np.split(probs, np.cumsum([len(r) for r in rows])[:-1])
        return [WordScores(p, s) for p, s in zip(parts, spans)]

    def word_rows(self, feature_outputs: list[np.ndarray], owner: list[int], examples, features
                  ) -> tuple[list[np.ndarray], list]:
        """Each example's raw tag logits per word (its first piece's, from the window where it
        has the most context) and, for raw text, its words' character spans."""
        groups: list[list[int]] = [[] for _ in examples]
        for i, k in enumerate(owner):
            groups[k].append(i)
        rows, spans = [], []
        for k, idx in enumerate(groups):
            if not idx:
                raise ValueError(f"example {k} has no encoded window")
            head = features[idx[0]]
            n_words = head["_n_words"]
            if len(idx) == 1:
                chosen = feature_outputs[idx[0]][head["_pos"]]
            else:
                chosen = np.zeros((n_words, feature_outputs[idx[0]].shape[-1]), dtype=np.float32)
                best = np.full(n_words, -1, dtype=np.int64)
                for i in idx:
                    f = features[i]
                    better = f["_ctx"] > best[f["_word"]]
                    chosen[f["_word"][better]] = feature_outputs[i][f["_pos"][better]]
                    best[f["_word"][better]] = f["_ctx"][better]
                if (best < 0).any():
                    raise ValueError(f"example {k}: {int((best < 0).sum())} words got no prediction")
            if len(chosen) != n_words:
                raise ValueError(f"example {k}: {len(chosen)} predictions for {n_words} words")
            rows.append(chosen)
            spans.append(head.get("_spans"))
        return rows, spans

    def predicted_tags(self, outputs: list[WordScores]) -> list[list[str]]:
        return [[self.spec.tags[i] for i in o.probs.argmax(-1).tolist()] for o in outputs]

    def decode(self, outputs: list[WordScores], examples: list[TagExample]) -> list[dict]:
        """Entities (with character offsets for raw text, word indices for word input); an
        entity's score is its words' mean top tag score (calibrated). `min_confidence` adds
        `"abstained"`: whether some word's top score is below it."""
        codes, types = scheme_codes(self.spec.tags)
        min_confidence = self.task.options.values.min_confidence
        results = []
        for out, e in zip(outputs, examples):
            best = out.probs.argmax(-1).tolist()
            top = out.probs.max(-1) if len(out.probs) else np.zeros(0)
            found = entity_spans([codes[i] for i in best], [types[i] for i in best])
            entities = []
            for kind, a, b in found:
                score = round(float(top[a:b].mean()), 4)
                if e.text is not None:
                    start, end = int(out.spans[a, 0]), int(out.spans[b - 1, 1])
                    entities.append({"text": e.text[start:end], "type": kind, "start": start, "end": end,
                                     "score": score})
                else:
                    entities.append({"text": " ".join(e.words[a:b]), "type": kind, "start_token": a,
                                     "end_token": b, "score": score})
            result = ({"entities": entities} if e.text is not None else
                      {"tokens": e.words, "tags": [self.spec.tags[i] for i in best], "entities": entities})
            result = self.task.scoring.abstain(result, float(top.min()) if len(top) else None, min_confidence)
            results.append({**e.extra, **result} if e.extra else result)
        return results

    def metrics(self, outputs: list[WordScores], examples: list[TagExample], path=None,
                during_training: bool = False) -> dict:
        """Entity precision, recall and F1 (micro and per type) by seqeval's default mode (conlleval
        rules), word accuracy, and the span and type errors (`scheme.entity_errors`)."""
        return self.metrics_from_parts([self.metric_part(outputs, examples, path)])

    def metrics_from_parts(self, parts: list, path=None, during_training: bool = False) -> dict:
        gold, pred = [t for p in parts for t in p[0]], [t for p in parts for t in p[1]]
        return {**entity_metrics(gold, pred), **entity_errors(gold, pred)}

    def metric_part(self, outputs: list[WordScores], examples: list[TagExample], path=None):
        """A chunk's gold and predicted tags (the tag names are shared strings: a pointer a word)."""
        known = {t: t for t in self.spec.tags}
        for e in examples:
            for j, tag in enumerate(e.tags or []):
                if tag not in known:
                    line = e.word_lines[j] if e.word_lines else e.line
                    raise UserError(f"{where(path, line)}: tag {tag!r} was not seen in training")
        return [[known[t] for t in e.tags or []] for e in examples], self.predicted_tags(outputs)

    def render(self, predictions: list[dict], examples: list[TagExample], fmt: str | None = None) -> str:
        """JSON lines, or for `--format conll` the input's lines with a predicted tag column."""
        if fmt != "conll":
            return "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in predictions)
        out = []
        for p, e in zip(predictions, examples):
            for line in e.docstart:
                out.append(f"{line}{separator(line)}O\n\n")
            rows = e.rows or e.words or []
            for row, tag in zip(rows, p.get("tags", [])):
                out.append(f"{row}{separator(row)}{tag}\n")
            out.append("\n")
        return "".join(out)


class TagScoring(Scoring):
    """What a tag head's scores mean: its words' decisions for calibration and confidence,
    the tags it disputes (audit), how unsure it is (select) and its entity counts."""

    def disputes(self, outputs: list[WordScores], examples: list[TagExample], path=None) -> Disputes:
        """Each word's given tag against its out-of-fold tag probabilities (`word_disputes`)."""
        return word_disputes(outputs, examples, list(self.spec.tags), path)

    def class_counts(self, examples: list[TagExample]) -> dict[str, int]:
        """Entities per type (by the scheme's rules; every type the tags name)."""
        return entity_counts([e.tags or [] for e in examples], self.spec.tags)

    def uncertainty(self, outputs: list[WordScores]) -> list[np.ndarray]:
        """Each word's tag probabilities."""
        return [o.probs for o in outputs]

    def input_confidence(self, outputs: list[WordScores], examples: list[TagExample]) -> np.ndarray:
        """A sentence's lowest word top score, as `--min-confidence` compares it (1: no words)."""
        return np.array([float(o.probs.max(-1).min()) if len(o.probs) else 1.0 for o in outputs])

    def calibration_rows(self, outputs: list[WordScores], examples: list[TagExample], path=None):
        """Per labelled word: its tag logits (up to a constant, from the scores in use), its gold tag."""
        index = {t: i for i, t in enumerate(self.spec.tags)}
        rows, gold = [], []
        for out, e in zip(outputs, examples):
            tags = e.tags or []
            if not tags or len(tags) != len(out.probs):
                continue
            rows.append(np.log(np.maximum(out.probs.astype(np.float64), 1e-30)) * self.task.scoring.temperature())
            gold.extend(index.get(t, -1) for t in tags)
        if not rows:
            return np.zeros((0, len(self.spec.tags))), np.zeros(0, dtype=int)
        return np.concatenate(rows), np.asarray(gold, dtype=int)



def word_disputes(outputs: list, examples: list, tags: list[str], path=None) -> Disputes:
    """Each word's given tag against its out-of-fold tag probabilities: the word, its line
    (CoNLL), its character offsets in the sentence (words joined by spaces), and the
    entity the given tags put it in and the one the model's tags would."""
    index = {t: i for i, t in enumerate(tags)}
    codes, types = scheme_codes(tags)
    units, labels, rows = [], [], []
    for k, (out, e) in enumerate(zip(outputs, examples)):
        words = e.words or []
        if len(words) != len(out.probs):
            raise ValueError(f"example {k}: {len(out.probs)} predictions for {len(words)} words")
        sentence = " ".join(words)
        starts = np.cumsum([0] + [len(w) + 1 for w in words])[:-1]
        given = [index[t] if t in index else -1 for t in e.tags or []]
        if -1 in given:
            j = given.index(-1)
            raise UserError(f"{where(path, e.word_lines[j] if e.word_lines else e.line)}: tag {e.tags[j]!r} "
                            f"was not seen in training")
        best = out.probs.argmax(-1).tolist()
        given_entities = entity_of(entity_spans([codes[i] for i in given], [types[i] for i in given]), len(words))
        best_entities = entity_of(entity_spans([codes[i] for i in best], [types[i] for i in best]), len(words))
        for j, word in enumerate(words):
            unit = {"example": k, "token": word, "word": j, "start": int(starts[j]),
                    "end": int(starts[j] + len(word)), "sentence": sentence,
                    "given_entity": shown_entity(given_entities[j], words, starts),
                    "suggested_entity": shown_entity(best_entities[j], words, starts)}
            if e.word_lines:
                unit["line"] = e.word_lines[j]
            units.append(unit)
        labels += given
        rows.append(out.probs)
    probs = np.concatenate(rows) if rows else np.zeros((0, len(tags)))
    return Disputes(units, labels, list(tags), probs, unit="token")


def entity_of(spans: list[tuple[str, int, int]], count: int) -> list[tuple[str, int, int] | None]:
    """For each of `count` words, the entity (type, first word, end word) it is part of, or None."""
    of: list[tuple[str, int, int] | None] = [None] * count
    for span in spans:
        for j in range(span[1], span[2]):
            of[j] = span
    return of


def shown_entity(span, words: list[str], starts) -> dict | None:
    """An entity as issues.jsonl shows it: its text, type and character offsets in the sentence."""
    if span is None:
        return None
    kind, a, b = span
    start = int(starts[a])
    end = int(starts[b - 1] + len(words[b - 1]))
    return {"text": " ".join(words[a:b]), "type": kind, "start": start, "end": end}
