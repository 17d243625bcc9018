"""The training loop: fine-tuning (encoder and heads together) or head-only training on a
frozen encoder, for one task or several sharing the encoder.

The loop is explicit (no Trainer). It runs as one process, or as several under `accelerate
launch` / `torchrun`: Accelerate supplies the device, the process rank and gradient
synchronisation; each process takes its share of the length-grouped batches, and the
main process evaluates and saves.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from bertheads import bundle
from bertheads.atomic import atomic_write_text
from bertheads.cache import evaluate_cached
from bertheads.errors import UserError
from bertheads.layers import reads_first_position_only
from bertheads.model import BertHeads, evaluate_head
from bertheads.packing import INFERENCE_BATCH, collate, length_grouped_batches, shard

SAMPLINGS = ("proportional", "temperature", "round-robin")
KEEP_CHOICES = ("best", "last")
FINETUNE_LR = 5e-5  # the learning rate when the encoder learns too
FEATURES_LR = 1e-3  # ... and when only heads learn, on a frozen encoder's cached states
LOWER_IS_BETTER = ("loss", "mse")  # dev metrics where smaller is better


@dataclass
class TrainSettings:
    epochs: int = 3
    batch_size: int = 32
    lr: float | None = None  # None: FINETUNE_LR, or FEATURES_LR when the encoder is frozen
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    seed: int = 42
    eval_batch_size: int = INFERENCE_BATCH
    sampling: str = "proportional"
    temperature: float = 2.0
    progress: bool = True
    keep: str = "best"  # "best": the best dev evaluation; "last": the final epoch's model
    select_metric: str | None = None  # dev metric that picks the best (default: each task's main one)


@dataclass
class TaskData:
    """One task's share of a training run."""

    name: str
    task: object
    train_features: list
    dev_examples: list | None = None
    dev_path: str | None = None
    cached: object = None  # cache.CachedFeatures when the encoder is frozen and cached
    dev_cached: object = None  # cache.CachedDev: the dev set's states, likewise
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


@dataclass
class Run:
    """What `set_up` prepares for a training run."""

    accelerator: object
    wrapped: nn.Module  # the model (or, features mode, the heads) as Accelerate wraps it
    optimizer: torch.optim.Optimizer
    scheduler: object
    trainable: list
    pad_id: int
    frozen: bool
    rank: int
    world: int


@dataclass
class Choice:
    """The evaluation kept so far and why (see `better`)."""

    epoch: int = 0
    score: float = -math.inf
    loss: float = math.inf
    metrics: dict = field(default_factory=dict)
    by: str = ""


def resolved_settings(settings: TrainSettings, frozen: bool) -> TrainSettings:
    """The settings with the defaults that depend on the mode filled in: the learning rate."""
    if settings.lr is not None:
        return settings
    return replace(settings, lr=FEATURES_LR if frozen else FINETUNE_LR)


def set_up(model: BertHeads, data: list[TaskData], settings: TrainSettings) -> Run:
    """Accelerate (device, processes), AdamW and the linear warm-up/decay schedule."""
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
    return Run(accelerator, wrapped, optimizer, scheduler, [p for p in model.parameters() if p.requires_grad],
               model.encoder.tokenizer.pad_token_id or 0, frozen, rank, world)


def train_epoch(run: Run, model: BertHeads, data: list[TaskData], settings: TrainSettings, epoch: int) -> dict:
    """One pass over this process's share of the batches; the running loss and speed."""
    device = run.accelerator.device
    model.train()
    if run.frozen:
        model.encoder.eval()
    plan = plan_epoch(data, settings, epoch - 1, run.rank, run.world)
    bar = tqdm(total=len(plan), desc=f"epoch {epoch}/{settings.epochs}", unit="batch",
               disable=not (settings.progress and run.accelerator.is_main_process), dynamic_ncols=True)
    seen, started, running = 0, time.perf_counter(), None
    for t, idx in plan:
        d = data[t]
        if d.cached is not None:
            batch = d.cached.batch(idx, d.train_features)
            states = batch.pop("states")
            states = [s.to(device) for s in states] if isinstance(states, list) else states.to(device)
            batch = {k: v.to(device) for k, v in batch.items()}
            logits = run.wrapped(d.name, states, batch)
        else:
            batch = collate([d.train_features[i] for i in idx], run.pad_id)
            batch = {k: v.to(device) for k, v in batch.items()}
            logits = run.wrapped(batch, [d.name])[d.name]
        loss = d.task.loss(logits, batch)
        run.accelerator.backward(loss)
        if settings.max_grad_norm:
            run.accelerator.clip_grad_norm_(run.trainable, settings.max_grad_norm)
        run.optimizer.step()
        run.scheduler.step()
        run.optimizer.zero_grad(set_to_none=True)
        seen += len(idx)
        value = float(loss.detach())
        running = value if running is None else 0.98 * running + 0.02 * value
        bar.set_postfix(loss=f"{running:.4f}", ex_s=f"{seen / (time.perf_counter() - started):.1f}", refresh=False)
        bar.update(1)
    bar.close()
    seconds = time.perf_counter() - started
    return {"train_examples_per_second": round(seen * run.world / max(seconds, 1e-9), 2), "train_loss": running,
            "lr": settings.lr}


def evaluate_task(model: BertHeads, data: TaskData, batch_size: int = INFERENCE_BATCH) -> dict:
    """A task's dev metrics after an epoch, with its mean dev `loss` (from the dev set's cached
    states when the encoder is frozen)."""
    if data.dev_cached is not None:
        return evaluate_cached(data.task, model.heads[data.name], data.dev_cached, data.dev_examples, data.dev_path,
                               batch_size)
    return evaluate_head(model, data.name, data.dev_examples, data.dev_path, batch_size, during_training=True)


def selection_metric(data: list[TaskData], settings: TrainSettings, metrics: dict) -> dict[str, str]:
    """The dev metric that ranks evaluations, per task (`--select-metric` or the task's main one)."""
    chosen = {}
    for d in data:
        if d.name not in metrics:
            continue
        name = settings.select_metric or d.task.main_metric
        value = metrics[d.name].get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            known = sorted(k for k, v in metrics[d.name].items() if isinstance(v, (int, float))
                           and not isinstance(v, bool))
            raise UserError(f"--select-metric {name}: head {d.name!r} has no such dev metric (has: {', '.join(known)})")
        chosen[d.name] = name
    return chosen


def score_of(metrics: dict, chosen: dict[str, str]) -> tuple[float, float]:
    """(score, dev loss) of one evaluation: the mean over tasks of the selection metric (negated
    where smaller is better) and of the dev loss."""
    scores = [(-1 if name in LOWER_IS_BETTER else 1) * float(metrics[t][name]) for t, name in chosen.items()]
    losses = [float(metrics[t].get("loss", math.nan)) for t in chosen]
    return float(np.mean(scores)), float(np.mean(losses))


def better(score: float, loss: float, kept: Choice) -> bool:
    """A higher score wins; an equal score wins with a lower dev loss (so a later epoch that
    only grew more confident replaces an earlier tie)."""
    if math.isclose(score, kept.score, rel_tol=1e-12, abs_tol=1e-12):
        return not math.isnan(loss) and (math.isnan(kept.loss) or loss < kept.loss)
    return score > kept.score


def evaluate_and_save(model: BertHeads, data: list[TaskData], settings: TrainSettings, epoch: int,
                      record: dict, kept: Choice, history: list, out: str | Path | None, evaluate,
                      extra_manifest: dict | None) -> Choice:
    """Evaluate every task with a dev set, record the epoch, and save the model to `out` when it
    is the one to keep (`settings.keep`); otherwise refresh the saved model's metrics.json."""
    metrics = {d.name: evaluate(model, d) for d in data if d.dev_examples is not None}
    record = {"epoch": epoch, **record, "dev": metrics}
    history.append(record)
    if metrics:
        chosen = selection_metric(data, settings, metrics)
        score, loss = score_of(metrics, chosen)
        names = sorted(set(chosen.values()))
        rule = f"{', '.join(names)}{' (mean over heads)' if len(chosen) > 1 else ''}, then dev loss"
        summary = "  ".join(f"{n}: " + ", ".join(f"{k}={v:.4f}" for k, v in m.items() if isinstance(v, float))
                            for n, m in metrics.items())
    else:
        score, loss, rule, summary = float(epoch), math.nan, "last epoch (no dev set)", ""
    if settings.keep == "last":
        keep_now, rule = True, "last epoch (--keep last)"
    else:
        keep_now = better(score, loss, kept)
    if keep_now:
        kept = Choice(epoch, score, loss, metrics, rule)
    if summary or keep_now:
        note = "kept" if keep_now else f"epoch {kept.epoch} stays kept"
        tqdm.write(f"epoch {epoch}: {summary}{'  ' if summary else ''}({note}: {rule})")
    if out is not None:
        result = metrics_file(data, kept, history)
        if keep_now:
            bundle.save(model, out, result, extra_manifest)
        else:  # keep the saved model, refresh its history
            atomic_write_text(Path(out) / "metrics.json", json.dumps(result, indent=2) + "\n")
    return kept


def fit(model: BertHeads, data: list[TaskData], settings: TrainSettings, out: str | Path | None,
        evaluate=evaluate_task, extra_manifest: dict | None = None) -> dict:
    """Train `model` on `data`; evaluate each task after every epoch and keep the best (or,
    with `settings.keep == "last"`, the last) to save at `out`.

    `evaluate(model, task_data)` returns the dev metrics dict of one task, with its "loss".
    Returns `{"dev": metrics, "best_epoch": n, "kept": {"epoch", "by"}, "history": [...]}`.
    """
    if settings.keep not in KEEP_CHOICES:
        raise UserError(f"--keep: expected one of {', '.join(KEEP_CHOICES)}, got {settings.keep!r}")
    settings = resolved_settings(settings, frozen=all(d.cached is not None for d in data))
    run = set_up(model, data, settings)
    kept, history = Choice(), []
    threads = torch.get_num_threads()
    # [CLS] heads on cached states are a few small matrices: on CPU, one thread runs them
    # without waiting on the others (which a busy machine schedules late)
    small = run.frozen and run.accelerator.device.type == "cpu" and all(
        reads_first_position_only(model.heads[d.name]) for d in data)
    if small:
        torch.set_num_threads(1)
    try:
        for epoch in range(1, settings.epochs + 1):
            record = train_epoch(run, model, data, settings, epoch)
            if run.accelerator.is_main_process:
                kept = evaluate_and_save(model, data, settings, epoch, record, kept, history, out, evaluate,
                                         extra_manifest)
            run.accelerator.wait_for_everyone()
    finally:
        torch.set_num_threads(threads)
    if run.accelerator.device.type != "cpu":
        model.to("cpu")
    return metrics_file(data, kept, history)


class HeadRunner(nn.Module):
    """The heads alone as one module (what a distributed wrapper needs): `(name, states, batch)`."""

    def __init__(self, heads: nn.ModuleDict) -> None:
        super().__init__()
        self.heads = heads

    def forward(self, name: str, states, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.heads[name](states, batch)


def metrics_file(data: list[TaskData], kept: Choice, history: list) -> dict:
    """What metrics.json holds: the kept evaluation's dev metrics, which epoch it was and why,
    and every epoch's record."""
    metrics = kept.metrics
    dev = metrics[data[0].name] if len(data) == 1 and metrics else metrics
    return {"dev": dev, "best_epoch": kept.epoch, "kept": {"epoch": kept.epoch, "by": kept.by}, "history": history}
