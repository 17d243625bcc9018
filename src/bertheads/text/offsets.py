"""Tokens back to characters, whatever the tokenizer: each piece's character span without the
whitespace a leading-space marker brings along (byte-level BPE's `Ġ`, SentencePiece's `▁`), and
a raw text's words found from its pieces by the same rules for every tokenizer.

A byte-level BPE piece such as `Ġand` has the offsets of " and", a SentencePiece marker alone
(`▁`) the offsets of the space before its word (or of the word's first character at the start
of a text); a decomposed (NFD) accent may be left out of every piece's offsets. `clean_spans`
trims the whitespace from each span, gives a whitespace-only piece an empty span at its end, and
stretches a span over the combining marks that follow it, so `text[start:end]` never starts or
ends with a space and never cuts a letter from its accent. `blank_pieces` tells which pieces are
markers alone (they decode to nothing but whitespace).

`text_words` splits a raw text into words as BERT's own pre-tokenizer does (at whitespace, around
each punctuation character and each CJK ideograph) as far as the tokenizer's pieces allow: a
piece is never split, so a piece that runs across a boundary joins the words on both sides. With
a WordPiece (BERT) tokenizer these are exactly the tokenizer's own words.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache

import numpy as np

SPACE, MARK, SPLIT = 1, 2, 4  # character flags: whitespace, combining mark, a word of its own

# BERT's CJK ideograph blocks (each ideograph is a word of its own, as BERT's normalizer makes it)
CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
       (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


@lru_cache(maxsize=65536)
def char_flag(c: str) -> int:
    """SPACE, MARK, SPLIT or 0 for one character. Whitespace is BERT's: tab, newline, carriage
    return and Unicode whitespace that is not a control character (BERT drops those)."""
    category = unicodedata.category(c)
    if c in "\t\n\r" or (c.isspace() and not category.startswith("C")):
        return SPACE
    if category.startswith("M"):
        return MARK
    cp = ord(c)
    if (33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126 or category.startswith("P")
            or any(a <= cp <= b for a, b in CJK)):
        return SPLIT
    return 0


def char_flags(text: str) -> np.ndarray:
    """`char_flag` of every character of `text` (uint8)."""
    if not text:
        return np.zeros(0, dtype=np.uint8)
    codes = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
    unique, inverse = np.unique(codes, return_inverse=True)
    flags = np.fromiter((char_flag(chr(c)) for c in unique.tolist()), dtype=np.uint8, count=len(unique))
    return flags[inverse]


def clean_spans(text: str, offsets, flags: np.ndarray | None = None) -> np.ndarray:
    """Each piece's `(start, end)` in `text` without leading or trailing whitespace and with the
    combining marks that follow it; a piece of whitespace alone gets the empty span `(end, end)`.
    `offsets` are the tokenizer's, of pieces of `text` (special tokens' `(0, 0)` stay empty)."""
    spans = np.array(offsets, dtype=np.int64).reshape(-1, 2)
    if not len(spans) or not text:
        return spans
    flags = char_flags(text) if flags is None else flags
    n = len(text)
    solid = np.flatnonzero((flags & SPACE) == 0)  # positions of non-space characters
    plain = np.flatnonzero((flags & MARK) == 0)  # positions of non-mark characters
    start, end = spans[:, 0].clip(0, n), spans[:, 1].clip(0, n)
    k = np.searchsorted(solid, start, side="left")
    first = np.where(k < len(solid), solid[np.minimum(k, len(solid) - 1)], n) if len(solid) else np.full(len(start), n)
    k = np.searchsorted(solid, end, side="left") - 1
    last = np.where(k >= 0, solid[np.maximum(k, 0)] + 1, 0) if len(solid) else np.zeros(len(end), dtype=np.int64)
    blank = first >= end
    k = np.searchsorted(plain, last, side="left")
    stretched = np.where(k < len(plain), plain[np.minimum(k, len(plain) - 1)], n) if len(plain) else np.full(len(end), n)
    out = np.stack([np.where(blank, end, first), np.where(blank, end, np.maximum(stretched, last))], axis=1)
    return out.astype(np.int64)


def blank_pieces(tokenizer, ids) -> np.ndarray:
    """Which pieces are a leading-space marker alone (`▁`, `Ġ`): they decode to whitespace only
    (remembered per tokenizer)."""
    known = tokenizer.__dict__.setdefault("_bertheads_blank_pieces", {})
    out = np.zeros(len(ids), dtype=bool)
    for i, piece in enumerate(ids):
        blank = known.get(piece)
        if blank is None:
            token = tokenizer.convert_ids_to_tokens(int(piece))
            blank = known[piece] = bool(token) and not tokenizer.convert_tokens_to_string([token]).strip()
        out[i] = blank
    return out


def text_words(text: str, offsets, blank: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The word each piece belongs to (-1: none: whitespace, or a marker alone in a word that has
    other pieces) and each word's `(start, end)` character span. `offsets` are the pieces'
    tokenizer offsets in `text`; `blank` (`blank_pieces`) marks the markers alone."""
    flags = char_flags(text)
    spans = clean_spans(text, offsets, flags)
    n = len(spans)
    word = np.full(n, -1, dtype=np.int64)
    if not n:
        return word, np.zeros((0, 2), dtype=np.int64)
    solid = np.flatnonzero(spans[:, 1] > spans[:, 0])
    if not len(solid):
        return word, np.zeros((0, 2), dtype=np.int64)
    space_before = np.concatenate([[0], np.cumsum((flags & SPACE) > 0)])  # spaces in text[:i]
    a, b = spans[solid, 0], spans[solid, 1]
    prev_end, this_start = b[:-1], a[1:]
    gap = this_start > prev_end
    spaced = gap & (space_before[np.maximum(this_start, prev_end)] - space_before[prev_end] > 0)
    last_char = np.maximum(np.minimum(prev_end, len(text)) - 1, 0)
    split = ((flags[last_char] & SPLIT) > 0) | ((flags[np.minimum(this_start, len(text) - 1)] & SPLIT) > 0)
    new = np.concatenate([[True], (this_start >= prev_end) & (spaced | split)])
    numbered = np.cumsum(new) - 1
    word[solid] = numbered
    count = int(numbered[-1]) + 1
    starts = np.full(count, np.iinfo(np.int64).max, dtype=np.int64)
    ends = np.zeros(count, dtype=np.int64)
    np.minimum.at(starts, numbered, a)
    np.maximum.at(ends, numbered, b)
    if blank is not None:
        word = drop_blank(word, np.asarray(blank, dtype=bool))
    return word, np.stack([starts, ends], axis=1)


def drop_blank(word: np.ndarray, blank: np.ndarray) -> np.ndarray:
    """`word` with the marker-alone pieces taken out of their words, unless one is the only piece
    its word has (a word keeps at least one piece)."""
    marked = blank & (word >= 0)
    if not marked.any():
        return word
    others = set(word[(word >= 0) & ~blank].tolist())
    out = word.copy()
    for i in np.flatnonzero(marked):
        if int(word[i]) in others:
            out[i] = -1
    return out
