"""The one inference loop. A `Runner` is one runtime's forward pass (the torch model, an ONNX
Runtime or OpenVINO session, a head over cached encoder states, the bare encoder writing its
states): a batch of features in, each head's outputs out. `run_heads` does the rest once:
length order, capped batches, CPU worker threads, eval mode, progress, and each head's output
per feature in input order (or each batch handed to a `sink` that writes it away)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from itertools import repeat
from typing import Any, Protocol

import numpy as np
import torch

from bertheads.base.progress import LogLines, progress_bar
from bertheads.compute.batching import INFERENCE_BATCH, INFERENCE_TOKENS, cpu_workers, sorted_batches
from bertheads.text.encoding import Feature

log = logging.getLogger(__name__)

Outputs = dict[str, np.ndarray]  # head -> `[batch, ...]` outputs (token rows padded to the batch's longest)
Sink = Callable[[list[int], Outputs, dict[str, float]], None]


class Runner(Protocol):
    """One runtime's forward pass over a batch, and what a caller needs besides. A new runtime
    (another precision, device or engine) is one class with these members."""

    @property
    def tasks(self) -> Mapping[str, Any]:
        """Head name -> its task: how its inputs are encoded and its outputs decoded."""
        ...

    @property
    def tokenizer(self) -> Any:
        """The tokenizer the heads' inputs are encoded with."""
        ...

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

    def evaluating(self) -> AbstractContextManager:
        """Evaluation mode for the duration (a torch module's `eval()`), the previous mode after."""
        ...

    def run_batch(self, features: Sequence[Feature], rows: Sequence[int], heads: Sequence[str],
                  with_loss: bool = False) -> tuple[Outputs, dict[str, float]]:
        """Each head's outputs for the batch `features` (their positions in the input: `rows`),
        `[batch, ...]` arrays with token rows padded to the longest member; with `with_loss`
        (features carrying their labels), each head's mean loss on the batch, or nothing for
        a runtime that gives outputs only. Runs without gradients; may be called from several
        threads at once."""
        ...


class EncoderInputs:
    """The `Runner` members of a runtime whose inputs its `encoder`'s tokenizer encodes."""

    encoder: Any

    @property
    def tokenizer(self) -> Any:
        return self.encoder.tokenizer

    @property
    def pad_id(self) -> int:
        return self.encoder.tokenizer.pad_token_id or 0


@contextmanager
def eval_mode(module) -> Iterator[None]:
    """A torch module in evaluation mode for the duration, its own mode back after (what a
    torch runner's `evaluating` is)."""
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


def run_heads(runner: Runner, features: Sequence[Feature], heads: Sequence[str],
              batch_size: int = INFERENCE_BATCH, max_tokens: int | None = INFERENCE_TOKENS,
              progress: str | None = None, losses: dict[str, list[float]] | None = None,
              sink: Sink | None = None, unit: str = "ex") -> dict[str, list[np.ndarray]]:
    """Each head's output per feature, in input order, from `runner` over batches sorted by
    length, each padded only to its own longest member, side by side on a CPU (`cpu_workers`;
    the caller's torch thread setting is restored after). With `losses` (features carrying
    their labels), `losses[head]` collects `[sum, examples]` of the batch losses (`[nan, 0]`
    from a runner that gives none). With `sink`, each batch's `(rows, outputs, losses)` goes
    there instead, in batch order (nothing is returned). `progress` names a bar (none: None)."""
    heads = list(heads)
    lengths = [len(f["input_ids"]) for f in features]
    results: dict[str, list] = {name: [None] * len(features) for name in heads}
    token_level = {name: runner.token_level(name) for name in heads}
    if losses is not None:
        losses.update({name: [0.0, 0] for name in heads})

    def collect(idx: list[int], outputs: Outputs, batch_losses: dict[str, float]) -> None:
        for name in heads:
            if losses is not None:
                if name in batch_losses:
                    losses[name][0] += batch_losses[name] * len(idx)
                    losses[name][1] += len(idx)
                else:
                    losses[name][0] = np.nan
            arr = outputs[name]
            for j, i in enumerate(idx):
                results[name][i] = arr[j, : lengths[i]] if token_level[name] else arr[j]

    batches = sorted_batches(lengths, batch_size, max_tokens)
    workers, threads = (min(runner.workers, len(batches)), None) if runner.workers else \
        cpu_workers(runner.device, len(batches))
    calls = ([[features[i] for i in idx] for idx in batches], batches, repeat(heads), repeat(losses is not None))
    bar = progress_bar(len(features), progress, unit, show=progress is not None, leave=False)
    lines = LogLines(progress or "", len(features), unit, show=progress is not None)  # where no bar is drawn
    done = 0
    before = torch.get_num_threads()
    setting = {} if threads is None else {"initializer": torch.set_num_threads, "initargs": (threads,)}
    pool = ThreadPoolExecutor(workers, **setting) if workers > 1 else None
    try:
        with runner.evaluating():
            ran = pool.map(runner.run_batch, *calls) if pool else map(runner.run_batch, *calls)
            for idx, (outputs, batch_losses) in zip(batches, ran):
                (sink or collect)(idx, outputs, batch_losses)
                bar.update(len(idx))
                done += len(idx)
                if lines.due():
                    log.info(lines.line(done))
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        torch.set_num_threads(before)  # (what threads started later inherit, too)
        bar.close()
    return {} if sink is not None else results
