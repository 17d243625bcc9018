"""One encoder, named heads: the whole forward pass, and a batch of features through it (the
`compute.runner.Runner` members; `inference/path.py` runs examples through any runner)."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager

import numpy as np
import torch
from torch import nn

from bertheads.base.errors import UserError
from bertheads.base.schema import said
from bertheads.compute.runner import EncoderInputs, eval_mode
from bertheads.encoder.branches import Branch
from bertheads.encoder.layers import reads_first_position_only
from bertheads.encoder.pretrained import Encoder
from bertheads.text.encoding import Feature, collate, to_device


class BertHeads(EncoderInputs, nn.Module):
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
        """Run the encoder once, up to the deepest layer any head reads, and every named head on
        its layers (a head with a branch reads its split layer and runs its own layers on it)."""
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
        if self.inference_dtype is not None:  # a bf16/fp16 encoder: the heads read fp32 states
            states = [s.float() for s in states]
        out = {}
        for name in names:
            head = self.heads[name]
            picked = [states[layers.index(i)] for i in head.layers]
            out[name] = head_output(head, picked if len(picked) > 1 else picked[0], batch)
        return out

    # the `compute.runner.Runner` members: a batch of features through `forward`
    workers = None  # batches side by side as torch's threads allow (`cpu_workers`)
    inference_dtype: torch.dtype | None = None  # the encoder's weights in bf16 or fp16 (None: fp32)

    def set_inference_dtype(self, dtype: torch.dtype | None) -> None:
        """Run the encoder with its weights in `dtype` (bf16, fp16; None: fp32), the heads in fp32.
        Weights cast once run faster than autocast, which casts them again on every call."""
        self.encoder.to(dtype or torch.float32)
        self.inference_dtype = dtype

    def token_level(self, name: str) -> bool:
        return bool(self.heads[name].token_level)

    def evaluating(self) -> AbstractContextManager:
        return eval_mode(self)

    def run_batch(self, features: Sequence[Feature], rows: Sequence[int], heads: Sequence[str],
                  with_loss: bool = False) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """Each head's outputs for a batch (and its loss on it, with `with_loss`)."""
        with torch.inference_mode():
            batch = to_device(collate(features, self.pad_id), self.device)
            out = self(batch, heads)
            losses = {name: float(self.tasks[name].modeling.dev_loss(out[name], batch)) for name in heads} if with_loss else {}
            return {name: out[name].float().cpu().numpy() for name in heads}, losses


def head_output(head: nn.Module, states, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """A head's output on the states it reads: through its branch first where it has one."""
    branch = getattr(head, "branch", None)
    return head(states if branch is None else branch(states, batch), batch)


def attach_branch(head: nn.Module, spec, encoder: Encoder, fresh: bool = False) -> nn.Module:
    """Give a head whose spec tunes the top layers (`tune_layers`) its branch: the layers above
    its split (`spec.layers`), the checkpoint's own weights when `fresh`, else to be loaded."""
    count = getattr(spec, "tune_layers", None)
    if count:
        head.branch = Branch(encoder.config, encoder.info.num_layers - count)
        if fresh:
            head.branch.start_from(encoder.model).check(encoder.model)
    return head


def pick_head(net, head: str | None) -> str:
    """The head `head` names, or the only one when it is None."""
    if head is None:
        if len(net.tasks) == 1:
            return next(iter(net.tasks))
        raise UserError(f"this model has several heads ({', '.join(net.tasks)}); choose one with {said('head')}")
    if head not in net.tasks:
        raise UserError(f"no head named {head!r} (heads: {', '.join(net.tasks)})")
    return head
