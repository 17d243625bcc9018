"""A tag head: dropout and a linear layer (or a BiLSTM first) over every token state, and what
it is trained on and its loss."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from bertheads.base.errors import UserError
from bertheads.base.schema import said
from bertheads.encoder.layers import LayerCombine
from bertheads.tasks.base import init_linear
from bertheads.tasks.families import (
    Family,
    activation,
    init_head_linear,
    token_block,
    token_start_weights,
)
from bertheads.tasks.parts import Modeling
from bertheads.tasks.recipes import Recipe
from bertheads.tasks.tag.formats import TagExample
from bertheads.tasks.tag.scheme import inside
from bertheads.tasks.tag.spec import TagSpec
from bertheads.text.encoding import window_count
from bertheads.text.offsets import blank_pieces, drop_blank, text_words

BIG = 1 << 30


class TagHead(nn.Module):
    """Dropout and a linear layer over every token state; `bilstm` puts a 2-layer
    bidirectional LSTM before the linear layer (the BERT paper's feature-based NER set-up)."""

    token_level = True

    def __init__(self, hidden_size: int, num_tags: int, settings: TagSpec, family: Family | None = None,
                 config=None) -> None:
        super().__init__()
        self.layers = tuple(settings.layers)
        self.combine = LayerCombine(len(self.layers), settings.combine)
        size = self.combine.output_size(hidden_size)
        self.dropout = nn.Dropout(settings.dropout)
        self.lstm = None
        # the family's token block before the classifier (ModernBERT: dense, act, norm)
        self.dense = self.norm = None
        if settings.head_type == "bilstm":
            lstm_size = settings.lstm_size or hidden_size
            self.lstm = nn.LSTM(size, lstm_size, num_layers=2, bidirectional=True, batch_first=True,
                                dropout=settings.dropout)
            size = 2 * lstm_size
        elif family is not None and family.token_dense:
            self.dense, self.norm = token_block(family, config, size)
            self.activation = activation(family, config)
        if family is None or family.init == "bert":
            self.out = init_linear(nn.Linear(size, num_tags))
        else:
            self.out = init_head_linear(nn.Linear(size, num_tags), family, config, "out")

    def forward(self, hidden, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        states = self.combine(hidden).to(self.out.weight.dtype)
        if self.dense is not None:
            states = self.norm(self.activation(self.dense(states)))
        if self.lstm is not None:
            states = self.dropout(states)
            mask = batch.get("attention_mask")
            if mask is not None:
                lengths = mask.sum(1).clamp(min=1).cpu()
                packed = nn.utils.rnn.pack_padded_sequence(states, lengths, batch_first=True,
                                                           enforce_sorted=False)
                out, _ = self.lstm(packed)
                states, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=states.size(1))
            else:
                states, _ = self.lstm(states)
        return self.out(self.dropout(states))


class TagModeling(Modeling):
    """A tag head's features (the words' pieces, cut into overlapping windows past max_length),
    its loss over the labelled pieces, and what a pass costs."""

    # by the training data's size, as measured on CoNLL-2003 (bench/small_data.py, docs/little-data.md):
    # the fixed batch 32 for 3 epochs takes too few steps below a few thousand sentences; from
    # 6,400 sentences its 3 epochs are the 600 steps the middle row asks for
    recipes = (Recipe(1000, "finetune", 8, steps=600, epochs=(3, 40)),
               Recipe(6400, "finetune", 32, steps=600, epochs=(3, 20)),
               Recipe(None, "finetune", 32))

    start_weights = staticmethod(token_start_weights)

    def encode(self, examples: list[TagExample], tokenizer, with_labels: bool = True,
               path: str | None = None) -> list[dict]:
        features, _ = self.encode_windows(examples, tokenizer, with_labels, path)
        if with_labels and features:  # the loss's yardstick: labelled tokens per training window
            labelled = sum(sum(1 for x in f["tok_labels"] if x != -100) for f in features)
            self.labelled_per_window = max(labelled / len(features), 1.0)
        return features

    def encode_for_inference(self, examples: list[TagExample], tokenizer,
                             with_labels: bool = False) -> tuple[list[dict], list[int]]:
        return self.encode_windows(examples, tokenizer, with_labels=with_labels, for_inference=True)

    def encode_windows(self, examples: list[TagExample], tokenizer, with_labels: bool,
                       path: str | None = None, for_inference: bool | None = None) -> tuple[list[dict], list[int]]:
        """Features (one per window) and the example each belongs to.

        The whole input is tokenized once with offsets; a raw text is split into words by
        `text.offsets.text_words` (the same rules whatever the tokenizer; each word's span has no
        surrounding whitespace), pre-tokenized inputs are joined with spaces and each token is
        mapped to its word by offset (a word that yields no piece is encoded as the unknown
        token). A leading-space marker alone (`▁`, `Ġ`) is not a word's first piece unless it is
        its only one. A text that fits
        gets exactly the ids `text.encoding.encode_texts` gives it. `for_inference` (default: when
        without labels) adds what `collect` needs to put word scores together."""
        if for_inference is None:
            for_inference = not with_labels
        spec = self.spec
        n_prefix, n_suffix = special_layout(tokenizer)
        capacity = spec.max_length - n_prefix - n_suffix
        if not 0 <= spec.stride < capacity:
            raise UserError(f"{said('stride', spec.stride)} must be at least 0 and below {said('max_length')} minus "
                            f"{n_prefix + n_suffix}")
        tag_index = {t: i for i, t in enumerate(spec.tags)}
        joined = [e.text if e.text is not None else " ".join(e.words) for e in examples]
        enc = tokenize(tokenizer, joined)
        features: list[dict] = []
        owner: list[int] = []
        for k, e in enumerate(examples):
            ids, tt, offsets = enc["input_ids"][k], enc["token_type_ids"][k], enc["offset_mapping"][k]
            end = len(ids) - n_suffix
            if e.text is not None:
                word, spans = text_words(e.text, offsets[n_prefix:end], blank_pieces(tokenizer, ids[n_prefix:end]))
                n_words = len(spans)
            else:
                word = drop_blank(words_by_offset(e.words, offsets[n_prefix:end]),
                                  blank_pieces(tokenizer, ids[n_prefix:end]))
                if len(word) and (word >= 0).any():
                    n_found = int(np.count_nonzero(np.diff(word[word >= 0]))) + 1
                else:
                    n_found = 0
                if n_found < len(e.words):  # words with no piece: encode them as the unknown token
                    ids, tt, word = encode_with_unknowns(e.words, word, tokenizer, n_prefix, n_suffix)
                    end = len(ids) - n_suffix
                n_words, spans = len(e.words), None
            valid = word >= 0
            first = valid.copy()
            first[1:] &= word[1:] != word[:-1]
            labels = cont = None
            if with_labels:
                tags = [tag_index[t] for t in e.tags]
                labels = np.asarray(tags, dtype=np.int64)
                if spec.label_subwords == "all":
                    cont = np.asarray([tag_index[inside(t)] for t in e.tags], dtype=np.int64)
            content_ids, content_tt = ids[n_prefix:end], tt[n_prefix:end]
            prefix_ids, suffix_ids = ids[:n_prefix], ids[end:]
            prefix_tt, suffix_tt = tt[:n_prefix], tt[end:]
            n = len(content_ids)
            for w_index, (s, t) in enumerate(windows(n, capacity, spec.stride)):
                f = {"input_ids": prefix_ids + content_ids[s:t] + suffix_ids,
                     "token_type_ids": prefix_tt + content_tt[s:t] + suffix_tt}
                pos = np.flatnonzero(first[s:t])
                if with_labels:
                    lab = np.full(len(f["input_ids"]), -100, dtype=np.int64)
                    lab[n_prefix + pos] = labels[word[s:t][pos]]
                    if cont is not None:
                        rest = np.flatnonzero(valid[s:t] & ~first[s:t])
                        lab[n_prefix + rest] = cont[word[s:t][rest]]
                    f["tok_labels"] = lab.tolist()
                if for_inference:
                    left = pos if s > 0 else np.full(len(pos), BIG)
                    right = (t - s - 1 - pos) if t < n else np.full(len(pos), BIG)
                    f["_pos"] = pos + n_prefix
                    f["_word"] = word[s:t][pos]
                    f["_ctx"] = np.minimum(left, right)
                    f["_n_words"] = n_words
                    if w_index == 0 and spans is not None:
                        f["_spans"] = spans
                features.append(f)
                owner.append(k)
        return features, owner

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Cross-entropy summed over the labelled tokens, divided by the batch's windows times
        the training set's labelled tokens per window. Every labelled token weighs the same
        whatever batch it lands in: length-grouped batches of short sentences would otherwise
        count their few tokens as much as a batch of long ones. (The per-batch token mean
        when the training features were not encoded by this task.)"""
        labels = batch["tok_labels"][:, : logits.size(1)]
        total = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), labels.reshape(-1),
                                ignore_index=-100, reduction="sum")
        per_window = getattr(self, "labelled_per_window", None)
        if per_window:
            return total / (labels.size(0) * per_window)
        return total / (labels != -100).sum().clamp(min=1)

    def dev_loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The mean cross-entropy per labelled token: it does not depend on the training set's
        statistics, so a model evaluated after loading reports what training reported."""
        labels = batch["tok_labels"][:, : logits.size(1)]
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), labels.reshape(-1), ignore_index=-100)

    def encoder_cost(self, counts: tuple[int, ...]) -> tuple[tuple, int]:
        """A text longer than max_length runs as overlapping windows."""
        tokens, length, stride = counts[0], int(self.spec.max_length), int(self.spec.stride)
        if tokens + 2 <= length:
            return ("whole",), tokens + 2
        return ("tag", length, stride), window_count(tokens, length - 2, stride) * length

    def output_hint(self) -> str:
        return f" ({len(self.spec.tags)} tags)"


# -- tokens, words and windows ---------------------------------------------------------
def tokenize(tokenizer, texts: list[str]):
    """Whole texts (no truncation), with offsets: windows are cut afterwards."""
    return tokenizer(texts, add_special_tokens=True, truncation=False, padding=False,
                     return_offsets_mapping=True, return_token_type_ids=True, return_attention_mask=False,
                     verbose=False)


def special_layout(tokenizer) -> tuple[int, int]:
    """How many special tokens the tokenizer puts before and after one text."""
    cached = getattr(tokenizer, "_bertheads_special_layout", None)
    if cached is None:
        enc = tokenizer("a", add_special_tokens=True, return_special_tokens_mask=True)
        mask = enc["special_tokens_mask"]
        before = next((i for i, m in enumerate(mask) if not m), len(mask))
        after = next((i for i, m in enumerate(reversed(mask)) if not m), 0)
        cached = (before, after)
        try:
            tokenizer._bertheads_special_layout = cached
        except AttributeError:  # pragma: no cover - tokenizers that refuse attributes
            pass
    return cached


def windows(n: int, capacity: int, stride: int) -> list[tuple[int, int]]:
    """Token ranges of at most `capacity` covering `n` tokens, neighbours sharing at least
    `stride`; the last one ends at the end."""
    if n <= capacity:
        return [(0, n)]
    starts = list(range(0, n - capacity, capacity - stride)) + [n - capacity]
    return [(s, s + capacity) for s in starts]


def words_by_offset(words: list[str], offsets) -> np.ndarray:
    """The word (of `words` joined by single spaces) each token belongs to (-1: none)."""
    lengths = np.fromiter((len(w) for w in words), dtype=np.int64, count=len(words))
    starts = np.concatenate([[0], np.cumsum(lengths + 1)[:-1]])
    if not len(offsets):
        return np.zeros(0, dtype=np.int64)
    off = np.asarray(offsets, dtype=np.int64)
    word = np.searchsorted(starts, off[:, 0], side="right") - 1
    inside_word = (word >= 0) & (off[:, 0] < starts[word.clip(0)] + lengths[word.clip(0)]) & (off[:, 1] > off[:, 0])
    return np.where(inside_word, word, -1)


def encode_with_unknowns(words: list[str], word: np.ndarray, tokenizer, n_prefix: int, n_suffix: int):
    """Re-encode a sentence with the words that gave no piece replaced by the unknown token."""
    found = set(word[word >= 0].tolist())
    unk = tokenizer.unk_token or "?"
    patched = [w if i in found else unk for i, w in enumerate(words)]
    enc = tokenize(tokenizer, [" ".join(patched)])
    ids, tt, offsets = enc["input_ids"][0], enc["token_type_ids"][0], enc["offset_mapping"][0]
    word = drop_blank(words_by_offset(patched, offsets[n_prefix:len(ids) - n_suffix]),
                      blank_pieces(tokenizer, ids[n_prefix:len(ids) - n_suffix]))
    if len(set(word[word >= 0].tolist())) < len(words):
        raise UserError(f"a sentence starting {' '.join(words[:5])!r} has words the tokenizer cannot encode")
    return ids, tt, word
