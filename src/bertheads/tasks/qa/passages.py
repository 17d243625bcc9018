"""The passages a qa head reads: questions cut to their token budget, a passage split into its
paragraphs, and, for training, passages joined with or paired with their neighbours in the file
and the tokens of a window that hold the answer."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np

from bertheads.tasks.qa.formats import QAExample


def cut_questions(tokenizer, questions: list[str], max_tokens: int) -> list[str]:
    """Questions longer than `max_tokens` tokens are cut before the word holding token
    `max_tokens` (inside a word only when its first word is that long)."""
    enc = tokenizer(questions, add_special_tokens=False, return_offsets_mapping=True,
                    return_attention_mask=False, return_token_type_ids=False, verbose=False)
    out = []
    for i, (question, offsets) in enumerate(zip(questions, enc["offset_mapping"])):
        if len(offsets) <= max_tokens:
            out.append(question)
            continue
        words = enc.word_ids(i)
        first = max_tokens
        while first > 0 and words[first - 1] == words[max_tokens]:
            first -= 1
        out.append(question[: offsets[first][0]].rstrip() if first else question[: offsets[max_tokens - 1][1]])
    return out


def paragraph_spans(context: str, min_chars: int = 200) -> list[tuple[int, int]]:
    """Character ranges of a passage's paragraphs: split at blank lines when it has any, else at
    line breaks, unless most lines are shorter than `min_chars` (hard-wrapped text: then the
    passage stays whole); a paragraph shorter than `min_chars` (a heading, a list item) joins
    the next, the last one the one before. Whitespace between them is dropped."""
    if re.search(r"\n[ \t\r]*\n", context):
        breaks = r"\n[ \t\r]*\n\s*"
    else:
        lines = sorted(len(x.strip()) for x in context.split("\n") if x.strip())
        if len(lines) < 2 or lines[len(lines) // 2] < min_chars:
            return [(0, len(context))]
        breaks = r"\s*\n\s*"
    spans, start = [], 0
    for m in re.finditer(breaks, context):
        spans.append((start, m.start()))
        start = m.end()
    spans.append((start, len(context)))
    spans = [(a + len(t) - len(t.lstrip()), b - len(t) + len(t.rstrip()))
             for a, b in spans if (t := context[a:b]).strip()] or [(0, len(context))]
    merged: list[tuple[int, int]] = []
    for a, b in spans:
        if merged and merged[-1][1] - merged[-1][0] < min_chars:
            a = merged.pop()[0]
        merged.append((a, b))
    if len(merged) > 1 and merged[-1][1] - merged[-1][0] < min_chars:  # a short last one joins the one before
        merged[-2:] = [(merged[-2][0], merged[-1][1])]
    return merged


def nearest_passages(examples: list[QAExample], k: int) -> tuple[list[str], list[int], list[list[int]]]:
    """The file's distinct passages in order, each question's own passage index, and the `k`
    passages nearest it in file order (one before, one after, then two before...; usually
    the same article's)."""
    passages: dict[str, int] = {}
    for e in examples:
        passages.setdefault(e.context, len(passages))
    texts = list(passages)
    k = min(k, len(texts) - 1)
    own = [passages[e.context] for e in examples]
    nearest: dict[int, list[int]] = {}
    for p in set(own):
        picked: list[int] = []
        for n in range(1, len(texts)):
            for q in (p - n, p + n):
                if 0 <= q < len(texts) and len(picked) < k:
                    picked.append(q)
            if len(picked) == k:
                break
        nearest[p] = picked
    return texts, own, [nearest[p] for p in own]


def other_passages(examples: list[QAExample], k: int) -> tuple[list[QAExample], list[int]]:
    """Each question paired with the `k` passages nearest its own in file order, as questions
    without an answer there, and for each pair the index of its question in `examples`."""
    texts, _, nearest = nearest_passages(examples, k)
    pairs = [(i, QAExample(e.question, texts[p], f"{e.id}/negative{j}"))
             for i, (e, picked) in enumerate(zip(examples, nearest)) for j, p in enumerate(picked)]
    return [p for _, p in pairs], [i for i, _ in pairs]


def joined_passages(examples: list[QAExample], k: int, sep: str = "\n") -> list[QAExample]:
    """Each question with its passage joined with the `k` passages nearest it (all in file
    order, `sep` between them); answer offsets move with the passage."""
    texts, own, nearest = nearest_passages(examples, k)
    out = []
    for e, p, picked in zip(examples, own, nearest):
        before = [texts[q] for q in sorted(picked) if q < p]
        shift = sum(len(t) + len(sep) for t in before)
        context = sep.join([*before, e.context, *(texts[q] for q in sorted(picked) if q > p)])
        starts = [s if s >= 0 else e.context.find(a) for s, a in zip(e.starts, e.answers)]
        out.append(replace(e, context=context, starts=[s + shift if s >= 0 else -1 for s in starts]))
    return out


def answer_tokens(feature: dict, example: QAExample) -> tuple[int, int]:
    """Start and end token of the example's first answer in this window, or (0, 0) ([CLS])."""
    if not example.answers:
        return 0, 0
    c0, c1 = feature["_context"]
    if c1 < c0:
        return 0, 0
    offsets = feature["_offsets"][c0: c1 + 1]
    first = example.starts[0]
    if first < 0:
        first = example.context.find(example.answers[0])
    last = first + len(example.answers[0])
    if offsets[0, 0] > first or offsets[-1, 1] < last:
        return 0, 0
    start = int(np.searchsorted(offsets[:, 0], first, side="right")) - 1
    end = int(np.searchsorted(offsets[:, 1], last, side="left"))
    return c0 + start, c0 + min(end, len(offsets) - 1)
