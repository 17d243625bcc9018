"""Packing inputs the BERT way: one text as `[CLS] A [SEP]`, a pair as `[CLS] A [SEP] B [SEP]` with
segment ids (the tokenizer supplies the model's own special tokens, so RoBERTa gets
`<s> A </s></s> B </s>`), long inputs cut into windows, and a batch padded to its own longest member.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from bertheads.base.errors import UserError

Feature = dict  # one encoded input: input_ids, token_type_ids and task fields (labels, ...)
MAX_LENGTH = 128  # tokens per input unless a task kind or setting says otherwise

# A truncated text is tokenized only as far as it is read: a prefix of CHARS_PER_TOKEN
# characters a token (doubled until it holds enough), whose tokens ending CUT_MARGIN characters
# before the cut are those of the whole text (pre-tokenizers split locally, and WordPiece reads a
# word of more than 100 characters as one unknown token).
CHARS_PER_TOKEN = 8
CUT_MARGIN = 256


def readable_prefix(tokenizer, text: str, max_tokens: int) -> str:
    """The start of `text` that holds its first `max_tokens` tokens exactly as the whole text
    gives them (the text itself when it is short), so a huge input costs no more than a long one."""
    size = CHARS_PER_TOKEN * max_tokens + CUT_MARGIN
    while size < len(text):
        cut = text[:size]
        ends = tokenizer(cut, add_special_tokens=False, return_offsets_mapping=True, verbose=False)["offset_mapping"]
        if sum(1 for _, end in ends if end <= size - CUT_MARGIN) >= max_tokens:
            return cut
        size *= 2
    return text


def encode_texts(
    tokenizer,
    texts: Sequence[str],
    pairs: Sequence[str | None] | None = None,
    max_length: int = MAX_LENGTH,
    offsets: bool = False,
) -> list[Feature]:
    """Encode single texts or pairs, truncating pairs longest-first to `max_length` tokens."""
    if not texts:
        return []
    has_pairs = pairs is not None and any(p is not None for p in pairs)
    if has_pairs and any(p is None for p in pairs):
        # mixed singles and pairs: encode the two groups apart, keep the order
        out: list[Feature | None] = [None] * len(texts)
        single = [i for i, p in enumerate(pairs) if p is None]
        double = [i for i, p in enumerate(pairs) if p is not None]
        for idx, feats in (
            (single, encode_texts(tokenizer, [texts[i] for i in single], None, max_length, offsets)),
            (double, encode_texts(tokenizer, [texts[i] for i in double], [pairs[i] for i in double],
                                  max_length, offsets)),
        ):
            for i, f in zip(idx, feats):
                out[i] = f
        return out  # type: ignore[return-value]
    texts = [readable_prefix(tokenizer, t, max_length) for t in texts]
    if has_pairs:
        pairs = [readable_prefix(tokenizer, p, max_length) for p in pairs]
    enc = tokenizer(
        texts,
        list(pairs) if has_pairs else None,
        truncation="longest_first",
        max_length=max_length,
        padding=False,
        return_attention_mask=False,
        return_token_type_ids=True,
        return_offsets_mapping=offsets,
    )
    feats = []
    for i in range(len(texts)):
        f = {"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i]}
        if offsets:
            f["offset_mapping"] = enc["offset_mapping"][i]
        feats.append(f)
    return feats


def encode_windows(
    tokenizer,
    texts: Sequence[str],
    pairs: Sequence[str | None] | None = None,
    max_length: int = MAX_LENGTH,
    stride: int = 32,
) -> tuple[list[Feature], list[int]]:
    """Each input cut into windows of at most `max_length` tokens, neighbours sharing `stride`
    tokens (a pair keeps its first text whole in every window and cuts the second); an input
    that fits is one window, exactly as `encode_texts` encodes it. Returns the windows and,
    for each, the index of its input."""
    features: list[Feature] = []
    owner: list[int] = []
    if not texts:
        return features, owner
    groups = [(list(range(len(texts))), None)]
    if pairs is not None and any(p is not None for p in pairs):
        single = [i for i, p in enumerate(pairs) if p is None]
        double = [i for i, p in enumerate(pairs) if p is not None]
        groups = [(single, None), (double, [pairs[i] for i in double])]
    parts: list[tuple[int, Feature]] = []
    for idx, second in groups:
        if not idx:
            continue
        try:
            enc = tokenizer([texts[i] for i in idx], second, truncation="only_second" if second else True,
                            max_length=max_length, stride=stride, return_overflowing_tokens=True, padding=False,
                            return_attention_mask=False, return_token_type_ids=True)
        except Exception as exc:  # the first text of a pair alone is longer than a window
            raise UserError(f"cannot cut the inputs into windows of {max_length} tokens with {stride} shared: "
                            f"{str(exc).splitlines()[0]}") from None
        for w, k in enumerate(enc["overflow_to_sample_mapping"]):
            parts.append((idx[int(k)], {"input_ids": enc["input_ids"][w], "token_type_ids": enc["token_type_ids"][w]}))
    parts.sort(key=lambda p: p[0])  # stable: an input's windows stay in text order
    for k, f in parts:
        features.append(f)
        owner.append(k)
    return features, owner


def collate(features: Sequence[Feature], pad_id: int, label_pad: int = -100) -> dict[str, torch.Tensor]:
    """Pad a batch to its longest member. Token-aligned list fields (`tok_*`) are padded with
    `label_pad`, token-aligned rows of numbers (`soft_tok_*`) with zeros.

    Rows are filled in NumPy and handed to torch once per field (a tensor per row costs more
    than the model's small operations on short inputs)."""
    longest = max(len(f["input_ids"]) for f in features)
    n = len(features)
    input_ids = np.full((n, longest), pad_id, dtype=np.int64)
    token_type_ids = np.zeros((n, longest), dtype=np.int64)
    attention_mask = np.zeros((n, longest), dtype=np.int64)
    for i, f in enumerate(features):
        k = len(f["input_ids"])
        input_ids[i, :k] = f["input_ids"]
        if f.get("token_type_ids") is not None:
            token_type_ids[i, :k] = f["token_type_ids"]
        attention_mask[i, :k] = 1
    batch = {"input_ids": torch.from_numpy(input_ids), "token_type_ids": torch.from_numpy(token_type_ids),
             "attention_mask": torch.from_numpy(attention_mask)}
    for key in features[0]:
        if key in batch or key == "offset_mapping" or key.startswith("_"):
            continue
        values = [f[key] for f in features]
        if key.startswith("soft_tok_"):  # a row of numbers per token (a teacher's scores): zeros pad
            rows = [np.asarray(v, dtype=np.float32) for v in values]
            t = np.zeros((n, longest, rows[0].shape[-1]), dtype=np.float32)
            for i, v in enumerate(rows):
                t[i, : len(v)] = v
            batch[key] = torch.from_numpy(t)
        elif key.startswith("tok_"):  # one value per token: pad to the batch length
            t = np.full((n, longest), label_pad, dtype=np.int64)
            for i, v in enumerate(values):
                t[i, : len(v)] = v
            batch[key] = torch.from_numpy(t)
        else:
            batch[key] = torch.as_tensor(values)
    return batch


def to_device(tensors, device: torch.device):
    """A tensor, a list of tensors or a dict of them on `device`. To a GPU they go from pinned
    memory without waiting: a plain copy from ordinary memory makes the host wait until the GPU
    has finished everything queued before it, so the next batch could not be queued meanwhile."""
    if isinstance(tensors, dict):
        return {k: to_device(v, device) for k, v in tensors.items()}
    if isinstance(tensors, list):
        return [to_device(v, device) for v in tensors]
    if device.type == "cuda" and tensors.device.type == "cpu":
        return tensors.pin_memory().to(device, non_blocking=True)
    return tensors.to(device)


def encoder_batch(features: Sequence[Feature], pad_id: int, device: torch.device) -> dict[str, torch.Tensor]:
    """The encoder's inputs alone (ids, segments, mask) for these features, padded, on `device`
    (labels and task fields are left out: for runs that need only the encoder's states)."""
    batch = collate([{"input_ids": f["input_ids"], "token_type_ids": f.get("token_type_ids")} for f in features],
                    pad_id)
    return to_device(batch, device)



def window_count(tokens: int, room: int, stride: int) -> int:
    """How many windows of `room` body tokens, neighbours sharing `stride`, cover `tokens`."""
    if tokens <= room:
        return 1
    step = max(1, room - stride)
    return 1 + math.ceil((tokens - room) / step)
