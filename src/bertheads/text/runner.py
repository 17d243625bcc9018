"""The one inference loop of head outputs. A `Runner` is one runtime's forward pass (the torch
model, an ONNX Runtime session, a head over cached encoder states): a batch of features in,
each head's outputs out. `run_features` does the rest once: length order, batches, CPU worker
threads, progress, token rows trimmed and the input order restored."""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from bertheads.text.batching import INFERENCE_BATCH, INFERENCE_TOKENS, run_in_length_order
from bertheads.text.encoding import Feature


class Runner(Protocol):
    """One runtime's forward pass over a batch. A new runtime (another precision, another
    device or engine) is one class with these members."""

    @property
    def pad_id(self) -> int:
        """The id that pads input ids (the tokenizer's)."""
        ...

    @property
    def device(self) -> torch.device:
        """Where batches run; on a CPU, `cpu_workers` runs them side by side."""
        ...

    @property
    def workers(self) -> int | None:
        """Batches side by side for a runtime with threads of its own (torch's thread setting
        left alone); None: as many as `cpu_workers` gives on `device`."""
        ...

    def token_level(self, head: str) -> bool:
        """Whether `head` gives one output row per token (trimmed to each feature's length)."""
        ...

    def run(self, features: Sequence[Feature], rows: Sequence[int], heads: Sequence[str],
            with_loss: bool = False) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """Each head's outputs for the batch `features` (their positions in the input: `rows`),
        `[batch, ...]` arrays with token rows padded to the longest member; with `with_loss`
        (features carrying their labels), each head's mean loss on the batch, or nothing for
        a runtime that gives outputs only. May be called from several threads at once."""
        ...


def run_features(runner: Runner, features: Sequence[Feature], heads: Sequence[str],
                 batch_size: int = INFERENCE_BATCH, max_tokens: int | None = INFERENCE_TOKENS,
                 progress: str | None = None, losses: dict[str, list[float]] | None = None,
                 ) -> dict[str, list[np.ndarray]]:
    """Each head's output per feature, in input order, from `runner` over batches sorted by
    length (`run_in_length_order`). With `losses`, `losses[head]` collects `[sum, examples]`
    of the batch losses (`[nan, 0]` from a runner that gives none)."""
    heads = list(heads)
    lengths = [len(f["input_ids"]) for f in features]
    token_level = {name: runner.token_level(name) for name in heads}
    results: dict[str, list] = {name: [None] * len(features) for name in heads}
    lock = threading.Lock()
    if losses is not None:
        losses.update({name: [0.0, 0] for name in heads})

    def run(idx: list[int]) -> None:
        outputs, batch_losses = runner.run([features[i] for i in idx], idx, heads, losses is not None)
        if losses is not None:
            with lock:  # batches may run on several threads
                for name in heads:
                    if name in batch_losses:
                        losses[name][0] += batch_losses[name] * len(idx)
                        losses[name][1] += len(idx)
                    else:
                        losses[name][0] = math.nan
        for name in heads:
            arr = outputs[name]
            for j, i in enumerate(idx):
                results[name][i] = arr[j, : lengths[i]] if token_level[name] else arr[j]

    run_in_length_order(features, run, runner.device, batch_size, max_tokens, progress, workers=runner.workers)
    return results
