"""One encoder, named heads: the whole forward pass and batched inference."""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from bertheads.encoder.layers import reads_first_position_only
from bertheads.encoder.pretrained import Encoder
from bertheads.text.batching import INFERENCE_BATCH, INFERENCE_TOKENS, run_in_length_order
from bertheads.text.encoding import Feature, collate


class BertHeads(nn.Module):
    """A shared encoder and a `ModuleDict` of heads, one per task (`tasks[name].head`)."""

    def __init__(self, encoder: Encoder, tasks: dict) -> None:
        super().__init__()
        self.encoder = encoder
        self.tasks = dict(tasks)
        self.heads = nn.ModuleDict({name: task.head for name, task in self.tasks.items()})

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def forward(self, batch: dict[str, torch.Tensor], names: Sequence[str]) -> dict[str, torch.Tensor]:
        """Run the encoder once and every named head on its output."""
        layers = sorted({i for n in names for i in self.heads[n].layers})
        # When every head reads only [CLS] and the last layer is the only one read, that layer
        # runs for [CLS] alone (the encoder ignores the request when other layers are read).
        first_token_only = all(reads_first_position_only(self.heads[n]) for n in names)
        states = self.encoder(
            batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"), layers=tuple(layers),
            first_token_only=first_token_only,
        )
        if isinstance(states, torch.Tensor):
            states = [states]
        out = {}
        for name in names:
            head = self.heads[name]
            picked = [states[layers.index(i)] for i in head.layers]
            out[name] = head(picked if len(picked) > 1 else picked[0], batch)
        return out


def run_heads(
    model: BertHeads,
    features: Sequence[Feature],
    names: Sequence[str],
    batch_size: int = INFERENCE_BATCH,
    max_tokens: int | None = INFERENCE_TOKENS,
    progress: str | None = None,
    losses: dict[str, list[float]] | None = None,
) -> dict[str, list[np.ndarray]]:
    """Head outputs per feature, in input order.

    Features run sorted by length (each batch padded only to its own longest member);
    token-level heads get their rows trimmed to the feature's length. On a CPU with several
    torch threads, batches run side by side on that many worker threads, each using one
    core (`packing.run_batches`). With `losses` (features carrying their labels), each named
    head's loss is computed on every batch too: `losses[name]` collects `[sum, examples]`.
    """
    if not isinstance(model, BertHeads):  # another runtime (`runtime_onnx.OnnxNet`) runs its own batches
        if losses is not None:  # it gives the heads' outputs only: no loss to report
            losses.update({name: [math.nan, 0] for name in names})
        return model.run_heads(features, names, batch_size, max_tokens, progress)
    was_training = model.training
    model.eval()
    device = model.device
    pad_id = model.encoder.tokenizer.pad_token_id or 0
    lengths = [len(f["input_ids"]) for f in features]
    results: dict[str, list] = {n: [None] * len(features) for n in names}
    lock = threading.Lock()
    if losses is not None:
        for name in names:
            losses[name] = [0.0, 0]

    def run(idx: list[int]) -> None:
        batch = collate([features[i] for i in idx], pad_id)
        batch = {k: v.to(device) for k, v in batch.items()}
        out = model(batch, names)
        for name in names:
            if losses is not None:
                value = float(model.tasks[name].loss(out[name], batch))
                with lock:  # batches may run on several threads
                    losses[name][0] += value * len(idx)
                    losses[name][1] += len(idx)
            arr = out[name].float().cpu().numpy()
            token_level = model.heads[name].token_level
            for j, i in enumerate(idx):
                results[name][i] = arr[j, : lengths[i]] if token_level else arr[j]

    try:
        run_in_length_order(features, run, device, batch_size, max_tokens, progress)
    finally:
        model.train(was_training)
    return results


def head_outputs(model: BertHeads, name: str, examples: list, batch_size: int = INFERENCE_BATCH,
                 progress: str | None = None) -> list:
    """One head's outputs for each example: encode, run the encoder and the head, merge windows."""
    task = model.tasks[name]
    features, owner = task.encode_for_inference(examples, model.encoder.tokenizer)
    feature_outputs = run_heads(model, features, [name], batch_size, progress=progress)[name]
    return task.collect(feature_outputs, owner, examples, features)


def evaluate_head(model: BertHeads, name: str, examples: list, path: str | None = None,
                  batch_size: int = INFERENCE_BATCH, **options) -> dict:
    """One head's metrics on labelled examples, with its mean `loss` (from the same pass)."""
    task = model.tasks[name]
    features, owner = task.encode_for_inference(examples, model.encoder.tokenizer, with_labels=True)
    losses: dict[str, list[float]] = {}
    outputs = run_heads(model, features, [name], batch_size, losses=losses)[name]
    metrics = task.metrics(task.collect(outputs, owner, examples, features), examples, path, **options)
    total, count = losses[name]
    if count:  # the ONNX runtime gives outputs only: no loss then
        metrics["loss"] = total / count
    return metrics
