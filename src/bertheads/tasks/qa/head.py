"""A qa head: a linear layer from each token state to its start and end scores, and the
windows it reads and its loss."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from bertheads.encoder.layers import LayerCombine
from bertheads.tasks.base import HeadSettings, init_linear
from bertheads.tasks.families import (
    Family,
    activation,
    init_head_linear,
    token_block,
    token_start_weights,
)
from bertheads.tasks.parts import Modeling
from bertheads.tasks.qa.formats import QAExample
from bertheads.tasks.qa.passages import (
    answer_tokens,
    cut_questions,
    joined_passages,
    other_passages,
    paragraph_spans,
)
from bertheads.tasks.qa.segments import topic_pieces
from bertheads.tasks.qa.spans import shared_window_loss
from bertheads.tasks.recipes import Recipe
from bertheads.text.encoding import window_count
from bertheads.text.offsets import char_flags, clean_spans


class QAHead(nn.Module):
    """A linear layer from each token state to its start and end logits, as in BERT."""

    token_level = True

    def __init__(self, hidden_size: int, settings: HeadSettings, family: Family | None = None, config=None) -> None:
        super().__init__()
        self.layers = tuple(settings.layers)
        self.combine = LayerCombine(len(self.layers), settings.combine)
        # BERT's QA head has no dropout of its own when the encoder is fine-tuned (the encoder
        # has its own); on frozen features dropout is the head's only regulariser.
        self.dropout = nn.Dropout(settings.dropout if settings.mode == "features" else 0.0)
        size = self.combine.output_size(hidden_size)
        self.dense = self.norm = None  # the family's block before the span scores (ModernBERT)
        if family is not None and family.token_dense:
            self.dense, self.norm = token_block(family, config, size)
            self.activation = activation(family, config)
        if family is None or family.init == "bert":
            self.out = init_linear(nn.Linear(size, 2))
        else:
            self.out = init_head_linear(nn.Linear(size, 2), family, config, "out")

    def forward(self, hidden, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        states = self.combine(hidden)
        if self.dense is not None:
            states = self.norm(self.activation(self.dense(states)))
        return self.out(self.dropout(states))  # [B, T, 2]: start, end


class QAModeling(Modeling):
    """A qa head's features (question + passage windows, each paragraph or topic segment read
    in windows of its own), its start/end loss, and what a pass costs."""

    # by the training data's size, as measured on SQuAD v1.1 (bench/small_data.py, docs/little-data.md):
    # up to 1,000 questions batches of 8 and a step budget beat batches of 16 for 3 epochs and the
    # Trainer at its defaults, about 600 steps doing better than 300 at 200 questions; between 200
    # and 1,000, and where batches of 16 catch up above 1,000, is not measured
    recipes = (Recipe(200, "finetune", 8, steps=600, epochs=(3, 40)),
               Recipe(1000, "finetune", 8, steps=300, epochs=(3, 20)),
               Recipe(None, "finetune", 16))

    start_weights = staticmethod(token_start_weights)

    def windows(self, examples: list[QAExample], tokenizer,
                paragraphs: bool | None = None) -> tuple[list[dict], list[int]]:
        """Question + passage windows (no padding), each with its context token range and
        character offsets; `owner[i]` is the example window i belongs to. With `paragraphs`
        (default: `spec.paragraph_windows`) no window runs across a paragraph end."""
        spec = self.spec
        if not examples:
            return [], []
        paragraphs = spec.paragraph_windows if paragraphs is None else paragraphs
        questions = cut_questions(tokenizer, [e.question.lstrip() for e in examples], spec.max_question_length)
        pieces = [(i, a, b) for i, e in enumerate(examples)
                  for a, b in (paragraph_spans(e.context) if paragraphs else [(0, len(e.context))])]

        def encode(pieces):
            return tokenizer([questions[i] for i, _, _ in pieces], [examples[i].context[a:b] for i, a, b in pieces],
                             truncation="only_second", max_length=spec.max_length, stride=spec.stride,
                             return_overflowing_tokens=True, return_offsets_mapping=True, padding=False,
                             return_token_type_ids=True, return_attention_mask=False)

        enc = encode(pieces)
        piece_of = [int(i) for i in enc["overflow_to_sample_mapping"]]
        if paragraphs and spec.topic_segments:
            split = topic_pieces(examples, pieces, piece_of, enc, tokenizer)
            if len(split) > len(pieces):
                pieces = split
                enc = encode(pieces)
                piece_of = [int(i) for i in enc["overflow_to_sample_mapping"]]
        feats = []
        flags: tuple[int, np.ndarray] | None = None  # the current passage's character classes
        for w, p in enumerate(piece_of):
            seq = enc.sequence_ids(w)
            offsets = np.asarray(enc["offset_mapping"][w], dtype=np.int32)
            question = (seq.index(0), len(seq) - 1 - seq[::-1].index(0)) if 0 in seq else (1, 0)
            if 1 in seq:
                c0, c1 = seq.index(1), len(seq) - 1 - seq[::-1].index(1)
                offsets[c0: c1 + 1] += pieces[p][1]  # characters of the whole passage
                # no leading-space marker's space at either end of a span, no accent cut off
                context = examples[pieces[p][0]].context
                if flags is None or flags[0] != pieces[p][0]:  # (an example's windows are consecutive)
                    flags = (pieces[p][0], char_flags(context))
                offsets[c0: c1 + 1] = clean_spans(context, offsets[c0: c1 + 1], flags[1])
            else:  # a passage that tokenizes to nothing: an empty range
                c0, c1 = len(seq) - 1, len(seq) - 2
            feats.append({"input_ids": enc["input_ids"][w], "token_type_ids": enc["token_type_ids"][w],
                          "_offsets": offsets, "_context": (c0, c1), "_question": question, "_paragraph": p})
        return feats, [pieces[p][0] for p in piece_of]

    def encode(self, examples: list[QAExample], tokenizer, with_labels: bool = True,
               path: str | None = None) -> list[dict]:
        """Training windows: one holding the whole (first) answer points at its start and end
        tokens, any other at [CLS] (position 0); with `join_passages`, each passage is first
        joined with its nearest other passages; with `negative_windows`, windows of other
        passages are added, pointing at [CLS] too."""
        spec = self.spec
        joined = with_labels and spec.join_passages > 0
        read = joined_passages(examples, spec.join_passages) if joined else examples
        # joined passages are read across their ends: that is what joining them is for
        feats, owner = self.encode_for_inference(read, tokenizer, with_labels, paragraphs=False if joined else None)
        if with_labels and spec.negative_windows > 0:
            others, sources = other_passages(examples, spec.negative_windows)
            negatives, of = self.windows(others, tokenizer)
            for f in negatives:
                f["start_positions"], f["end_positions"] = 0, 0
            feats += negatives
            owner = owner + [sources[i] for i in of]
        if with_labels and spec.shared_norm:
            for f, i in zip(feats, owner):
                f["group"] = i  # which question: its windows are batched together (see `loss`)
                f["passage"] = list(f["_context"])  # its first and last passage token
        return feats

    def encode_for_inference(self, examples: list[QAExample], tokenizer, with_labels: bool = False,
                             paragraphs: bool | None = None) -> tuple[list[dict], list[int]]:
        feats, owner = self.windows(examples, tokenizer, paragraphs)
        if with_labels:
            for f, i in zip(feats, owner):
                f["start_positions"], f["end_positions"] = answer_tokens(f, examples[i])
        return feats, owner

    def encoder_cost(self, counts: tuple[int, ...]) -> tuple[tuple, int]:
        """The passage in windows beside the question (cut to max_question_length)."""
        question, tokens = counts
        spec = self.spec
        room = max(1, int(spec.max_length) - min(question, int(spec.max_question_length)) - 3)
        return ("qa", id(self)), window_count(tokens, room, int(spec.stride)) * int(spec.max_length)

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Mean of the start and end cross-entropies (padding positions masked out); with
        `shared_norm` (a `group` per window), plus the shared-softmax loss of `shared_window_loss`."""
        mask = batch.get("attention_mask")
        if mask is not None:
            logits = logits.masked_fill(mask[..., None] == 0, torch.finfo(logits.dtype).min)
        start = F.cross_entropy(logits[..., 0], batch["start_positions"].long())
        end = F.cross_entropy(logits[..., 1], batch["end_positions"].long())
        loss = (start + end) / 2
        if "group" in batch:
            loss = loss + shared_window_loss(logits, batch)
        return loss
