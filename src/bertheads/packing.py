"""Packing inputs the BERT way and batching them.

One text becomes `[CLS] A [SEP]`, a pair `[CLS] A [SEP] B [SEP]` with segment ids
(the tokenizer supplies the model's own special tokens, so RoBERTa gets `<s> A </s></s> B </s>`).
Batches are padded only to their own longest member; training batches are grouped by
length (then shuffled as groups) and inference runs sorted by length, with the input
order restored on output.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from tqdm.auto import tqdm

from bertheads.errors import UserError

Feature = dict  # one encoded input: input_ids, token_type_ids and task fields (labels, ...)


def encode_texts(
    tokenizer,
    texts: Sequence[str],
    pairs: Sequence[str | None] | None = None,
    max_length: int = 128,
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
    enc = tokenizer(
        list(texts),
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
    max_length: int = 128,
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
    """Pad a batch to its longest member. Token-aligned list fields are padded with `label_pad`.

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
        if key.startswith("tok_"):  # one value per token: pad to the batch length
            t = np.full((n, longest), label_pad, dtype=np.int64)
            for i, v in enumerate(values):
                t[i, : len(v)] = v
            batch[key] = torch.from_numpy(t)
        else:
            batch[key] = torch.as_tensor(values)
    return batch


def length_grouped_batches(
    lengths: Sequence[int], batch_size: int, seed: int, group_factor: int = 50,
    groups: Sequence | None = None,
) -> list[list[int]]:
    """Training batches of similar lengths: shuffle, sort within chunks of
    `batch_size * group_factor` examples, cut into batches, shuffle the batches. With `groups`
    (a group id per example) the examples of one group stay together in one batch (a group of
    more than `batch_size` makes a batch of its own)."""
    rng = random.Random(seed)
    if groups is None:
        units = [[i] for i in range(len(lengths))]
    else:
        members: dict = {}
        for i, g in enumerate(groups):
            members.setdefault(g, []).append(i)
        units = list(members.values())
    rng.shuffle(units)
    chunk = batch_size * group_factor
    batches: list[list[int]] = []
    start = 0
    while start < len(units):
        end, size = start, 0
        while end < len(units) and size < chunk:
            size += len(units[end])
            end += 1
        part = sorted(units[start:end], key=lambda u: -max(lengths[i] for i in u))
        current: list[int] = []
        for unit in part:
            if current and len(current) + len(unit) > batch_size:
                batches.append(current)
                current = []
            current.extend(unit)
        if current:
            batches.append(current)
        start = end
    rng.shuffle(batches)
    return batches


def encoder_batch(features: Sequence[Feature], pad_id: int, device: torch.device) -> dict[str, torch.Tensor]:
    """The encoder's inputs alone (ids, segments, mask) for these features, padded, on `device`
    (labels and task fields are left out: for runs that need only the encoder's states)."""
    batch = collate([{"input_ids": f["input_ids"], "token_type_ids": f.get("token_type_ids")} for f in features],
                    pad_id)
    return {k: v.to(device) for k, v in batch.items()}


# Inference batches: at most this many examples and this many (padded) tokens. Measured on
# 2 CPU cores with the default checkpoint (bench/RESULTS.md): SST-2 sentences ran fastest at
# 32-64 a batch, SQuAD windows of 384 tokens at about 5 a batch (2048 tokens; 16k tokens was
# 25% slower); larger batches leave the CPU caches.
INFERENCE_BATCH = 64
INFERENCE_TOKENS = 2048


def sorted_batches(lengths: Sequence[int], batch_size: int, max_tokens: int | None = None) -> list[list[int]]:
    """Inference batches in order of length (longest first); `max_tokens` caps padded size."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        width = lengths[current[0]] if current else lengths[i]
        if current and (len(current) >= batch_size or (max_tokens and width * (len(current) + 1) > max_tokens)):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


# At most this many batches in flight on a CPU: each holds its own activations, so memory
# grows with their number; beyond it, each worker gets several threads instead.
MAX_CPU_WORKERS = 8


def run_batches(batches: list[list[int]], run: Callable[[list[int]], None], device: torch.device,
                bar=None) -> None:
    """Call `run(idx)` for every inference batch, under `torch.inference_mode()`.

    On a CPU with several torch threads, batches run side by side on worker threads (see
    `cpu_workers`), otherwise in order; `run` must write its results where they belong.
    `bar` (a tqdm bar) advances by each batch's size, from the calling thread. The workers'
    thread setting does not leak: the caller's count is set again afterwards, which is also
    what threads started later inherit.
    """

    def job(idx: list[int]) -> int:
        with torch.inference_mode():
            run(idx)
        return len(idx)

    workers, threads = cpu_workers(device, len(batches))
    if workers > 1:
        before = torch.get_num_threads()
        try:
            with ThreadPoolExecutor(workers, initializer=torch.set_num_threads, initargs=(threads,)) as pool:
                for done in pool.map(job, batches):
                    if bar is not None:
                        bar.update(done)
        finally:
            torch.set_num_threads(before)
    else:
        for idx in batches:
            done = job(idx)
            if bar is not None:
                bar.update(done)


def cpu_workers(device: torch.device, batches: int) -> tuple[int, int]:
    """How many batches run at once, and with how many torch threads each.

    On a CPU, one batch per torch thread, each single-threaded (up to `MAX_CPU_WORKERS`
    batches; past that, the threads are shared out among them). Short inputs make small
    matrices, and a small matrix product split across cores spends a good part of its time
    waiting; separate batches on separate cores do not (about 9% more sentences per second on
    2 cores, bench/RESULTS.md). The thread count is per thread, so the caller's own setting
    is untouched. `torch.set_num_threads(1)` before a call keeps it serial.
    """
    threads = torch.get_num_threads()
    if device.type != "cpu" or batches < 2 or threads < 2:
        return 1, threads
    workers = min(threads, batches, MAX_CPU_WORKERS)
    return workers, max(1, threads // workers)


def run_in_length_order(features: Sequence[Feature], run: Callable[[list[int]], None], device: torch.device,
                        batch_size: int = INFERENCE_BATCH, max_tokens: int | None = INFERENCE_TOKENS,
                        progress: str | None = None, unit: str = "ex") -> None:
    """The one inference batch loop: `run(idx)` for batches of `features` sorted by length
    (each padded only to its own longest member), side by side on a CPU (`run_batches`), with
    a progress bar named `progress` (none when it is None)."""
    lengths = [len(f["input_ids"]) for f in features]
    bar = tqdm(total=len(features), desc=progress, unit=unit, disable=True if progress is None else None,
               leave=False, dynamic_ncols=True)
    try:
        run_batches(sorted_batches(lengths, batch_size, max_tokens), run, device, bar)
    finally:
        bar.close()


def shard(batches: list[list[int]], rank: int, world: int) -> Iterator[list[int]]:
    """The batches one process of `world` takes (all of them when running alone)."""
    usable = len(batches) - len(batches) % world if world > 1 else len(batches)
    yield from batches[rank:usable:world]


def window_count(tokens: int, room: int, stride: int) -> int:
    """How many windows of `room` body tokens, neighbours sharing `stride`, cover `tokens`."""
    if tokens <= room:
        return 1
    step = max(1, room - stride)
    return 1 + math.ceil((tokens - room) / step)
