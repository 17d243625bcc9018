"""Multi-head models on the tiny BERT built without training (for analyze, combine, serve tests),
a saved model's manifest edited in place and the one-line error of loading it (for the model-file
tests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import bertheads
from bertheads.base.errors import UserError
from bertheads.encoder.pretrained import Encoder
from bertheads.model import BertHeads, attach_branch
from bertheads.saved import bundle
from bertheads.training.joint import settle_branch


def build_task(encoder: Encoder, kind: str, seed: int, spec: dict):
    """A task of `kind` with a freshly initialised head (seeded) and the given spec fields."""
    cls = bundle.task_class(kind)
    torch.manual_seed(seed)
    return cls.build(cls.spec_type(**spec), encoder, encoder.pooler_state)


def branch_task(encoder: Encoder, kind: str, seed: int, spec: dict):
    """A task whose spec tunes the top `tune_layers` layers: its branch, the checkpoint's layers
    moved by seeded noise (as training moves them, so that it computes other states than the trunk)."""
    given = bundle.task_class(kind).spec_type(**spec)
    settle_branch(given, encoder.info.num_layers)
    task = build_task(encoder, kind, seed, vars(given))
    attach_branch(task.head, task.spec, encoder, fresh=True)
    with torch.no_grad():
        for parameter in task.head.branch.parameters():
            parameter += 0.2 * torch.randn_like(parameter)
    return task


def save_heads(model_dir: str, out: Path, heads: dict) -> Path:
    """Save the tiny encoder with untrained heads: {name: (kind, seed, spec fields)}; a head whose
    spec has `tune_layers` gets a branch (`branch_task`)."""
    encoder = Encoder.load(model_dir)
    tasks = {name: (branch_task if spec.get("tune_layers") else build_task)(encoder, kind, seed, spec)
             for name, (kind, seed, spec) in heads.items()}
    bundle.save(BertHeads(encoder, tasks), out, extra={"source_model": model_dir})
    return out


class EncoderCalls:
    """Counts forward passes of a model's shared encoder."""

    def __init__(self, net) -> None:
        self.count = 0
        self.handle = net.encoder.register_forward_hook(self._hook)

    def _hook(self, *_):
        self.count += 1

    def close(self) -> None:
        self.handle.remove()


def edit_manifest(directory: Path, change) -> None:
    """`change(data)` applied to the folder's `bertheads.json`, written back."""
    path = directory / "bertheads.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def load_error(directory: Path, **kwargs) -> str:
    """The one-line error `bertheads.load` refuses a model folder with."""
    with pytest.raises(UserError) as info:
        bertheads.load(directory, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message
