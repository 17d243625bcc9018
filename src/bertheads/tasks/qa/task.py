"""Extractive question answering: the answer is a span of the passage (SQuAD v1.1 and v2.0).

The question and the passage go in as a pair, `[CLS] question [SEP] passage [SEP]`. A passage
longer than the window is cut into overlapping windows (`--stride` tokens shared between
neighbours) whose offset mappings lead back to characters of the passage. The head scores
each token as the start and as the end of the answer; the best valid span over all windows
of a question wins. With SQuAD v2.0 training data the model may also answer nothing: when the
null score ([CLS] start + end) exceeds the best span's score by more than a threshold tuned
on the dev set.

Formats: SQuAD JSON (`{"data": [{"paragraphs": [{"context", "qas": [...]}]}]}`) and JSON
lines `{"id", "question", "context", "answers": {"text": [...], "answer_start": [...]}}`.
Readers are in `qa_formats`, span decoding across windows in `qa_spans`, the SQuAD scores
in `qa_metrics`.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from bertheads.base.errors import UserError
from bertheads.base.values import non_negative_float, non_negative_int, positive_int
from bertheads.encoder.layers import LayerCombine
from bertheads.tasks.base import CardText, HeadSettings, Task, TextInput, init_linear, option
from bertheads.tasks.families import (
    FAMILIES,
    Family,
    activation,
    copy_into,
    copy_start,
    init_head_linear,
    settle_family,
    start_weights,
    token_block,
)
from bertheads.tasks.qa.formats import QAExample, check_text, iter_examples, read_examples
from bertheads.tasks.qa.metrics import (
    best_threshold,
    exact,
    f1_v1,
    f1_v2,
    gold_v2,
    max_over,
    normalize_answer,  # noqa: F401  (re-exported: tests import it from here)
    squad_v1_scores,
    squad_v2_scores,
)
from bertheads.tasks.qa.passages import (
    answer_tokens,
    cut_questions,
    joined_passages,
    other_passages,
    paragraph_spans,
)
from bertheads.tasks.qa.predictions import probability, write_predictions
from bertheads.tasks.qa.report import qa_section
from bertheads.tasks.qa.segments import topic_pieces
from bertheads.tasks.qa.spans import (
    WINDOW_CHOICES,
    QAOutput,
    answers_nothing,
    best_spans,
    merge_windows,
    null_minus_best,
    paragraph_match_gaps,
    shared_window_loss,
    span_context,
    window_choice_parts,
)
from bertheads.text.encoding import window_count
from bertheads.text.offsets import char_flags, clean_spans
from bertheads.text.readers import read_text


@dataclass
class QASpec(HeadSettings):
    max_length: int = 384
    stride: int = 128  # tokens shared by neighbouring windows of one passage
    max_question_length: int = 64  # questions are cut to this many tokens first
    n_best: int = 20
    max_answer_length: int = 30  # in tokens
    null_threshold: float | None = None  # answer "" when null score - best span > this (None: never)
    unanswerable: bool = False  # the training data had questions without an answer (SQuAD v2.0)
    tune_threshold: bool = True  # tune `null_threshold` on the dev set (off when it was given)
    window_choice: str = "relative"  # how spans of different windows compare (WINDOW_CHOICES)
    negative_windows: int = 0  # training: answerless windows of other passages per question
    join_passages: int = 0  # training: each passage read among its K nearest other passages
    paragraph_windows: bool = True  # each paragraph of a passage read in windows of its own
    shared_norm: bool = False  # training: a question's windows share one start and one end softmax
    paragraph_match: float = 6.0  # a span loses this x how much worse its paragraph matches the question
    topic_segments: bool = True  # a paragraph longer than a window is read in segments cut at its topic shifts


@dataclass
class QAOptions:
    """What `predict`, `evaluate` and the server may change of a qa head."""

    question: str | None = option(None, "qa: one question (with --context)", commands=("predict",))
    context: str | None = option(None, "qa: the passage for --question", commands=("predict",))
    null_threshold: float | None = option(None, "qa (SQuAD v2): override the saved no-answer threshold", type=float)
    predictions_out: str | None = option(None, "qa: write {id: answer} JSON here (and an n-best file beside it)",
                                         commands=("evaluate",))
    window_choice: str | None = option(None, "qa: override the saved way spans of a long passage's windows "
                                             "compare", choices=WINDOW_CHOICES, spec=True)
    paragraph_windows: bool | None = option(None, "qa: override whether each paragraph of a passage is read in "
                                                  "windows of its own", spec=True)
    paragraph_match: float | None = option(None, "qa: override the saved weight of how well each paragraph "
                                                 "matches the question", type=non_negative_float, metavar="W",
                                           spec=True)
    topic_segments: bool | None = option(None, "qa: override whether a paragraph longer than a window is read "
                                               "in segments cut at its topic shifts", spec=True)


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


class QATask(Task):
    kind = "qa"
    spec_type = QASpec
    main_metric = "f1"
    help = "answer spans in a passage for a question (SQuAD v1.1 / v2.0)"
    training_defaults = {"max_length": 384, "batch_size": 16}
    input_form = "question"
    metric_scale = 100.0  # SQuAD's EM and F1 are percentages
    text_formats = ("squad", "jsonl")
    options_type = QAOptions
    shows = "answer"
    counts_lines = False  # records are questions, many to a SQuAD line
    hf_auto_class = "AutoModelForQuestionAnswering"
    hf_pipeline = "question-answering"

    @classmethod
    def add_arguments(cls, parser) -> None:
        g = parser.add_argument_group("answer spans")
        g.add_argument("--stride", type=non_negative_int, default=128, help="tokens shared by neighbouring windows")
        g.add_argument("--max-question-length", type=positive_int, default=64, help="questions are cut to N tokens")
        g.add_argument("--n-best", type=positive_int, default=20, help="start and end candidates per window")
        g.add_argument("--max-answer-length", type=positive_int, default=30, help="longest answer in tokens")
        g.add_argument("--null-threshold", type=float, default=None,
                       help="SQuAD v2: answer nothing when null - best span score exceeds this "
                            "(default: tuned on --dev for the best F1)")
        g.add_argument("--window-choice", choices=WINDOW_CHOICES, default="relative",
                       help="how spans of a long passage's windows compare: relative (default: span score "
                            "minus its window's null score), raw (start + end, as run_qa), +context (a span "
                            "two windows share is scored where it has the most context)")
        g.add_argument("--paragraph-match", type=non_negative_float, default=QASpec.paragraph_match, metavar="W",
                       help="for a passage of several paragraphs: a span loses W x how much worse its "
                            "paragraph's words match the question's than the best paragraph's do "
                            f"(a share in [0, 1]; default {QASpec.paragraph_match:g}; 0: off)")
        g.add_argument("--negative-windows", type=int, default=0, metavar="K",
                       help="training: also pair each question with K other passages of the file as "
                            "answerless windows (default 0; 1 helps long passages, at twice the windows)")
        g.add_argument("--paragraph-windows", action=argparse.BooleanOptionalAction, default=True,
                       help="read each paragraph of a passage (split at blank lines, else at line breaks; "
                            "short ones join the next) in windows of its own, as SQuAD's paragraphs are "
                            "read (default); --no-paragraph-windows: windows run across paragraph ends")
        g.add_argument("--topic-segments", action=argparse.BooleanOptionalAction, default=True,
                       help="with --paragraph-windows: a paragraph longer than one window (a passage without "
                            "line breaks) is cut where its sentences change subject, and each segment is read "
                            "and matched as a paragraph (default); --no-topic-segments: plain windows")
        g.add_argument("--shared-norm", action="store_true",
                       help="training: the windows of a question (its own and, with --negative-windows, "
                            "other passages') are batched together and share one softmax over their "
                            "passage tokens, besides each window's own loss, so span scores compare "
                            "across windows and paragraphs")
        g.add_argument("--join-passages", type=int, default=0, metavar="K",
                       help="training: read each question's passage joined with the K nearest other "
                            "passages of the file, in file order, so answers sit at varied places among "
                            "real text and the windows without the answer learn 'not here' (default 0)")

    @classmethod
    def spec_from_dict(cls, data: dict) -> QASpec:
        """Models saved before `window_choice`, `paragraph_windows`, `paragraph_match` and
        `topic_segments` existed keep the raw comparison, the windows across paragraphs, no
        paragraph match and plain windows over flat text, as they were tuned."""
        return super().spec_from_dict({"window_choice": "raw", "paragraph_windows": False, "paragraph_match": 0.0,
                                       "topic_segments": False, **data})

    @classmethod
    def build(cls, spec: QASpec, encoder, pooler_state=None) -> QATask:
        """A fresh head; `pooler_state`: the checkpoint's weights a family's token block starts from."""
        family = settle_family(spec, encoder)
        head = QAHead(encoder.info.hidden_size, spec, family, getattr(encoder, "config", None))
        if head.dense is not None:
            copy_start(head.dense, head.norm, pooler_state)
        return cls(spec, head)

    @classmethod
    def prepare(cls, path: str, spec: QASpec, encoder):
        """Read the training file (answers that do not match their passage are skipped)."""
        check_settings(spec, encoder)
        examples = read_examples(path, need_labels=True, strict=False)
        spec.unanswerable = any(not e.answers for e in examples)
        if spec.null_threshold is not None:
            spec.tune_threshold = False
        elif spec.unanswerable:
            spec.null_threshold = 0.0
        family = settle_family(spec, encoder)  # ModernBERT's token block starts from its masked-LM head
        start = start_weights(family, encoder) if family.token_dense else None
        return cls.build(spec, encoder, start), examples

    # -- reading ------------------------------------------------------------------------
    def read(self, path: str | None, need_labels: bool = True, fmt: str | None = None,
             question: str | None = None, context: str | None = None, **_) -> list[QAExample]:
        if question is not None or context is not None:
            if path is not None:
                raise UserError("give either --input or --question/--context, not both")
            return self.from_inputs([{"question": question, "context": context}], source="--question/--context")
        return read_examples(path, need_labels, fmt=fmt)

    def iter_read(self, path, need_labels: bool = True, fmt: str | None = None, keep: tuple[str, ...] = (),
                  bad=None, question: str | None = None, context: str | None = None, **_) -> Iterator[QAExample]:
        """`read`, a question at a time (see `qa_formats.iter_examples` for SQuAD JSON)."""
        if question is not None or context is not None:
            yield from self.read(path, need_labels, fmt, question, context)
            return
        yield from iter_examples(path, need_labels, fmt=fmt, keep=keep, bad=bad)

    def from_inputs(self, inputs: list, source: str = "input", **_) -> list[QAExample]:
        """Examples from `{"question", "context"}` dicts or `(question, context)` tuples."""
        out = []
        for i, item in enumerate(inputs):
            label = f"{source} {i}" if source == "input" else source
            if isinstance(item, dict):
                question, context, qid = item.get("question"), item.get("context"), item.get("id", i)
                has_id = "id" in item
            elif isinstance(item, (tuple, list)) and len(item) == 2:
                (question, context), qid, has_id = item, i, False
            else:
                raise UserError(f"{label}: expected a {{'question', 'context'}} dict or a (question, context) "
                                f"pair, got {type(item).__name__}")
            out.append(QAExample(check_text(question, "question", label), check_text(context, "context", label),
                                 str(qid), has_id=has_id, record=label))
        return out

    # -- encoding -----------------------------------------------------------------------
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

    def encoder_cost(self, tokens: int, second: int | None, question: int | None) -> tuple[tuple, int] | None:
        """The passage (`tokens`) in windows beside the question (cut to max_question_length)."""
        if question is None:
            return None
        spec = self.spec
        room = max(1, int(spec.max_length) - min(question, int(spec.max_question_length)) - 3)
        return ("qa", id(self)), window_count(tokens, room, int(spec.stride)) * int(spec.max_length)

    def report_section(self, outputs: list, examples: list, metrics: dict, section) -> None:
        qa_section(self, outputs, examples, metrics, section)

    # -- the model card ------------------------------------------------------------------------
    def card_text(self) -> CardText:
        spec = self.spec
        limits = ["Answers are spans of the passage: it copies text and never composes, sums up or paraphrases "
                  f"an answer; a span is at most {spec.max_answer_length} tokens.",
                  f"Passages longer than {spec.max_length} tokens are read in overlapping windows "
                  f"({spec.stride} tokens shared); questions are cut at {spec.max_question_length} tokens."]
        if spec.unanswerable:
            limits.append("It may answer nothing (an empty answer) when no span of the passage scores above "
                          "its no-answer score by the threshold (SQuAD v2.0).")
        else:
            limits.append("Every question of its training data had an answer: it always gives a span, also "
                          "when the passage does not answer the question.")
        return CardText(outputs="`answer`: the answer's text, its `start` and `end` characters in the passage "
                                "and its `score`",
                        raw_outputs="`[batch, seq, 2]`: the start and end score of each token",
                        pipeline_tag=self.hf_pipeline, limits=limits,
                        example={"question": "Where does the tower stand?",
                                 "context": "The tower was finished in 1889 and stands in Paris."})

    def hf_usage(self, path: str) -> str:
        """`AutoModelForQuestionAnswering` and the best span of one window (transformers 5 has no
        question-answering pipeline)."""
        example = self.card_text().example
        return (f"import torch\n"
                f"from transformers import AutoModelForQuestionAnswering, AutoTokenizer\n\n"
                f"tokenizer = AutoTokenizer.from_pretrained({path!r})\n"
                f"model = AutoModelForQuestionAnswering.from_pretrained({path!r}).eval()\n"
                f"question, context = {example['question']!r}, {example['context']!r}\n"
                f"inputs = tokenizer(question, context, return_tensors='pt', truncation='only_second', "
                f"max_length={int(self.spec.max_length)})\n"
                f"with torch.no_grad():\n"
                f"    out = model(**inputs)\n"
                f"start, end = int(out.start_logits[0].argmax()), int(out.end_logits[0].argmax())\n"
                f"print(tokenizer.decode(inputs['input_ids'][0][start:end + 1]))\n")

    # -- export --to hf: the linear layer into qa_outputs ----------------------------------------
    def hf_labels(self) -> list[str]:
        return ["start", "end"]

    def hf_copy_head(self, model: nn.Module, name: str) -> None:
        copy_into(model, self.head, FAMILIES[self.spec.head_family or "bert"].span_keys, f"head {name!r}")

    def hf_outputs(self, out) -> torch.Tensor:
        return torch.stack([out.start_logits, out.end_logits], dim=-1)

    def hf_pipeline_options(self) -> dict:
        spec = self.spec
        return {"max_answer_len": spec.max_answer_length, "doc_stride": spec.stride, "max_seq_len": spec.max_length,
                "max_question_len": spec.max_question_length}

    # -- plain inputs for `extract` ---------------------------------------------------------
    @classmethod
    def sniff_format(cls, path: str) -> str | None:
        if Path(path).suffix.lower() == ".json" and read_text(path).lstrip().startswith("{"):
            return "squad"
        return None

    @classmethod
    def claims_records(cls, keys: set[str]) -> bool:
        return {"question", "context"} <= keys

    @classmethod
    def read_texts(cls, path: str | None, fmt: str) -> list[TextInput]:
        """Each question with its passage as a pair (and its id)."""
        return [TextInput(e.question, e.context, line_of(e.record), {"id": e.id} if e.has_id or fmt == "squad" else {})
                for e in read_examples(path, need_labels=False, fmt=fmt)]

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
                keep = np.isfinite(scores[j]) & (offsets[ends[j], 1] > offsets[starts[j], 0])  # no empty text
                chars = np.stack([offsets[starts[j][keep], 0], offsets[ends[j][keep], 1]], axis=1)
                per_example[owner[i]].append((scores[j][keep], chars, float(null[j]),
                                              room[j][keep] if by_context else None, probs[j][keep],
                                              float(null_probs[j])))
        return [merge_windows(parts, spec.n_best, relative) for parts in per_example]

    # -- loss and decoding ---------------------------------------------------------------
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

    def threshold(self, null_threshold: float | None = None) -> float | None:
        return self.spec.null_threshold if null_threshold is None else float(null_threshold)

    def decode(self, outputs: list[QAOutput], examples: list[QAExample], null_threshold: float | None = None,
               **_) -> list[dict]:
        """`{"answer", "start", "end", "score", "raw_score"}` with `context[start:end] == answer`:
        `score` is the span's probability, P(start) * P(end) in its window as the transformers
        pipeline reports it, `raw_score` the score spans are ranked and thresholded by (start +
        end logits; relative to the window's null score with `window_choice` relative). An
        empty answer (start = end = 0) when the model answers nothing, with [CLS]'s probability
        and the null score."""
        threshold = self.threshold(null_threshold)
        out = []
        for o, e in zip(outputs, examples):
            if answers_nothing(o, threshold):
                pred = {"answer": "", "start": 0, "end": 0, "score": probability(o.null_probability),
                        "raw_score": round(o.null_score, 4)}
            else:
                s, t = (int(x) for x in o.spans[0])
                pred = {"answer": e.context[s:t], "start": s, "end": t,
                        "score": probability(None if o.probabilities is None else o.probabilities[0]),
                        "raw_score": round(float(o.scores[0]), 4)}
            out.append({**({"id": e.id} if e.has_id else {}), **e.extra, **pred})
        return out

    def metrics(self, outputs: list[QAOutput], examples: list[QAExample], path=None,
                null_threshold: float | None = None, predictions_out: str | None = None,
                during_training: bool = False, **_) -> dict:
        """SQuAD EM and F1 (v2.0's with HasAns/NoAns when some questions have no answer).
        After an epoch (`during_training`) a v2.0 model's null threshold is tuned here."""
        spec = self.spec
        best_text = [e.context[int(o.spans[0][0]):int(o.spans[0][1])] if len(o.scores) else ""
                     for o, e in zip(outputs, examples)]
        if during_training and spec.unanswerable and spec.tune_threshold and null_threshold is None:
            diffs = np.array([null_minus_best(o) for o in outputs])
            has_answer = np.array([bool(e.answers) for e in examples])
            span_f1 = np.array([max_over(f1_v2, t, gold_v2(e.answers)) if e.answers else 0.0
                                for t, e in zip(best_text, examples)])
            spec.null_threshold = best_threshold(diffs, has_answer, span_f1)
        threshold = self.threshold(null_threshold)
        preds = ["" if answers_nothing(o, threshold) else text for o, text in zip(outputs, best_text)]
        if any(not e.answers for e in examples):
            result = squad_v2_scores(preds, examples)
        else:
            result = squad_v1_scores(preds, examples)
        if spec.unanswerable or threshold is not None:
            result["null_threshold"] = None if threshold is None else round(float(threshold), 4)
        if predictions_out:
            write_predictions(predictions_out, preds, outputs, examples)
        return result


    def metric_part(self, outputs: list[QAOutput], examples: list[QAExample], path=None,
                    null_threshold: float | None = None, predictions_out: str | None = None, **_):
        """A chunk's per-question scores (v1.1 and v2.0 forms: which one applies is known only at
        the end) under the saved or given null threshold. With `predictions_out` every output
        and example is kept, as the prediction files hold them all."""
        if predictions_out:
            return super().metric_part(outputs, examples)
        threshold = self.threshold(null_threshold)
        preds = ["" if answers_nothing(o, threshold) else e.context[int(o.spans[0][0]):int(o.spans[0][1])]
                 for o, e in zip(outputs, examples)]
        has = np.array([bool(e.answers) for e in examples], dtype=bool)
        v1 = np.array([(max_over(exact, p, e.answers), max_over(f1_v1, p, e.answers)) if e.answers else (0.0, 0.0)
                       for p, e in zip(preds, examples)]).reshape(-1, 2)
        v2 = np.array([(max_over(exact, p, gold_v2(e.answers)), max_over(f1_v2, p, gold_v2(e.answers)))
                       for p, e in zip(preds, examples)]).reshape(-1, 2)
        return has, v1, v2

    def metrics_from_parts(self, parts: list, path=None, null_threshold: float | None = None,
                           predictions_out: str | None = None, **options) -> dict:
        if predictions_out:
            return super().metrics_from_parts(parts, path, null_threshold=null_threshold,
                                              predictions_out=predictions_out, **options)
        has = np.concatenate([p[0] for p in parts])
        if has.all():
            v1 = np.concatenate([p[1] for p in parts])
            result = {"exact_match": 100.0 * float(v1[:, 0].mean()), "f1": 100.0 * float(v1[:, 1].mean()),
                      "examples": len(has)}
        else:
            v2 = np.concatenate([p[2] for p in parts])
            result = {"exact_match": 100.0 * float(v2[:, 0].mean()), "f1": 100.0 * float(v2[:, 1].mean()),
                      "examples": len(has)}
            for name, mask in (("HasAns", has), ("NoAns", ~has)):
                if mask.any():
                    result[f"{name}_exact"] = 100.0 * float(v2[mask, 0].mean())
                    result[f"{name}_f1"] = 100.0 * float(v2[mask, 1].mean())
                    result[f"{name}_total"] = int(mask.sum())
        threshold = self.threshold(null_threshold)
        if self.spec.unanswerable or threshold is not None:
            result["null_threshold"] = None if threshold is None else round(float(threshold), 4)
        return result


# -- settings ------------------------------------------------------------------------------
def check_settings(spec: QASpec, encoder) -> None:
    tokenizer = encoder.tokenizer
    limit = encoder.info.max_tokens
    if limit is not None and spec.max_length > limit:
        raise UserError(f"--max-length {spec.max_length}: the encoder reads at most {limit} tokens")
    for name in ("stride", "max_question_length", "n_best", "max_answer_length"):
        if getattr(spec, name) < 1:
            raise UserError(f"--{name.replace('_', '-')}: must be at least 1, got {getattr(spec, name)}")
    window_choice_parts(spec.window_choice)
    for name in ("negative_windows", "join_passages", "paragraph_match"):
        if getattr(spec, name) < 0:
            raise UserError(f"--{name.replace('_', '-')}: must be at least 0, got {getattr(spec, name)}")
    room = spec.max_length - spec.max_question_length - tokenizer.num_special_tokens_to_add(pair=True)
    if room <= spec.stride:
        raise UserError(f"--stride {spec.stride} must be smaller than the passage room in a window "
                        f"({room} tokens: --max-length {spec.max_length} minus --max-question-length "
                        f"{spec.max_question_length} and the special tokens)")


# -- windows ---------------------------------------------------------------------------------
def line_of(record: str) -> int | None:
    """The line number in a "FILE:LINE" record name, if it has one."""
    tail = record.rpartition(":")[2]
    return int(tail) if tail.isdigit() else None
