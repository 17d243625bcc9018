"""The training loop: fine-tuning (encoder and heads together) or head-only training on a
frozen encoder, for one task or several sharing the encoder.

The loop is explicit (no Trainer). It runs as one process, or as several under `accelerate
launch` / `torchrun`: Accelerate supplies the device, the process rank and gradient
synchronisation; each process takes its share of the length-grouped batches, and the
main process evaluates and saves.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from bertheads import bundle
from bertheads.model import BertHeads
from bertheads.packing import INFERENCE_BATCH, collate, length_grouped_batches, shard

SAMPLINGS = ("proportional", "temperature", "round-robin")


@dataclass
class TrainSettings:
    epochs: int = 3
    batch_size: int = 32
    lr: float = 5e-5
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    seed: int = 42
    eval_batch_size: int = INFERENCE_BATCH
    sampling: str = "proportional"
    temperature: float = 2.0
    progress: bool = True


@dataclass
class TaskData:
    """One task's share of a training run."""

    name: str
    task: object
    train_features: list
    dev_examples: list | None = None
    dev_path: str | None = None
    cached: object = None  # features.CachedFeatures when the encoder is frozen and cached
    extra: dict = field(default_factory=dict)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: weight decay on weights, none on biases and LayerNorm weights."""
    decay, no_decay = [], []
    norm_params = {id(p) for m in model.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters()}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if name.endswith("bias") or id(p) in norm_params or "LayerNorm" in name or "layer_norm" in name:
            no_decay.append(p)
        else:
            decay.append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def plan_epoch(data: list[TaskData], settings: TrainSettings, epoch: int, rank: int, world: int
               ) -> list[tuple[int, list[int]]]:
    """The (task index, example indices) batches of one epoch on this process."""
    plans = []
    for t, d in enumerate(data):
        lengths = d.cached.lengths if d.cached is not None else [len(f["input_ids"]) for f in d.train_features]
        batches = length_grouped_batches(lengths, settings.batch_size, seed=settings.seed + 1000 * epoch + t)
        plans.append(list(shard(batches, rank, world)))
    if len(plans) == 1:
        return [(0, b) for b in plans[0]]
    rng = random.Random(settings.seed + epoch)
    total = sum(len(p) for p in plans)
    if settings.sampling == "proportional":
        order = [t for t, p in enumerate(plans) for _ in p]
        rng.shuffle(order)
    elif settings.sampling == "round-robin":
        order = [t for _, t in zip(range(total), cycle(range(len(plans))))]
    else:
        sizes = np.array([max(len(p), 1) for p in plans], dtype=float)
        probs = sizes ** (1.0 / settings.temperature)
        probs /= probs.sum()
        order = list(np.random.default_rng(settings.seed + epoch).choice(len(plans), size=total, p=probs))
    cursors = [0] * len(plans)
    out = []
    for t in order:
        plan = plans[t]
        if not plan:
            continue
        out.append((int(t), plan[cursors[t] % len(plan)]))
        cursors[t] += 1
    return out


def cycle(items) -> Iterator:
    while True:
        yield from items


def fit(model: BertHeads, data: list[TaskData], settings: TrainSettings, out: str | Path | None,
        evaluate, extra_manifest: dict | None = None) -> dict:
    """Train `model` on `data`; evaluate each task after every epoch and keep the best.

    `evaluate(model, task_data)` returns the dev metrics dict of one task. The best epoch is
    chosen by the task's main metric (the mean over tasks when there are several) and saved
    to `out`. Returns `{"dev": metrics, "best_epoch": n, "history": [...]}`.
    """
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, set_seed
    from transformers import get_linear_schedule_with_warmup

    handlers = [DistributedDataParallelKwargs(find_unused_parameters=len(data) > 1)]
    # On a machine without CUDA, cpu=True lets Accelerate set up gloo when torchrun starts several processes.
    accelerator = Accelerator(kwargs_handlers=handlers, cpu=not torch.cuda.is_available())
    set_seed(settings.seed)
    rank, world = accelerator.process_index, accelerator.num_processes
    frozen = all(d.cached is not None for d in data)
    if frozen:
        model.encoder.requires_grad_(False)
    model.to(accelerator.device)

    steps_per_epoch = len(plan_epoch(data, settings, 0, rank, world))
    total_steps = max(1, steps_per_epoch * settings.epochs)
    # The fused AdamW kernel (also the Trainer's default) updates each tensor in one pass; the
    # default on CPU is a chain of small elementwise ops per tensor, a large share of a step.
    fused = True if accelerator.device.type in ("cpu", "cuda") else None
    optimizer = torch.optim.AdamW(param_groups(model, settings.weight_decay), lr=settings.lr, fused=fused)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(settings.warmup_ratio * total_steps), total_steps)
    # Frozen encoder: only the heads learn, so only they are wrapped (under several processes
    # their gradients are averaged); the cached states stand in for the encoder's output.
    wrapped, optimizer = accelerator.prepare(HeadRunner(model.heads) if frozen else model, optimizer)
    pad_id = model.encoder.tokenizer.pad_token_id or 0
    trainable = [p for p in model.parameters() if p.requires_grad]

    best_score, best_epoch, best_metrics, history = -math.inf, 0, None, []
    for epoch in range(1, settings.epochs + 1):
        model.train()
        if frozen:
            model.encoder.eval()
        plan = plan_epoch(data, settings, epoch - 1, rank, world)
        bar = tqdm(total=len(plan), desc=f"epoch {epoch}/{settings.epochs}", unit="batch",
                   disable=not (settings.progress and accelerator.is_main_process), dynamic_ncols=True)
        seen, started, running = 0, time.perf_counter(), None
        for t, idx in plan:
            d = data[t]
            if d.cached is not None:
                batch = d.cached.batch(idx, d.train_features)
                states = batch.pop("states")
                states = [s.to(accelerator.device) for s in states] if isinstance(states, list) else \
                    states.to(accelerator.device)
                batch = {k: v.to(accelerator.device) for k, v in batch.items()}
                logits = wrapped(d.name, states, batch)
            else:
                batch = collate([d.train_features[i] for i in idx], pad_id)
                batch = {k: v.to(accelerator.device) for k, v in batch.items()}
                logits = wrapped(batch, [d.name])[d.name]
            loss = d.task.loss(logits, batch)
            accelerator.backward(loss)
            if settings.max_grad_norm:
                accelerator.clip_grad_norm_(trainable, settings.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            seen += len(idx)
            value = float(loss.detach())
            running = value if running is None else 0.98 * running + 0.02 * value
            bar.set_postfix(loss=f"{running:.4f}", ex_s=f"{seen / (time.perf_counter() - started):.1f}",
                            refresh=False)
            bar.update(1)
        bar.close()
        train_seconds = time.perf_counter() - started

        if accelerator.is_main_process:
            metrics = {d.name: evaluate(model, d) for d in data if d.dev_examples is not None}
            record = {"epoch": epoch, "train_examples_per_second": round(seen * world / train_seconds, 2),
                      "train_loss": running, "dev": metrics}
            history.append(record)
            if metrics:
                score = float(np.mean([metrics[d.name][d.task.main_metric] for d in data if d.name in metrics]))
                summary = "  ".join(f"{n}: " + ", ".join(f"{k}={v:.4f}" for k, v in m.items()
                                                          if isinstance(v, float)) for n, m in metrics.items())
                tqdm.write(f"epoch {epoch}: {summary}")
            else:
                score = float(epoch)  # no dev set: keep the last epoch
            if score > best_score:
                best_score, best_epoch, best_metrics = score, epoch, metrics
                if out is not None:
                    bundle.save(model, out, metrics_file(data, best_metrics, best_epoch, history), extra_manifest)
            elif out is not None:  # keep the saved best, refresh its history
                bundle.atomic_write_text(Path(out) / "metrics.json",
                                         _json(metrics_file(data, best_metrics, best_epoch, history)))
        accelerator.wait_for_everyone()
    model.to("cpu") if accelerator.device.type != "cpu" else None
    return metrics_file(data, best_metrics or {}, best_epoch, history)


class HeadRunner(nn.Module):
    """The heads alone as one module (what a distributed wrapper needs): `(name, states, batch)`."""

    def __init__(self, heads: nn.ModuleDict) -> None:
        super().__init__()
        self.heads = heads

    def forward(self, name: str, states, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.heads[name](states, batch)


def metrics_file(data: list[TaskData], metrics: dict, best_epoch: int, history: list) -> dict:
    dev = metrics[data[0].name] if len(data) == 1 and metrics else metrics
    return {"dev": dev, "best_epoch": best_epoch, "history": history}


def _json(obj) -> str:
    import json

    return json.dumps(obj, indent=2) + "\n"
