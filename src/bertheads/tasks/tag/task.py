"""Token tagging: one tag per word (NER, chunking) read from the token states.

Formats: CoNLL columns (word first, tag last or `--tag-column`; blank lines end a sentence,
`-DOCSTART-` lines are skipped) and JSONL `{"tokens": [...], "tags": [...]}`; predict also
takes raw text (one text a line, or JSONL `{"text": ...}`) and returns entities with character
offsets. Schemes: IOB2, IOB1, IOBES and BILOU, decoded with the conlleval rules that seqeval's
default mode applies.

A word is predicted from its first word piece. An input longer than `max_length` is cut into
windows overlapping by `stride` tokens; each word takes its prediction from the window where its
first piece has the most context on both sides. Readers are in `tag_formats`, schemes and
entity metrics in `tag_scheme`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from bertheads.base.errors import UserError, where
from bertheads.base.values import non_negative_int, positive_int
from bertheads.encoder.layers import LayerCombine
from bertheads.tasks.base import CardText, HeadSettings, Task, TextInput, init_linear, softmax
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
from bertheads.tasks.tag.formats import (
    CONLL_SUFFIXES,
    TagExample,
    iter_tagged,
    read_tagged,
    separator,
)
from bertheads.tasks.tag.report import tag_section
from bertheads.tasks.tag.scheme import (
    detect_scheme,
    entity_errors,
    entity_metrics,
    entity_spans,
    inside,
    scheme_codes,
    tag_list,
)
from bertheads.text.encoding import window_count
from bertheads.text.offsets import blank_pieces, drop_blank, text_words
from bertheads.text.readers import source_name

BIG = 1 << 30


@dataclass
class TagSpec(HeadSettings):
    tags: list = field(default_factory=list)  # tag names in output order ("O" first)
    scheme: str = "IOB2"  # IOB2, IOB1, IOBES or BILOU (found in the training tags)
    tag_column: int | None = None  # 1-based CoNLL column of the tag; None: the last one
    label_subwords: str = "first"  # or "all": continuation pieces learn I-TYPE too
    stride: int = 32  # tokens shared by neighbouring windows of a long input
    head_type: str = "linear"  # or "bilstm"
    lstm_size: int | None = None  # per direction; None: the encoder's hidden size


@dataclass
class WordScores:
    """What `collect` returns for one example: tag probabilities per word (and, for raw
    text, each word's character span)."""

    probs: np.ndarray  # (words, tags)
    spans: np.ndarray | None = None  # (words, 2) start, end offsets in the text


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


class TagTask(Task):
    kind = "tag"
    spec_type = TagSpec
    main_metric = "f1"
    help = "one tag per word (NER, chunking) from the token states; entities with offsets"
    shows = "entities"
    hf_auto_class = "AutoModelForTokenClassification"
    hf_pipeline = "token-classification"

    @classmethod
    def add_arguments(cls, parser) -> None:
        parser.add_argument("--tag-column", type=int,
                            help="CoNLL column holding the tag, counted from 1 (negative: from the end); default: last")
        parser.add_argument("--label-subwords", choices=("first", "all"), default="first",
                            help="train on each word's first piece (default) or on all its pieces")
        parser.add_argument("--stride", type=non_negative_int, default=32,
                            help="tokens of overlap between the windows of an input longer than --max-length")
        parser.add_argument("--head", dest="head_type", choices=("linear", "bilstm"), default="linear",
                            help="linear layer over the token states, or a 2-layer BiLSTM then the linear layer")
        parser.add_argument("--lstm-size", type=positive_int,
                            help="bilstm: units per direction (default: the encoder's hidden size)")

    @classmethod
    def build(cls, spec: TagSpec, encoder, pooler_state=None) -> TagTask:
        """A fresh head; `pooler_state`: the checkpoint's weights a family's token block starts from."""
        family = settle_family(spec, encoder)
        head = TagHead(encoder.info.hidden_size, len(spec.tags), spec, family, getattr(encoder, "config", None))
        if head.dense is not None:
            copy_start(head.dense, head.norm, pooler_state)
        return cls(spec, head)

    @classmethod
    def prepare(cls, path: str, spec: TagSpec, encoder):
        """Read the training file, settle the scheme and tag list, build the head."""
        check_settings(spec, encoder.tokenizer)
        examples = read_tagged(path, spec, fmt=None, need_labels=True)
        spec.scheme = detect_scheme(examples, path)
        spec.tags = tag_list(examples, spec.label_subwords == "all")
        if len(spec.tags) < 2:
            raise UserError(f"{where(path)}: training data has only one tag ({spec.tags[0]!r}); need at least two")
        family = settle_family(spec, encoder)  # ModernBERT's token block starts from its masked-LM head
        start = start_weights(family, encoder) if family.token_dense else None
        return cls.build(spec, encoder, start), examples

    # -- reading ------------------------------------------------------------------------
    def read(self, path: str | None, need_labels: bool = True, fmt: str | None = None, **_) -> list[TagExample]:
        examples = read_tagged(path, self.spec, fmt, need_labels)
        if need_labels:
            known = set(self.spec.tags)
            for e in examples:
                for tag, line in zip(e.tags, e.word_lines or [e.line] * len(e.tags)):
                    if tag not in known:
                        raise UserError(f"{where(path, line)}: tag {tag!r} was not seen in training "
                                        f"(known: {', '.join(self.spec.tags)})")
        return examples

    def iter_read(self, path, need_labels: bool = True, fmt: str | None = None, keep: tuple[str, ...] = (),
                  bad=None, **_) -> Iterator[TagExample]:
        """`read`, one sentence at a time as the input is read (`bad`: see `iter_tagged`)."""
        known = set(self.spec.tags)
        name = source_name(path)
        for e in iter_tagged(path, self.spec, fmt, need_labels, keep, bad):
            if need_labels:
                unknown = [(t, line) for t, line in zip(e.tags, e.word_lines or [e.line] * len(e.tags))
                           if t not in known]
                if unknown:
                    tag, line = unknown[0]
                    error = UserError(f"{where(name, line)}: tag {tag!r} was not seen in training "
                                      f"(known: {', '.join(self.spec.tags)})")
                    if bad is None:
                        raise error
                    bad(error)
                    continue
            yield e

    def from_inputs(self, inputs: list, **_) -> list[TagExample]:
        """Examples from Python values: a raw text, a list of words, or a dict with
        "text" or "tokens"."""
        out = []
        for i, item in enumerate(inputs):
            if isinstance(item, dict):
                item = item.get("text", item.get("tokens", item.get("words")))
            if isinstance(item, str):
                if not item.strip():
                    raise UserError(f"input {i}: empty text")
                out.append(TagExample(text=item))
            elif isinstance(item, (list, tuple)) and item and all(isinstance(w, str) for w in item):
                out.append(TagExample(words=list(item)))
            else:
                raise UserError(f"input {i}: expected a text, a list of words or a dict with 'text' or 'tokens'")
        return out

    # -- encoding -----------------------------------------------------------------------
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

    def encoder_cost(self, tokens: int, second: int | None, question: int | None) -> tuple[tuple, int] | None:
        """A text longer than max_length runs as overlapping windows."""
        length, stride = int(self.spec.max_length), int(self.spec.stride)
        if tokens + 2 <= length:
            return ("whole",), tokens + 2
        return ("tag", length, stride), window_count(tokens, length - 2, stride) * length

    def output_hint(self) -> str:
        return f" ({len(self.spec.tags)} tags)"

    def describe(self) -> dict:
        return {**super().describe(), "labels": list(self.spec.tags),
                "entity_types": sorted({t.split("-", 1)[1] for t in self.spec.tags if "-" in t})}

    def report_section(self, outputs: list, examples: list, metrics: dict, section) -> None:
        tag_section(self, outputs, examples, metrics, section)

    # -- the model card ------------------------------------------------------------------------
    def card_text(self) -> CardText:
        spec = self.spec
        types = sorted({t.split("-", 1)[1] for t in spec.tags if "-" in t})
        limits = [f"It finds entities of the types of its training file only ({', '.join(types) or 'none'}), "
                  f"as spans of whole words ({spec.scheme} tags; a word's tag is read from its first piece).",
                  f"Texts longer than {spec.max_length} tokens are read in overlapping windows "
                  f"({spec.stride} tokens shared)."]
        if spec.head_type == "bilstm":
            limits.append("Its BiLSTM layer has no transformers or ONNX form: only the torch runtime runs it.")
        return CardText(outputs="`entities`: each entity's text, type, start and end characters and score (for "
                                "given words: `tokens`, `tags` and entities by word index)",
                        raw_outputs=f"`[batch, seq, {len(spec.tags)}]`: one score per tag for each token",
                        pipeline_tag=self.hf_pipeline, labels=list(spec.tags), labels_title="tags", limits=limits,
                        example="Angela Merkel visited Paris last week.")

    # -- export --to hf: the linear layer into the token classifier ----------------------------
    def hf_check(self, name: str) -> None:
        if self.spec.head_type != "linear":
            raise UserError(f"head {name!r}: a BiLSTM tag head has no transformers equivalent")

    def hf_labels(self) -> list[str]:
        return list(self.spec.tags)

    def onnx_check(self, name: str) -> None:
        if self.spec.head_type == "bilstm":
            raise UserError(f"head {name!r}: a BiLSTM tag head cannot be exported to ONNX "
                            f"(its packed sequences have no ONNX form); use the torch runtime")

    def hf_copy_head(self, model: nn.Module, name: str) -> None:
        copy_into(model, self.head, FAMILIES[self.spec.head_family or "bert"].token_keys, f"head {name!r}")

    def hf_pipeline_options(self) -> dict:
        return {"aggregation_strategy": "first"}

    # -- plain inputs for `extract` ---------------------------------------------------------
    text_formats = ("conll", "jsonl")

    @classmethod
    def sniff_format(cls, path: str) -> str | None:
        return "conll" if str(path).lower().endswith(CONLL_SUFFIXES) else None

    @classmethod
    def claims_records(cls, keys: set[str]) -> bool:
        return bool(keys & {"tokens", "words"})

    @classmethod
    def read_texts(cls, path: str | None, fmt: str) -> list[TextInput]:
        """Each sentence's words joined by single spaces; `extra["words"]` holds each word's span."""
        out = []
        for e in read_tagged(path, TagSpec(), fmt, need_labels=False):
            if e.words is None:
                raise UserError(f"{where(path, e.line)}: 'tokens' must be a non-empty list of non-empty strings")
            spans, position = [], 0
            for word in e.words:
                spans.append([position, position + len(word)])
                position += len(word) + 1
            out.append(TextInput(" ".join(e.words), None, e.line, {"words": spans}))
        return out

    def encode_windows(self, examples: list[TagExample], tokenizer, with_labels: bool,
                       path: str | None = None, for_inference: bool | None = None) -> tuple[list[dict], list[int]]:
        """Features (one per window) and the example each belongs to.

        The whole input is tokenized once with offsets; a raw text is split into words by
        `text.offsets.text_words` (the same rules whatever the tokenizer; each word's span has no
        surrounding whitespace), pre-tokenized inputs are joined with spaces and each token is
        mapped to its word by offset (a word that yields no piece is encoded as the unknown
        token). A leading-space marker alone (`▁`, `Ġ`) is not a word's first piece unless it is
        its only one. A text that fits
        gets exactly the ids `packing.encode_texts` gives it. `for_inference` (default: when
        without labels) adds what `collect` needs to put word scores together."""
        if for_inference is None:
            for_inference = not with_labels
        spec = self.spec
        n_prefix, n_suffix = special_layout(tokenizer)
        capacity = spec.max_length - n_prefix - n_suffix
        if not 0 <= spec.stride < capacity:
            raise UserError(f"--stride {spec.stride} must be at least 0 and below --max-length minus "
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
                    ids, tt, word = self.encode_with_unknowns(e.words, word, tokenizer, n_prefix, n_suffix)
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

    @staticmethod
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

    # -- loss and decoding --------------------------------------------------------------
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

    def collect(self, feature_outputs: list[np.ndarray], owner: list[int], examples, features) -> list[WordScores]:
        """One row of tag scores per word: from the example's only window, or from the window
        where the word's first piece has the most context."""
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
        probs = softmax(np.concatenate(rows).astype(np.float32)) if rows else np.zeros((0, len(self.spec.tags)))
        parts = np.split(probs, np.cumsum([len(r) for r in rows])[:-1])
        return [WordScores(p, s) for p, s in zip(parts, spans)]

    def predicted_tags(self, outputs: list[WordScores]) -> list[list[str]]:
        tags = self.spec.tags
        return [[tags[i] for i in o.probs.argmax(-1).tolist()] for o in outputs]

    def decode(self, outputs: list[WordScores], examples: list[TagExample], **_) -> list[dict]:
        """Entities (with character offsets for raw text, word indices for word input)."""
        codes, types = scheme_codes(self.spec.tags)
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
            if e.text is not None:
                result = {"entities": entities}
            else:
                result = {"tokens": e.words, "tags": [self.spec.tags[i] for i in best], "entities": entities}
            results.append({**e.extra, **result} if e.extra else result)
        return results

    def metrics(self, outputs: list[WordScores], examples: list[TagExample], path=None, **_) -> dict:
        """Entity precision, recall and F1 (micro and per type) as seqeval's default mode
        (conlleval rules) computes them, word accuracy, and the span and type errors
        (`tag_scheme.entity_errors`)."""
        return self.metrics_from_parts([self.metric_part(outputs, examples, path)])

    def metrics_from_parts(self, parts: list, path=None, **_) -> dict:
        gold, pred = [t for p in parts for t in p[0]], [t for p in parts for t in p[1]]
        return {**entity_metrics(gold, pred), **entity_errors(gold, pred)}

    def metric_part(self, outputs: list[WordScores], examples: list[TagExample], path=None, **_):
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


def check_settings(spec: TagSpec, tokenizer) -> None:
    if spec.label_subwords not in ("first", "all"):
        raise UserError(f"--label-subwords: expected first or all, got {spec.label_subwords!r}")
    if spec.head_type not in ("linear", "bilstm"):
        raise UserError(f"--head: expected linear or bilstm, got {spec.head_type!r}")
    n_prefix, n_suffix = special_layout(tokenizer)
    if spec.max_length <= n_prefix + n_suffix + 1:
        raise UserError(f"--max-length {spec.max_length} is too small")


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
