"""Answer spans from the head's start and end scores: the n best spans of each window
(vectorized over windows and candidate pairs), and one question's spans merged across its
windows (`WINDOW_CHOICES` says how spans of different windows compare); in training, the shared
normalisation that makes those windows' scores comparable (`shared_window_loss`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

from bertheads.base.errors import UserError
from bertheads.base.schema import said

# How spans found in different windows of one passage compare: "raw" start + end scores;
# "relative": each span's score minus its own window's null ([CLS]) score; "+context": a span
# that overlapping windows both find is scored in the window where it has the most context.
# Apart from the choice, a passage of several paragraphs can weigh how well each paragraph's words
# match the question's (`paragraph_match_gaps`, QASpec.paragraph_match).
WINDOW_CHOICES = ("raw", "relative", "relative+context", "context")


@dataclass
class QAOutput:
    """A question's merged windows: the n best spans (descending) and the null score."""

    null_score: float
    scores: np.ndarray  # [n]
    spans: np.ndarray  # [n, 2] character start and end in the context
    probabilities: np.ndarray | None = None  # [n] P(start) * P(end) in the span's own window
    null_probability: float | None = None  # P(start) * P(end) of [CLS], the least over the windows


def best_spans(logits: list[np.ndarray], context: np.ndarray, n_best: int, max_answer_length: int,
               with_norm: bool = False):
    """The n best spans of each window, vectorized over windows and candidate pairs.

    `logits[w]` is `[T_w, 2]`, `context[w]` the first and last passage token. Spans start and
    end inside the passage, end >= start, at most `max_answer_length` tokens; a span's score is
    start + end logit. Returns scores `[W, n]` (-inf where fewer exist), start and end tokens
    `[W, n]`, and the null score `[W]` ([CLS] start + end). A window whose n best starts and
    ends make no valid pair gets its exact best span instead. `with_norm`: also each window's
    log normaliser `[W]`, the log-sum-exp of the start scores plus that of the end scores over
    its passage tokens and [CLS] (a span's probability, as the transformers pipeline gives it,
    is `exp(score - norm)`).
    """
    num = len(logits)
    width = max(len(x) for x in logits)
    start = np.full((num, width), -np.inf, dtype=np.float32)
    end = np.full((num, width), -np.inf, dtype=np.float32)
    for w, x in enumerate(logits):
        start[w, : len(x)], end[w, : len(x)] = x[:, 0], x[:, 1]
    null = start[:, 0] + end[:, 0]
    pos = np.arange(width)
    inside = (pos >= context[:, :1]) & (pos <= context[:, 1:])
    if with_norm:
        counted = inside | (pos == 0)[None, :]
        norm = log_sum_exp(np.where(counted, start, -np.inf)) + log_sum_exp(np.where(counted, end, -np.inf))
    start, end = np.where(inside, start, -np.inf), np.where(inside, end, -np.inf)
    k = min(n_best, width)
    top_start = np.argpartition(-start, k - 1, axis=1)[:, :k]
    top_end = np.argpartition(-end, k - 1, axis=1)[:, :k]
    pair = (np.take_along_axis(start, top_start, 1)[:, :, None]
            + np.take_along_axis(end, top_end, 1)[:, None, :])  # [W, k, k]
    length = top_end[:, None, :] - top_start[:, :, None] + 1
    pair = np.where((length >= 1) & (length <= max_answer_length), pair, -np.inf).reshape(num, k * k)
    n = min(n_best, k * k)
    best = np.argpartition(-pair, n - 1, axis=1)[:, :n]
    scores = np.take_along_axis(pair, best, 1)
    order = np.argsort(-scores, axis=1, kind="stable")
    best, scores = np.take_along_axis(best, order, 1), np.take_along_axis(scores, order, 1)
    starts = np.take_along_axis(top_start, best // k, 1)
    ends = np.take_along_axis(top_end, best % k, 1)
    for w in np.flatnonzero(~np.isfinite(scores[:, 0]) & inside.any(1)):  # rare: exact search
        scores[w], starts[w], ends[w] = -np.inf, 0, 0
        s, e, v = exact_best_span(start[w], end[w], max_answer_length)
        scores[w, 0], starts[w, 0], ends[w, 0] = v, s, e
    if with_norm:
        return scores, starts, ends, null, norm
    return scores, starts, ends, null


def log_sum_exp(x: np.ndarray) -> np.ndarray:
    """log(sum(exp(x))) of each row, in float64."""
    x = x.astype(np.float64)
    top = np.max(x, axis=1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    return (top + np.log(np.sum(np.exp(x - top), axis=1, keepdims=True)))[:, 0]


def exact_best_span(start: np.ndarray, end: np.ndarray, max_answer_length: int) -> tuple[int, int, float]:
    """The best valid span of one window over all start/end pairs (a band of width L)."""
    width = len(start)
    offsets = np.arange(max_answer_length)
    ends = np.arange(width)[:, None] + offsets[None, :]  # [T, L]
    ok = ends < width
    pair = start[:, None] + np.where(ok, end[np.minimum(ends, width - 1)], -np.inf)
    flat = int(np.argmax(pair))
    s, d = divmod(flat, max_answer_length)
    return s, s + d, float(pair[s, d])


def window_choice_parts(choice: str) -> tuple[bool, bool]:
    """(scores relative to the window's null score, duplicate spans from the most context)."""
    if choice not in WINDOW_CHOICES:
        raise UserError(f"{said('window_choice', choice)}: expected one of {', '.join(WINDOW_CHOICES)}")
    return "relative" in choice, "context" in choice


def paragraph_match_gaps(features: list[dict], owner: list[int]) -> np.ndarray:
    """Per window: how much worse its paragraph matches the question's words than the question's
    best-matching paragraph does, in [-1, 0]; 0 for every window of a one-paragraph passage.

    A paragraph's match is the idf-weighted share of the question's token types (ids, from the
    window's `_question` range: its first and last question token) found among its passage
    tokens, with the idf taken over the passage's paragraphs (BM25's `log(1 + (N - df + 0.5) / (df + 0.5))`), so that words every
    paragraph has count for little. Windows carry their paragraph as `_paragraph` (windows
    without it are one paragraph per question).
    """
    gaps = np.zeros(len(features), dtype=np.float64)
    paragraphs: dict[int, dict[int, list[int]]] = {}
    for i, (f, o) in enumerate(zip(features, owner)):
        paragraphs.setdefault(o, {}).setdefault(f.get("_paragraph", -1), []).append(i)
    for windows in paragraphs.values():
        if len(windows) < 2:
            continue
        first = features[next(iter(windows.values()))[0]]
        ids = np.asarray(first["input_ids"])
        q0, q1 = first.get("_question", (1, int(first["_context"][0]) - 2))
        question = np.unique(ids[q0: max(q0, q1 + 1)])
        held = np.stack([np.isin(question, np.concatenate(
            [np.asarray(features[i]["input_ids"])[features[i]["_context"][0]: features[i]["_context"][1] + 1]
             for i in members])) for members in windows.values()])  # [P, Q]
        df = held.sum(0)
        idf = np.where(df > 0, np.log1p((len(windows) - df + 0.5) / (df + 0.5)), 0.0)
        if idf.sum() <= 0:
            continue
        match = held @ idf / idf.sum()
        for members, gap in zip(windows.values(), match - match.max()):
            gaps[members] = gap
    return gaps


def span_context(starts: np.ndarray, ends: np.ndarray, context: np.ndarray, first: np.ndarray,
                 last: np.ndarray) -> np.ndarray:
    """Passage tokens a window shows on the short side of each span `[W, n]`; the side where the
    window is the passage's first (last) one counts as unlimited, as the passage ends there."""
    unlimited = np.iinfo(np.int64).max
    left = np.where(first[:, None], unlimited, starts - context[:, :1])
    right = np.where(last[:, None], unlimited, context[:, 1:] - ends)
    return np.minimum(left, right)


def merge_windows(parts: list[tuple], n_best: int, relative: bool = False) -> QAOutput:
    """One question's spans from all its windows: best first, each character span once.

    `parts` holds (scores, character spans, window null score, context or None) per window,
    and optionally each span's probability and the window's null probability. A span that
    several overlapping windows find keeps its best score, or, when the context is given, its
    score in the window where it has the most context (its probability is that window's). With
    `relative` scores (span minus its window's null score) the question's null score is 0.
    """
    null = 0.0 if relative else min(p[2] for p in parts)
    scores = np.concatenate([p[0] for p in parts])
    spans = np.concatenate([p[1] for p in parts]).reshape(-1, 2)
    given = len(parts[0]) > 5
    probs = np.concatenate([p[4] for p in parts]) if given else np.zeros(len(scores))
    if len(parts) > 1 and len(parts[0]) > 3 and parts[0][3] is not None:
        room = np.concatenate([p[3] for p in parts])
        by_room = np.lexsort((-scores, -room, spans[:, 1], spans[:, 0]))  # each span: most context first
        _, first = np.unique(spans[by_room], axis=0, return_index=True)
        keep = by_room[first]
        order = keep[np.argsort(-scores[keep], kind="stable")]
    else:
        order = np.argsort(-scores, kind="stable")
        if len(parts) > 1:  # overlapping windows find the same span: keep its best score
            _, first = np.unique(spans[order], axis=0, return_index=True)
            order = order[np.sort(first)]
    scores, spans, probs = scores[order], spans[order], probs[order]
    return QAOutput(float(null), scores[:n_best].astype(np.float64), spans[:n_best].astype(np.int64),
                    probs[:n_best].astype(np.float64) if given else None,
                    min(float(p[5]) for p in parts) if given else None)


def null_minus_best(o: QAOutput) -> float:
    return o.null_score - float(o.scores[0]) if len(o.scores) else np.inf


def answers_nothing(o: QAOutput, threshold: float | None) -> bool:
    if not len(o.scores):
        return True
    return threshold is not None and null_minus_best(o) > threshold


def shared_window_loss(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Shared normalisation: for each question (`batch["group"]`) whose answer is in one of its
    windows in the batch, minus the log of the probability of the answer's start (and end),
    under one softmax over the passage tokens of all that question's windows; the mean of
    start and end over those questions. The passage tokens are `batch["passage"]`'s ranges
    (what `encode` gives: tokenizers such as RoBERTa's give no segment ids), else the
    type-1 tokens. A window's raw span scores then compare with those of
    the question's other windows."""
    if "passage" in batch:  # each window's first and last passage token (any tokenizer's layout)
        bounds = batch["passage"].to(logits.device)
        position = torch.arange(logits.size(1), device=logits.device)[None, :]
        passage = (position >= bounds[:, :1]) & (position <= bounds[:, 1:])
    else:  # segment ids: the type-1 tokens but the final separator
        types = batch["token_type_ids"]
        passage = (types == 1) & F.pad(types[:, 1:] == 1, (0, 1))
    _, group = torch.unique(batch["group"], return_inverse=True)
    n_groups, rows = int(group.max()) + 1, torch.arange(len(group), device=group.device)
    answered = batch["start_positions"] > 0  # windows that hold the answer
    if not bool(answered.any()):
        return logits.sum() * 0.0
    far = -1e9  # a finite "minus infinity": no NaN gradients for empty rows
    total = logits.new_zeros((), dtype=torch.float32)
    for k, gold in enumerate((batch["start_positions"], batch["end_positions"])):
        scores = logits[..., k].float().masked_fill(~passage, far)
        every = torch.full((n_groups, len(group)), far, device=logits.device)
        every = every.index_put((group, rows), torch.logsumexp(scores, dim=1))
        right = torch.full((n_groups, len(group)), far, device=logits.device)
        picked = scores.gather(1, gold.long()[:, None])[:, 0]
        right = right.index_put((group[answered], rows[answered]), picked[answered])
        has = torch.zeros(n_groups, dtype=torch.bool, device=logits.device).index_fill(0, group[answered], True)
        total = total + (torch.logsumexp(every[has], dim=1) - torch.logsumexp(right[has], dim=1)).mean()
    return total / 2
