"""The training loop: fine-tuning (encoder and heads together) or head-only training on a
frozen encoder, for one task or several sharing the encoder.

The loop is explicit (no Trainer). It runs as one process, or as several under `accelerate
launch` / `torchrun`: Accelerate supplies the device, the process rank and gradient
synchronisation; each process takes its share of the length-grouped batches, and the
main process evaluates and saves.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from bertheads.base.errors import SystemFault, UserError
from bertheads.base.machine import DTYPES, resolve_device, training_precision
from bertheads.base.progress import LogLines, bars_shown, eta, progress_bar
from bertheads.base.schema import said
from bertheads.compute.batching import length_grouped_batches, shard
from bertheads.encoder.layers import cached_positions
from bertheads.model import BertHeads, head_output
from bertheads.store import lock
from bertheads.store.crash import crash_point
from bertheads.tasks.parts import learned_nothing_line
from bertheads.text.encoding import collate, to_device
from bertheads.training import checkpoint
from bertheads.training.keeping import (
    Choice,
    better,
    evaluate_and_save,
    evaluate_task,
    metric_scales,
    metrics_file,
    score_of,
    selection_metric,
)
from bertheads.training.resolve import is_settled, settle_run
from bertheads.training.runlog import RunLog
from bertheads.training.settings import (  # noqa: F401  (SAMPLINGS, KEEP_CHOICES, *_LR: re-exported)
    FEATURES_LR,
    FINETUNE_LR,
    KEEP_CHOICES,
    SAMPLINGS,
    TrainSettings,
)

log = logging.getLogger(__name__)


@dataclass
class TaskData:
    """One task's share of a training run."""

    name: str
    task: object
    train_features: list
    dev_examples: list | None = None
    dev_path: str | None = None
    cached: object = None  # store.features_cache.CachedFeatures when the encoder is frozen and cached
    dev_cached: object = None  # store.features_cache.CachedDev: the dev set's states, likewise
    extra: dict = field(default_factory=dict)
    examples: int = 0  # training examples given (before a held-out slice)
    held_out: int = 0  # ... of which held out as the dev set (no dev file)
    loss: object = None  # the training loss `(logits, batch)` when not the kind's (distillation's)


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
    """The (task index, example indices) batches of one epoch on this process: each is one
    step's batch, `batch_size * grad_accum` examples."""
    plans = []
    size = settings.batch_size * settings.grad_accum
    for t, d in enumerate(data):
        lengths = d.cached.lengths if d.cached is not None else [len(f["input_ids"]) for f in d.train_features]
        groups = [f["group"] for f in d.train_features] if d.train_features and "group" in d.train_features[0] else None
        batches = length_grouped_batches(lengths, size, seed=settings.seed + 1000 * epoch + t, groups=groups)
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
    autocast: torch.dtype | None = None  # the forward pass's autocast dtype (None: fp32)


def float_outputs(out):
    """Head outputs as fp32 (autocast leaves them in bf16/fp16), so losses are computed in fp32."""
    return out.float() if isinstance(out, torch.Tensor) and out.is_floating_point() else out


def set_up(model: BertHeads, data: list[TaskData], settings: TrainSettings) -> Run:
    """Accelerate (device, processes), AdamW and the linear warm-up/decay schedule."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, set_seed
    from transformers import get_linear_schedule_with_warmup

    handlers = [DistributedDataParallelKwargs(find_unused_parameters=len(data) > 1)]
    device = resolve_device(settings.device)
    if device.type == "cuda" and device.index and "LOCAL_RANK" not in os.environ:
        torch.cuda.set_device(device)  # one process on cuda:N (under torchrun each rank has its own)
    # On the CPU, cpu=True lets Accelerate set up gloo when torchrun starts several processes.
    # Mixed precision: autocast around the forward pass (`train_step`; the weights, gradients and
    # optimizer stay fp32), and for fp16 Accelerate's gradient scaler.
    precision = training_precision(settings.precision, device)[0]
    accelerator = Accelerator(kwargs_handlers=handlers, cpu=device.type == "cpu",
                              mixed_precision="fp16" if precision == "fp16" else "no")
    set_seed(settings.seed)
    rank, world = accelerator.process_index, accelerator.num_processes
    frozen = all(d.cached is not None for d in data)
    if frozen:
        model.encoder.requires_grad_(False)
    else:  # (a frozen encoder runs in eval mode, or not at all: its states come from the cache)
        model.encoder.set_attention_dropout(settings.attention_dropout)
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
    wrapped, optimizer = accelerator.prepare(HeadsModule(model.heads) if frozen else model, optimizer)
    return Run(accelerator, wrapped, optimizer, scheduler, [p for p in model.parameters() if p.requires_grad],
               model.encoder.tokenizer.pad_token_id or 0, frozen, rank, world, DTYPES.get(precision))


def train_step(run: Run, data: list[TaskData], settings: TrainSettings, t: int, idx: list[int]) -> torch.Tensor:
    """One optimizer step on the batch `idx` of task `t`, in parts of `batch_size` examples
    whose gradients add up (`grad_accum`); the batch's mean loss, a tensor on the device (reading
    its value waits for the step to finish, which on a GPU would stall the next step's launch)."""
    device = run.accelerator.device
    d = data[t]
    parts = [idx[i : i + settings.batch_size] for i in range(0, len(idx), settings.batch_size)]
    total = torch.zeros((), device=device)
    for j, part in enumerate(parts):
        last = j == len(parts) - 1
        with nullcontext() if last else run.accelerator.no_sync(run.wrapped):
            with torch.autocast(device.type, dtype=run.autocast) if run.autocast else nullcontext():
                if d.cached is not None:
                    batch = d.cached.batch(part, d.train_features)
                    states = batch.pop("states")
                    states, batch = to_device(states, device), to_device(batch, device)
                    logits = float_outputs(run.wrapped(d.name, states, batch))
                else:
                    batch = collate([d.train_features[i] for i in part], run.pad_id)
                    batch = to_device(batch, device)
                    logits = float_outputs(run.wrapped(batch, [d.name])[d.name])
            loss = (d.loss or d.task.modeling.loss)(logits, batch)
            share = len(part) / len(idx)
            run.accelerator.backward(loss if len(parts) == 1 else loss * share)
        total += loss.detach().float() * share
    if settings.max_grad_norm:
        run.accelerator.clip_grad_norm_(run.trainable, settings.max_grad_norm)
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    return total


SHOW_LOSS_SECONDS = 0.5  # the bar's loss read from the device at most this often


def progress_line(name: str, batch: int, batches: int, loss: float, seen: int, seconds: float,
                  start: int = 0) -> str:
    """The progress bar's figures as one line, for a log file:
    `epoch 2/3: batch 40/120, loss=..., ex_s=..., 31.0 s, ETA 1 min 2 s`."""
    return (f"{name}: batch {batch}/{batches}, loss={loss:.4f}, ex_s={seen / max(seconds, 1e-9):.1f}, "
            f"{seconds:.1f} s, {eta(batch - start, batches - start, seconds)}")


def train_epoch(run: Run, model: BertHeads, data: list[TaskData], settings: TrainSettings, epoch: int,
                start: int = 0, after_step=None) -> dict:
    """One pass over this process's share of the batches, from batch `start` on; the running
    loss and speed. `after_step(batch_number, loss, examples)` runs after each step and returns
    True to end the epoch there."""
    model.train()
    if run.frozen:
        model.encoder.eval()
    plan = plan_epoch(data, settings, epoch - 1, run.rank, run.world)
    shown = settings.progress and run.accelerator.is_main_process
    terminal = shown and bars_shown()  # a bar on a terminal or in a notebook; in a log file, lines
    name = f"epoch {epoch}/{settings.epochs}"
    bar = progress_bar(len(plan), name, "batch", show=terminal, initial=start)
    seen, started, running = 0, time.perf_counter(), None
    lines = LogLines(name, len(plan), show=shown, start=start)  # where no bar is drawn, and one at the end
    last_shown = started - SHOW_LOSS_SECONDS
    for number in range(start, len(plan)):
        t, idx = plan[number]
        value = train_step(run, data, settings, t, idx)
        seen += len(idx)
        running = value if running is None else 0.98 * running + 0.02 * value  # on the device, no wait
        now = time.perf_counter()
        if terminal and now - last_shown >= SHOW_LOSS_SECONDS:
            bar.set_postfix(loss=f"{float(running):.4f}", ex_s=f"{seen / (now - started):.1f}", refresh=False)
            last_shown = now
        bar.update(1)
        if lines.due():
            log.info(progress_line(name, number + 1, len(plan), float(running), seen, now - started, start))
            lines.mark()
        if after_step is not None and after_step(number + 1, value, len(idx)):
            break
    bar.close()
    seconds = time.perf_counter() - started
    running = None if running is None else float(running)
    if shown and not terminal and running is not None:
        log.info(progress_line(name, number + 1, len(plan), running, seen, seconds, start))
    return {"train_examples_per_second": round(seen * run.world / max(seconds, 1e-9), 2), "train_loss": running,
            "lr": settings.lr}


def fit(model: BertHeads, data: list[TaskData], settings: TrainSettings, out: str | Path | None,
        evaluate=evaluate_task, extra_manifest: dict | None = None, on_epoch=None, on_step=None,
        on_evaluate=None) -> dict:
    """Train `model` on `data`; evaluate each task after every epoch (and every
    `settings.eval_every` steps) and keep the best (or, with `settings.keep == "last"`, the
    last) to save at `out`. With `out`, the run writes checkpoints and its log there, and
    `settings.resume` continues the run whose checkpoint is there.

    `evaluate(model, task_data)` returns the dev metrics dict of one task, with its "loss".
    `on_epoch(epoch, record, kept)`, if given, is called on the main process after each epoch's
    evaluation (`record`: that epoch's history entry; `kept`: the `Choice` so far); an exception
    it raises ends the run (a hyperparameter search prunes a trial this way). The Python API's
    callbacks, on the main process: `on_step(step, loss)` after each optimizer step,
    `on_evaluate(epoch, dev)` after each evaluation (`dev`: {head: metrics}; `epoch` a fraction
    within an epoch with `eval_every`). `settings` are a run's settled ones (`training.resolve`);
    what a caller leaves open takes the kinds' fixed recipe.
    Returns `{"dev": metrics, "best_epoch": n, "kept": {"epoch", "by"}, "history": [...]}`.
    """
    if settings.keep not in KEEP_CHOICES:
        raise UserError(f"{said('keep')}: expected one of {', '.join(KEEP_CHOICES)}, got {settings.keep!r}")
    if settings.patience and not any(d.dev_examples is not None for d in data):
        raise UserError(f"{said('patience')}: needs a dev set ({said('dev')}) to tell whether evaluations improve")
    if settings.resume and out is None:
        raise UserError(f"{said('resume')}: needs the {said('out')} directory that holds the checkpoint")
    if not is_settled(settings):  # a caller that left defaults open (audit's folds, a test): the kinds' fixed recipe
        frozen = all(d.cached is not None for d in data)
        settings = settle_run(settings, data, "features" if frozen else "finetune", how="fixed").settings
    run = set_up(model, data, settings)
    threads = torch.get_num_threads()
    # heads on cached [CLS] (or pooled) states are a few small matrices: on CPU, one thread runs
    # them without waiting on the others (which a busy machine schedules late)
    small = run.frozen and run.accelerator.device.type == "cpu" and all(
        cached_positions(model.heads[d.name]) != "tokens" for d in data)
    if small:
        torch.set_num_threads(1)
    try:
        return Loop(run, model, data, settings, out, evaluate, extra_manifest, on_epoch, on_step, on_evaluate).go()
    except SystemFault:  # a full disk: a folder this run created goes, an earlier model stays
        if out is not None:
            checkpoint.abandon_fresh(out)
        raise
    finally:
        torch.set_num_threads(threads)
        if out is not None:
            lock.release(out)


class Loop:
    """The epochs of one run and what makes it resumable: the position (epoch, batch, step),
    the kept evaluation, evaluations without improvement, checkpoints, the log, Ctrl-C."""

    def __init__(self, run: Run, model: BertHeads, data: list[TaskData], settings: TrainSettings,
                 out: str | Path | None, evaluate, extra_manifest: dict | None, on_epoch=None, on_step=None,
                 on_evaluate=None) -> None:
        self.run, self.model, self.data, self.settings = run, model, data, settings
        self.on_epoch, self.on_step, self.on_evaluate = on_epoch, on_step, on_evaluate
        if evaluate is evaluate_task:  # the dev evaluation shows a bar as training does
            evaluate = partial(evaluate_task, progress=settings.progress)
        self.out = Path(out) if out is not None else None
        self.evaluate, self.extra_manifest = evaluate, extra_manifest
        self.main = run.accelerator.is_main_process
        self.steps_per_epoch = len(plan_epoch(data, settings, 0, run.rank, run.world))
        self.epoch, self.batch, self.step = 1, 0, 0
        self.kept, self.history = Choice(), []
        self.best: tuple[float, float] | None = None  # for --patience
        self.waited, self.stop, self.interrupted = 0, False, False
        self.identity = checkpoint.identity(model, data, settings, run.world) if out is not None else None
        self.log = None

    # -- the run --------------------------------------------------------------------------
    def go(self) -> dict:
        s = self.settings
        if s.resume:
            self.resume()
        elif self.out is not None and self.main:
            checkpoint.start_fresh(self.out)
        if self.out is not None and self.main:
            self.log = RunLog(self.out, s, after_step=self.step if s.resume else None)
            self.log.params((self.extra_manifest or {}).get("settings") or asdict(s))
        previous = signal.getsignal(signal.SIGINT)
        handled = threading.current_thread() is threading.main_thread()
        if handled:
            signal.signal(signal.SIGINT, self.on_interrupt)
        status = "FAILED"  # what the trackers are told if the loop does not finish
        try:
            if not s.resume and any(d.task.spec.starts_trained and d.dev_examples is not None for d in self.data):
                self.evaluation(0, {})  # a head that predicts from its start: epoch 0 may be the one to keep
            while self.epoch <= s.epochs and not self.stop:
                record = train_epoch(self.run, self.model, self.data, s, self.epoch, self.batch, self.after_step)
                if self.stop and self.batch < self.steps_per_epoch:
                    break  # stopped inside the epoch (--patience): its evaluation was the last
                self.evaluation(self.epoch, record)
                if self.on_epoch is not None and self.main:
                    self.on_epoch(self.epoch, self.history[-1], self.kept)
                self.epoch, self.batch = self.epoch + 1, 0
                if s.save_every is None and self.epoch <= s.epochs and not self.stop:
                    self.save_checkpoint()
            status = "FINISHED"
        except KeyboardInterrupt:
            status = "KILLED"
            raise
        finally:
            if handled:
                signal.signal(signal.SIGINT, previous)
            if self.log is not None and status != "FINISHED":
                self.log.close(status)
        if self.out is not None and self.main:
            checkpoint.remove(self.out)  # the run is complete
        self.run.accelerator.wait_for_everyone()
        if self.run.accelerator.device.type != "cpu":
            self.model.to("cpu")
        result = metrics_file(self.data, self.kept, self.history)
        if self.main:
            for name, why in result.get("learned_nothing", {}).items():
                log.warning(learned_nothing_line(name, why))
        if self.log is not None:
            self.log.close("FINISHED", result, self.out)
        return result

    def after_step(self, number: int, loss: torch.Tensor, examples: int) -> bool:
        """The step's bookkeeping; `loss` stays a device tensor unless a callback asks for it."""
        s = self.settings
        self.batch, self.step = number, self.step + 1
        if self.log is not None:
            self.log.train(self.step, self.step / self.steps_per_epoch, loss, self.run.scheduler.get_last_lr()[0],
                           examples * self.run.world, s.log_every)
        crash_point("train:step")
        if self.on_step is not None and self.main:
            self.on_step(self.step, float(loss))
        if s.eval_every and self.step % s.eval_every == 0 and number < self.steps_per_epoch:
            self.evaluation(round(self.epoch - 1 + number / self.steps_per_epoch, 4), {})
        if s.save_every and self.step % s.save_every == 0:
            self.save_checkpoint()
        if self.agreed(self.interrupted):
            self.save_checkpoint()
            where = f"; checkpoint saved in {self.out / checkpoint.DIRECTORY}, continue with the same " \
                    f"command and {said('resume', True)}" if self.out is not None else ""
            raise KeyboardInterrupt(f"stopped at step {self.step}{where}")
        return self.stop

    def evaluation(self, epoch, record: dict) -> None:
        """Evaluate (main process), keep or not, log, and decide on --patience (all processes)."""
        if self.main:
            before = self.kept
            self.kept = evaluate_and_save(self.model, self.data, self.settings, epoch, record, self.kept,
                                          self.history, self.out, self.evaluate, self.extra_manifest, self.step)
            self.model.train()
            if self.run.frozen:
                self.model.encoder.eval()
            dev = self.history[-1]["dev"]
            if self.on_evaluate is not None:
                self.on_evaluate(epoch, dev)
            if self.log is not None:
                self.log.evaluation(self.step, epoch, dev, self.kept is not before)
            if dev and self.settings.patience:
                score, loss = score_of(dev, selection_metric(self.data, self.settings, dev), metric_scales(self.data))
                if self.best is None or better(score, loss, Choice(score=self.best[0], loss=self.best[1])):
                    self.best, self.waited = (score, loss), 0
                else:
                    self.waited += 1
                    if self.waited >= self.settings.patience:
                        self.stop = True
                        tqdm.write(f"no improvement in {self.waited} evaluations ({said('patience')}): stopping")
        self.stop = self.agreed(self.stop, from_main=True)
        self.run.accelerator.wait_for_everyone()

    def agreed(self, flag: bool, from_main: bool = False) -> bool:
        """A flag all processes share: the main process's, or set when any process's is."""
        if self.run.world == 1:
            return flag
        import torch.distributed as dist

        value = torch.tensor([1 if flag else 0])
        if from_main:
            dist.broadcast(value, 0)
        else:
            dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item())

    def on_interrupt(self, signum, frame) -> None:
        if self.interrupted or self.out is None:  # a second Ctrl-C, or nowhere to save: stop now
            raise KeyboardInterrupt
        self.interrupted = True
        tqdm.write("bertheads: interrupted: saving a checkpoint after this step (Ctrl-C again to stop at once)")

    # -- checkpoints ------------------------------------------------------------------------
    def progress(self) -> dict:
        scaler = getattr(self.run.accelerator, "scaler", None)  # fp16: the gradient scaler's scale
        return {"epoch": self.epoch, "batch": self.batch, "step": self.step, "kept": asdict(self.kept),
                "history": self.history, "best": self.best, "waited": self.waited,
                **({"scaler": scaler.state_dict()} if scaler is not None else {})}

    def save_checkpoint(self) -> None:
        if self.out is None:
            return
        states = [checkpoint.rng_state()]
        if self.run.world > 1:
            import torch.distributed as dist

            states = [None] * self.run.world
            dist.all_gather_object(states, checkpoint.rng_state())
        if self.main:
            checkpoint.write(self.out, self.model, self.run.frozen, self.run.optimizer, self.run.scheduler, states,
                             self.identity, self.progress())
        self.run.accelerator.wait_for_everyone()

    def resume(self) -> None:
        saved = checkpoint.read(self.out, self.run.rank)
        why = checkpoint.mismatch(saved["state"].get("identity", {}), self.identity)
        if why:
            raise UserError(f"{said('resume')}: {self.out / checkpoint.DIRECTORY} does not belong to this run: {why}")
        checkpoint.restore(saved, self.model, self.run.frozen, self.run.optimizer, self.run.scheduler)
        p = saved["state"]["progress"]
        self.epoch, self.batch, self.step = int(p["epoch"]), int(p["batch"]), int(p["step"])
        self.kept, self.history = Choice(**p["kept"]), list(p["history"])
        self.best = tuple(p["best"]) if p.get("best") else None
        self.waited = int(p.get("waited", 0))
        scaler = getattr(self.run.accelerator, "scaler", None)
        if scaler is not None and p.get("scaler"):
            scaler.load_state_dict(p["scaler"])
        if self.main:
            tqdm.write(f"resuming at step {self.step} (epoch {self.epoch}, batch {self.batch})")


class HeadsModule(nn.Module):
    """The heads alone as one module (what a distributed wrapper needs): `(name, states, batch)`."""

    def __init__(self, heads: nn.ModuleDict) -> None:
        super().__init__()
        self.heads = heads

    def forward(self, name: str, states, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return head_output(self.heads[name], states, batch)
