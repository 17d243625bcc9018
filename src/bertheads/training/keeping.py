"""Which evaluation a run keeps, and what metrics.json says of it: each task's dev metrics after
an epoch (`evaluate_task`), the metric that ranks them (`selection_metric`, `score_of`), the
rule (`better`: a higher score, then a lower dev loss), and the save of the kept model with its
history (`evaluate_and_save`, `metrics_file`). `data` is the run's `loop.TaskData` list."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bertheads.base.errors import UserError
from bertheads.base.schema import said
from bertheads.compute.batching import INFERENCE_BATCH
from bertheads.inference.path import evaluate_head
from bertheads.model import BertHeads
from bertheads.saved import bundle
from bertheads.store.atomic import atomic_write_text
from bertheads.training.features import evaluate_cached
from bertheads.training.settings import TrainSettings

log = logging.getLogger(__name__)
LOWER_IS_BETTER = ("loss", "mse")  # dev metrics where smaller is better


@dataclass
class Choice:
    """The evaluation kept so far and why (see `better`)."""

    epoch: int = 0
    score: float = -math.inf
    loss: float = math.inf
    metrics: dict = field(default_factory=dict)
    by: str = ""
    step: int = 0


def evaluate_task(model: BertHeads, data, batch_size: int = INFERENCE_BATCH, progress: bool = False) -> dict:
    """A task's dev metrics after an epoch, with its mean dev `loss` (from the dev set's cached
    states when the encoder is frozen); `progress`: a bar where bars are drawn."""
    if data.dev_cached is not None:
        return evaluate_cached(data.task, model.heads[data.name], data.dev_cached, data.dev_examples, data.dev_path,
                               batch_size)
    return evaluate_head(model, data.name, data.dev_examples, data.dev_path, batch_size,
                         progress=f"dev {data.name}" if progress else None, during_training=True)


def selection_metric(data: list, settings: TrainSettings, metrics: dict) -> dict[str, str]:
    """The dev metric that ranks evaluations, per task (`--select-metric` or the task's main one)."""
    chosen = {}
    for d in data:
        if d.name not in metrics:
            continue
        name = settings.select_metric or d.task.judging.main_metric
        value = metrics[d.name].get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or name == "examples":
            known = sorted(k for k, v in metrics[d.name].items() if isinstance(v, (int, float))
                       and not isinstance(v, bool) and k != "examples")
            raise UserError(f"{said('select_metric', name)}: head {d.name!r} has no such dev metric (has: {', '.join(known)})")
        chosen[d.name] = name
    return chosen


def score_of(metrics: dict, chosen: dict[str, str], scales: dict[str, float] | None = None) -> tuple[float, float]:
    """(score, dev loss) of one evaluation: the mean over tasks of the selection metric (negated
    where smaller is better; divided by the task's `scales` entry, so that SQuAD's 0-100 scores
    and 0-1 accuracies weigh alike) and of the dev loss."""
    scales = scales or {}
    scores = [(-1 if name in LOWER_IS_BETTER else 1) * float(metrics[t][name]) / scales.get(t, 1.0)
              for t, name in chosen.items()]
    losses = [float(metrics[t].get("loss", math.nan)) for t in chosen]
    return float(np.mean(scores)), float(np.mean(losses))


def metric_scales(data: list) -> dict[str, float]:
    """Each task's metric scale (100 for metrics in percent, such as SQuAD's EM and F1)."""
    return {d.name: float(getattr(d.task, "metric_scale", 1.0)) for d in data}


def better(score: float, loss: float, kept: Choice) -> bool:
    """A higher score wins; an equal score wins with a lower dev loss (so a later epoch that
    only grew more confident replaces an earlier tie)."""
    if math.isclose(score, kept.score, rel_tol=1e-12, abs_tol=1e-12):
        return not math.isnan(loss) and (math.isnan(kept.loss) or loss < kept.loss)
    return score > kept.score


def evaluate_and_save(model: BertHeads, data: list, settings: TrainSettings, epoch: int,
                      record: dict, kept: Choice, history: list, out: str | Path | None, evaluate,
                      extra_manifest: dict | None, step: int = 0) -> Choice:
    """Evaluate every task with a dev set, record the epoch (a fraction within an epoch) and
    step, and save the model to `out` when it is the one to keep (`settings.keep`); otherwise
    refresh the saved model's metrics.json."""
    metrics = {d.name: evaluate(model, d) for d in data if d.dev_examples is not None}
    record = {"epoch": epoch, "step": step, **record, "dev": metrics}
    history.append(record)
    if metrics:
        chosen = selection_metric(data, settings, metrics)
        score, loss = score_of(metrics, chosen, metric_scales(data))
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
        said_before = uncalibrated(kept.metrics)
        kept = Choice(epoch, score, loss, metrics, rule, step)
    if summary or keep_now:
        note = "kept" if keep_now else f"epoch {kept.epoch} stays kept"
        log.info(f"epoch {epoch}: {summary}{'  ' if summary else ''}({note}: {rule})")
    if keep_now:  # why the kept heads have no temperature, when that changed
        for name, why in uncalibrated(metrics).items():
            if said_before.get(name) != why:
                log.info(f"{name}: no temperature: {why}")
    if out is not None:
        result = metrics_file(data, kept, history)
        if keep_now:
            bundle.save(model, out, result, extra_manifest)
        else:  # keep the saved model, refresh its history
            atomic_write_text(Path(out) / "metrics.json", json.dumps(result, indent=2) + "\n")
    return kept


def uncalibrated(metrics: dict) -> dict[str, str]:
    """Per head of one evaluation's dev metrics, why it has no temperature (`calibration.none`)."""
    return {name: m["calibration"]["none"] for name, m in metrics.items()
            if isinstance(m, dict) and isinstance(m.get("calibration"), dict) and m["calibration"].get("none")}


def metrics_file(data: list, kept: Choice, history: list) -> dict:
    """What metrics.json holds: the kept evaluation's dev metrics, which epoch it was and why,
    and every epoch's record."""
    metrics = kept.metrics
    dev = metrics[data[0].name] if len(data) == 1 and metrics else metrics
    result = {"dev": dev, "best_epoch": kept.epoch, "kept": {"epoch": kept.epoch, "by": kept.by}, "history": history}
    nothing = {d.name: why for d in data if (why := d.task.judging.learned_nothing((metrics or {}).get(d.name) or {}))}
    if nothing:  # the heads whose kept dev metrics say they learned nothing, and how they show it
        result["learned_nothing"] = nothing
    return result
