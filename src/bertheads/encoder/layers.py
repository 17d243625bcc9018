"""Which hidden layers a head reads, how they are merged into one vector per token, and how a
sequence head pools the tokens into one vector ([CLS], or the mean or max of the tokens the
attention mask keeps)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from bertheads.base.errors import UserError
from bertheads.base.schema import said

COMBINES = ("concat", "sum", "mean", "scalar-mix")
POOLINGS = ("cls", "mean", "max")  # how a sequence head reads the tokens


def parse_layers(text: str | None, num_layers: int) -> tuple[int, ...]:
    """`-1` (default), `-1,-2,-3,-4`, `all` -> layer indices; 0 is the embedding output."""
    if text in (None, "", "-1"):
        return (-1,)
    if text == "all":
        return tuple(range(num_layers + 1))
    try:
        layers = tuple(int(p) for p in str(text).split(",") if p.strip())
    except ValueError:
        raise UserError(f"{said('layers')}: expected comma-separated integers or 'all', got {text!r}") from None
    for i in layers:
        if not -(num_layers + 1) <= i <= num_layers:
            raise UserError(f"{said('layers')}: layer {i} does not exist (the encoder has layers 0..{num_layers})")
    return layers


class LayerCombine(nn.Module):
    """Merge the hidden states of several layers into one tensor per token.

    `concat` joins them on the feature axis, `sum`/`mean` add them, and `scalar-mix` learns
    softmax-normalised weights over layers and a scale, as in ELMo.
    """

    def __init__(self, num_layers: int, mode: str = "concat") -> None:
        super().__init__()
        if mode not in COMBINES:
            raise UserError(f"{said('layer_combine')}: expected one of {', '.join(COMBINES)}, got {mode!r}")
        self.mode = mode
        self.num_layers = num_layers
        if mode == "scalar-mix":
            self.weights = nn.Parameter(torch.zeros(num_layers))
            self.gamma = nn.Parameter(torch.ones(()))

    def output_size(self, hidden_size: int) -> int:
        return hidden_size * self.num_layers if self.mode == "concat" else hidden_size

    def forward(self, states: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
        if isinstance(states, torch.Tensor):
            return states
        if len(states) == 1:
            return states[0]
        if self.mode == "concat":
            return torch.cat(states, dim=-1)
        stacked = torch.stack(states, dim=0)
        if self.mode == "sum":
            return stacked.sum(0)
        if self.mode == "mean":
            return stacked.mean(0)
        w = torch.softmax(self.weights, dim=0).to(stacked.dtype)
        return self.gamma * torch.einsum("l,l...->...", w, stacked)


def normalise_layers(layers: Sequence[int], num_layers: int) -> tuple[int, ...]:
    """Layer indices counted from 0 (the embeddings), so `-1` and the last index agree."""
    return tuple(i % (num_layers + 1) for i in layers)


def pool_tokens(states: torch.Tensor, mask: torch.Tensor | None, pooling: str) -> torch.Tensor:
    """`[batch, tokens, hidden]` -> `[batch, hidden]`: the first token (`cls`), or the mean or
    max over the tokens `mask` (`[batch, tokens]`, 1 = a real token; None: every token) keeps,
    special tokens included, padding left out (as sentence-transformers' `Pooling` computes them)."""
    if pooling == "cls":
        return states[:, 0]
    if mask is None:
        mask = torch.ones(states.shape[:2], dtype=torch.bool, device=states.device)
    keep = mask.unsqueeze(-1).to(torch.bool)
    if pooling == "mean":
        weights = keep.to(states.dtype)
        return (states * weights).sum(1) / weights.sum(1).clamp(min=1.0)
    if pooling == "max":
        return states.masked_fill(~keep, torch.finfo(states.dtype).min).max(1).values
    raise UserError(f"{said('pooling')}: expected one of {', '.join(POOLINGS)}, got {pooling!r}")


def head_pooling(head: nn.Module) -> str | None:
    """How a sequence-level head pools the states it is given ("cls", "mean", "max"); None for a
    token-level head or one with a branch."""
    if getattr(head, "token_level", False) or getattr(head, "branch", None) is not None:
        return None  # (a branch reads every token of its split layer)
    return getattr(head, "pooling", "cls")


def reads_first_position_only(head: nn.Module) -> bool:
    """A sequence-level head that reads the first ([CLS]) position only: only it is cached,
    and the last layer may run for that position alone."""
    return head_pooling(head) == "cls"


def cached_positions(head: nn.Module) -> str:
    """What the features cache keeps of each input for `head`: "cls" (the first position),
    "mean" or "max" (each layer's vector pooled over the input's tokens), or "tokens" (every
    token). Pooling each layer before the layers are merged gives what the head computes for
    mean pooling under every merge (each is linear), and for max pooling when the layers are
    joined side by side (one layer, or `concat`); other max-pooled merges keep every token."""
    pooling = head_pooling(head)
    if pooling is None:
        return "tokens"
    combine = getattr(getattr(head, "combine", None), "mode", "concat")
    if pooling == "max" and len(getattr(head, "layers", (-1,))) > 1 and combine != "concat":
        return "tokens"
    return pooling
