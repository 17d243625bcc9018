"""The bare encoder as a `Runner`: what the features cache stores (`store/features_cache.py`)
and what `extract` writes (`inference/extract.py`), both through `run_heads` with a sink that
writes each batch's rows to their place on disk."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager

import numpy as np
import torch

from bertheads.base.errors import UserError
from bertheads.base.schema import said
from bertheads.compute.runner import EncoderInputs, Outputs, eval_mode
from bertheads.encoder.layers import pool_tokens
from bertheads.text.encoding import Feature, encoder_batch


class EncoderStates(EncoderInputs):
    """For each feature, the hidden states of `layers`: `tokens` (every token, `[batch, tokens,
    layers, hidden]`), or one row per feature pooled over the tokens the mask keeps (`cls`,
    `mean`, `max`: `[batch, layers, hidden]`, see `pool_tokens`); the "heads" run are the
    positions wanted. The last layer runs for [CLS] alone when [CLS] is all that is kept. The
    states come in `dtype` (float16: refused where they exceed its range)."""

    tasks: dict = {}  # (no heads: the states are the outputs)
    workers = None  # batches side by side as torch's threads allow

    def __init__(self, encoder, layers: Sequence[int], positions: Sequence[str], device=None,
                 dtype: torch.dtype = torch.float32) -> None:
        self.encoder, self.layers, self.dtype = encoder, tuple(layers), dtype
        self.first_token_only = set(positions) == {"cls"}
        if device is not None:
            encoder.to(device)
        self.device = next(encoder.model.parameters()).device  # (loads a lazy encoder)

    def token_level(self, position: str) -> bool:
        return position == "tokens"

    def evaluating(self) -> AbstractContextManager:
        return eval_mode(self.encoder)

    def run_batch(self, features: Sequence[Feature], rows: Sequence[int], positions: Sequence[str],
                  with_loss: bool = False) -> tuple[Outputs, dict[str, float]]:
        with torch.inference_mode():
            batch = encoder_batch(features, self.pad_id, self.device)
            states = self.encoder(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                                  layers=self.layers, first_token_only=self.first_token_only)
            if isinstance(states, torch.Tensor):
                states = [states]
            if self.dtype == torch.float16 and any(s.abs().max() > 65000 for s in states):
                raise UserError(f"the encoder's hidden states exceed the float16 range; use {said('cache_dtype', 'float32')}")
            out = {}
            for position in positions:
                if position == "tokens":
                    block = torch.stack(states, dim=2)
                else:
                    block = torch.stack([pool_tokens(s, batch["attention_mask"], position) for s in states], dim=1)
                out[position] = block.to(self.dtype).cpu().numpy()
            return out, {}


def combined(rows: np.ndarray, combine: str) -> np.ndarray:
    """`[..., layers, hidden]` rows merged over the layers as `LayerCombine` does: concat (layer
    after layer), sum or mean."""
    if combine == "concat":
        return rows.reshape(*rows.shape[:-2], rows.shape[-2] * rows.shape[-1])
    if combine == "sum":
        return rows.sum(-2)
    if combine == "mean":
        return rows.mean(-2)
    raise UserError(f"{said('layer_combine')}: extract takes concat, sum or mean, got {combine!r}")
