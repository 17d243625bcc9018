"""One encoder, named heads: the whole forward pass and batched inference."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from bertheads.encoder import Encoder
from bertheads.features import reads_first_position_only
from bertheads.packing import INFERENCE_BATCH, INFERENCE_TOKENS, Feature, collate, run_batches, sorted_batches


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
) -> dict[str, list[np.ndarray]]:
    """Head outputs per feature, in input order.

    Features run sorted by length (each batch padded only to its own longest member);
    token-level heads get their rows trimmed to the feature's length. On a CPU with several
    torch threads, batches run side by side on that many worker threads, each using one
    core (`packing.run_batches`). Another runtime (`runtime_onnx.OnnxNet`) runs its own.
    """
    if not isinstance(model, BertHeads):
        return model.run_heads(features, names, batch_size, max_tokens, progress)
    was_training = model.training
    model.eval()
    device = model.device
    pad_id = model.encoder.tokenizer.pad_token_id or 0
    lengths = [len(f["input_ids"]) for f in features]
    results: dict[str, list] = {n: [None] * len(features) for n in names}
    batches = sorted_batches(lengths, batch_size, max_tokens)
    bar = tqdm(total=len(features), desc=progress, unit="ex", disable=None if progress else True, leave=False)

    def run(idx: list[int]) -> None:
        batch = collate([features[i] for i in idx], pad_id)
        batch = {k: v.to(device) for k, v in batch.items()}
        out = model(batch, names)
        for name in names:
            arr = out[name].float().cpu().numpy()
            token_level = model.heads[name].token_level
            for j, i in enumerate(idx):
                results[name][i] = arr[j, : lengths[i]] if token_level else arr[j]

    try:
        run_batches(batches, run, device, bar)
    finally:
        bar.close()
        model.train(was_training)
    return results
