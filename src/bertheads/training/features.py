"""Training heads on a frozen encoder's cached states (`--mode features`): each task of the run
gets its cache entries (built where missing, `store/features_cache.py`), and a head is
evaluated on its dev set's cached states without the encoder."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager

import numpy as np
import torch

from bertheads.base.errors import UserError
from bertheads.base.schema import said
from bertheads.compute.batching import INFERENCE_BATCH
from bertheads.compute.runner import eval_mode, run_heads
from bertheads.encoder.layers import cached_positions, normalise_layers
from bertheads.inference.path import dev_metrics
from bertheads.model import head_output
from bertheads.store.features_cache import (
    CachedDev,
    CachedFeatures,
    CacheSettings,
    cache_key,
    encoder_identity,
    ensure_cache,
)
from bertheads.text.encoding import to_device
from bertheads.training.settings import FROZEN_HEAD_MODES


def attach_cache(net, data: list, options: dict, model_name: str | None = None, train_path: str | None = None,
                 progress: bool = True) -> None:
    """Give every task of a features-mode run its cached encoder states (`TaskData.cached`,
    and `TaskData.dev_cached` for its dev set), building the cache entries that do not exist yet."""
    from accelerate import PartialState

    modes = {d.task.spec.mode for d in data}
    if len(modes) != 1 or next(iter(modes)) not in FROZEN_HEAD_MODES:
        raise UserError(f"{said('mode', 'features')} must be set for every head of a run (the encoder is either "
                        "frozen for all of them or fine-tuned)")
    settings = CacheSettings.from_options(options, progress)
    encoder = net.encoder
    encoder_id = encoder_identity(encoder)
    pad_id = encoder.tokenizer.pad_token_id or 0
    # cpu=True as in `fit`: without CUDA, that is what makes torchrun processes set up gloo.
    state = PartialState(cpu=not torch.cuda.is_available())
    for d in data:
        head = net.heads[d.name]
        layers = normalise_layers(head.layers, encoder.info.num_layers)
        positions = cached_positions(head)
        key = cache_key(encoder_id, d.train_features, layers, positions, settings.dtype,
                        encoder.info.uses_token_types)
        info = {"model": model_name, "train": str(train_path) if train_path else None, "task": d.task.kind,
                "head": d.name, "max_length": getattr(d.task.spec, "max_length", None)}
        with state.main_process_first():
            directory = ensure_cache(encoder, d.train_features, key, layers, positions, settings, info, state.device)
        d.cached = CachedFeatures(directory, [len(f["input_ids"]) for f in d.train_features], pad_id)
        if d.dev_examples is not None and state.is_main_process:  # the main process evaluates
            features, owner = d.task.modeling.encode_for_inference(d.dev_examples, encoder.tokenizer, with_labels=True)
            key = cache_key(encoder_id, features, layers, positions, settings.dtype, encoder.info.uses_token_types)
            info = {**info, "train": None, "dev": str(d.dev_path) if d.dev_path else None}
            directory = ensure_cache(encoder, features, key, layers, positions, settings, info, state.device)
            d.dev_cached = CachedDev(features, owner,
                                     CachedFeatures(directory, [len(f["input_ids"]) for f in features], pad_id))


class CachedHead:
    """A head over a dev set's cached encoder states, without the encoder: the
    `compute.runner.Runner` of `evaluate_cached` (`rows` index `dev.features`)."""

    workers = None  # batches side by side as torch's threads allow (`cpu_workers`)
    tokenizer = None  # (the features are encoded already)

    def __init__(self, name: str, task, head, dev: CachedDev, device: torch.device) -> None:
        self.name, self.task, self.head, self.dev, self.device = name, task, head, dev, device
        self.tasks = {name: task}
        self.pad_id = dev.cached.pad_id

    def token_level(self, name: str) -> bool:
        return bool(self.head.token_level)

    def evaluating(self) -> AbstractContextManager:
        return eval_mode(self.head)

    def run_batch(self, features: Sequence[dict], rows: Sequence[int], heads: Sequence[str],
                  with_loss: bool = False) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """The head's outputs for a batch of dev features (and its loss, with `with_loss`)."""
        with torch.inference_mode():
            batch = self.dev.cached.batch(rows, self.dev.features)
            states = batch.pop("states")
            states, batch = to_device(states, self.device), to_device(batch, self.device)
            logits = head_output(self.head, states, batch)
            losses = {self.name: float(self.task.modeling.dev_loss(logits, batch))} if with_loss else {}
            return {self.name: logits.float().cpu().numpy()}, losses


def evaluate_cached(task, head, dev: CachedDev, examples: list, path=None, batch_size: int = INFERENCE_BATCH,
                    device=None) -> dict:
    """A head's dev metrics and mean `loss` from the dev set's cached states (what evaluating
    with the live frozen encoder gives, up to the cache's precision, in the same batches),
    without the encoder; the head's temperature is fitted on them too (`calibration`)."""
    runner = CachedHead(task.kind, task, head, dev, device or next(head.parameters()).device)
    losses: dict[str, list[float]] = {}
    outputs = run_heads(runner, dev.features, [runner.name], batch_size, losses=losses)[runner.name]
    metrics = dev_metrics(task, task.judging.collect(outputs, dev.owner, examples, dev.features), examples, path)
    total, count = losses[runner.name]
    metrics["loss"] = total / count if count else float("nan")
    return metrics
