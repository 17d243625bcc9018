"""Topic segments of a passage that has no paragraph breaks: where its sentences change subject.

Text extracted from HTML or PDFs, chat logs and flattened datasets come as one block. Read in
plain sliding windows, the question's paragraph sits behind unrelated text in every window, and
the reader answers worse. Cut at the topic shifts instead, each segment is read in windows of its
own and weighed by its match with the question, as real paragraphs are (`QATask.parts.modeling.windows`).

The shifts are found as in TextTiling (Hearst, 1997): the idf-weighted words of the few sentences
before each gap between sentences are compared (cosine) with those of the few after; a gap whose
similarity lies deep below the peaks on both sides is a shift. Written here because the method is
a few lines over sentences and words, and the libraries that have it (nltk) bring corpora, stop
lists and a dependency for one function.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left
from collections import Counter

import numpy as np

# a sentence ends at . ! ? (and any closing quotes or brackets) before whitespace and a character
# that is not a lower-case letter (so "e.g. this" stays whole), or at a CJK full stop
SENTENCE_END = re.compile(r"(?<=[.!?])[\"'”’)\]]*\s+(?=[^\sa-z])|(?<=[。！？])\s*(?=\S)")
# ... unless the period ends a title or an initial ("Dr. Who", "J. Smith")
ABBREVIATION = re.compile(r"(?:\b(?:Mr|Mrs|Ms|Dr|Prof|St|Mt|Jr|Sr|Gen|Col|Lt|Capt|Rev|No|vs|[A-Z])\.)$")
WORD = re.compile(r"\w+")

BLOCK = 3  # sentences compared on each side of a gap
CUT = 0.5  # a gap is a shift when its depth exceeds the mean depth plus CUT standard deviations
MIN_TOKENS = 80  # no segment shorter than this (unless the text is)
FIT = False  # also cut segments longer than the room at their deepest gap


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """Character ranges of the sentences of `text` (the whitespace between them left out)."""
    spans, start = [], 0
    for m in SENTENCE_END.finditer(text):
        if ABBREVIATION.search(text[max(0, m.start() - 6): m.start()]):
            continue
        end = m.start() + len(m.group(0).rstrip())
        if text[start:end].strip():
            spans.append((start, end))
        start = m.end()
    if text[start:].strip():
        spans.append((start, len(text.rstrip())))
    return spans or [(0, len(text))]


def gap_depths(sentences: list[str], block: int = BLOCK) -> np.ndarray:
    """TextTiling's depth score of each gap between consecutive sentences `[n - 1]`: how far the
    cosine similarity of the idf-weighted words of the `block` sentences on either side lies
    below the nearest peak on its left plus the nearest peak on its right."""
    words = [Counter(w.lower() for w in WORD.findall(s)) for s in sentences]
    n = len(words)
    df = Counter(w for c in words for w in c)
    idf = {w: math.log((n + 1) / (d + 0.5)) for w, d in df.items()}
    similarity = np.zeros(max(0, n - 1))
    for g in range(1, n):
        left, right = Counter(), Counter()
        for c in words[max(0, g - block): g]:
            left.update(c)
        for c in words[g: g + block]:
            right.update(c)
        dot = sum(k * right[w] * idf[w] ** 2 for w, k in left.items() if w in right)
        norms = math.sqrt(sum((k * idf[w]) ** 2 for w, k in left.items())
                          * sum((k * idf[w]) ** 2 for w, k in right.items()))
        similarity[g - 1] = round(dot / norms, 6) if norms > 0 else 0.0  # rounded: ties stay ties
    left_peak, right_peak = similarity.copy(), similarity.copy()
    for i in range(1, len(similarity)):  # climb while the curve does not fall
        if similarity[i - 1] >= similarity[i]:
            left_peak[i] = left_peak[i - 1]
    for i in range(len(similarity) - 2, -1, -1):
        if similarity[i + 1] >= similarity[i]:
            right_peak[i] = right_peak[i + 1]
    return (left_peak - similarity) + (right_peak - similarity)


def topic_spans(text: str, token_starts: np.ndarray, room: int, block: int = BLOCK, cut: float = CUT,
                min_tokens: int = MIN_TOKENS, fit: bool = FIT) -> list[tuple[int, int]]:
    """Character ranges of `text` cut at its topic shifts, each at most `room` tokens where its
    sentences allow; `token_starts` holds the first character of each of its tokens (sorted).

    Text of at most `room` tokens, or of one sentence, stays whole. The deepest gaps above the
    mean depth plus `cut` standard deviations become cuts, as long as no segment gets shorter
    than `min_tokens`; a segment still longer than `room` is then cut at its deepest gap (the
    one nearest its middle among equals) until each fits."""
    sentences = sentence_spans(text)
    at = np.array([bisect_left(token_starts, a) for a, _ in sentences] + [len(token_starts)])  # token offsets
    n = len(sentences)
    if n < 2 or at[-1] - at[0] <= room:
        return [(0, len(text))]
    depth = gap_depths([text[a:b] for a, b in sentences], block)  # depth[g - 1]: the gap before sentence g
    limit = max(float(depth.mean() + cut * depth.std()), 1e-6)
    cuts: list[int] = []  # sentence indices where a segment starts, sorted
    for g in np.argsort(-depth, kind="stable") + 1:
        if depth[g - 1] <= limit:
            break
        k = bisect_left(cuts, g)
        before = cuts[k - 1] if k else 0
        after = cuts[k] if k < len(cuts) else n
        if at[g] - at[before] >= min_tokens and at[after] - at[g] >= min_tokens:
            cuts.insert(k, int(g))
    bounds = [0, *cuts, n]
    k = 0
    while k < len(bounds) - 1:  # segments longer than the room: cut at their deepest gap
        x, y = bounds[k], bounds[k + 1]
        if fit and at[y] - at[x] > room and y - x > 1:
            middle = (at[x] + at[y]) / 2
            g = max(range(x + 1, y), key=lambda g: (depth[g - 1], -abs(at[g] - middle)))
            bounds.insert(k + 1, g)
            continue
        k += 1
    return [(sentences[x][0], sentences[y - 1][1]) for x, y in zip(bounds, bounds[1:])]


def topic_pieces(examples: list, pieces: list[tuple[int, int, int]], piece_of: list[int], enc,
                 tokenizer) -> list[tuple[int, int, int]]:
    """`pieces` (example, first and last character of its `context`) with each one that needed
    more than one window (`enc`, the tokenizer's windows of the pieces; `piece_of[w]`: window
    w's piece) cut at its topic shifts (`topic_spans`, with that question's passage room);
    pieces that fit one window stay as they are."""
    first: dict[int, int] = {}
    for w, p in enumerate(piece_of):
        first.setdefault(p, w)
    windows = np.bincount(piece_of, minlength=len(pieces))
    long = [p for p in range(len(pieces)) if windows[p] > 1]
    if not long:
        return pieces
    texts = [examples[pieces[p][0]].context[pieces[p][1]: pieces[p][2]] for p in long]
    starts = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True,
                       return_attention_mask=False, return_token_type_ids=False, verbose=False)["offset_mapping"]
    cut: dict[int, list[tuple[int, int, int]]] = {}
    for p, text, offsets in zip(long, texts, starts):
        seq = enc.sequence_ids(first[p])
        room = len(seq) - seq.index(1) - seq[::-1].index(1)  # passage tokens in the (full) first window
        i, a, _ = pieces[p]
        cut[p] = [(i, a + s, a + t) for s, t in topic_spans(text, [o[0] for o in offsets], room)]
    return [q for p, piece in enumerate(pieces) for q in cut.get(p, [piece])]
