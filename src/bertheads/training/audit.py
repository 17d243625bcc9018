"""`bertheads audit`: the rows of a training set whose given label the model disputes. Every
row gets an out-of-fold prediction (k heads, each trained by `training.loop.fit` on the other
folds: on the features cache's states with `--mode features`, by default the kind's reader of
them, `Scoring.audit_reader`; with its own copy of the encoder with `--mode finetune`), then
cleanlab's confident learning ranks and flags them (its `find_label_issues`, ranked by
self-confidence: the reference recipe, measured in bench/audit.py). The kind says what a unit
is and how it shows (`Judging.disputes`)."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from bertheads.base.errors import UserError
from bertheads.base.extras import require
from bertheads.base.progress import LogLines
from bertheads.base.schema import said, setting
from bertheads.base.values import positive_int
from bertheads.compute.batching import INFERENCE_BATCH
from bertheads.compute.runner import run_heads
from bertheads.encoder.pretrained import Encoder
from bertheads.model import BertHeads
from bertheads.saved.bundle import task_class
from bertheads.store.atomic import atomic_directory
from bertheads.store.encoder_refs import cache_root, reference
from bertheads.store.features_cache import CachedDev
from bertheads.store.guard import check_target
from bertheads.tasks.parts import AuditReader, Disputes
from bertheads.text.readers import source_name
from bertheads.training.config import MultiConfig
from bertheads.training.features import CachedHead, attach_cache, evaluate_cached
from bertheads.training.flags import kind_defaults
from bertheads.training.joint import read_task, run_inputs, task_settings
from bertheads.training.loop import TaskData, TrainSettings, evaluate_task, fit
from bertheads.training.provenance import plain
from bertheads.training.resolve import settle_run

log = logging.getLogger("bertheads")

ROWS = ("flagged", "all")
READERS = ("auto", "head")


@dataclass
class AuditSettings:
    """How `bertheads audit` judges a training set."""

    folds: int = setting(5, "k: every row is predicted by a head trained on the other k-1 folds", type=positive_int)
    rows: str = setting("flagged", "issues.jsonl holds the rows cleanlab flags as label issues, ranked (all: "
                                   "every row, ranked)", choices=ROWS)
    top: int = setting(20, "how many suspects summary.json (and the report) shows with their text",
                       type=positive_int)
    reader: str = setting("auto", "--mode features: what each fold trains on the frozen states: auto, the reader of "
                                  "them that found planted label errors best for the kind (docs/data.md; summary.json "
                                  "names it; the --layers, --layer-combine and --epochs given win); head: the head "
                                  "`train --mode features` trains",
                          choices=READERS)


FOLD = "_fold"  # in a joint batch: each row's fold number


class FoldCache:
    """A fold's share of a task's cached states: what `CachedFeatures` gives for the rows
    `index` names (`batch(idx, ...)` with idx counting within the fold); with `folds`, the
    batch also holds each row's fold number (`FOLD`), for heads trained side by side."""

    def __init__(self, cached, index: Sequence[int], features: Sequence[dict], folds: np.ndarray | None = None) -> None:
        self.cached, self.index, self.features, self.folds = cached, list(index), features, folds
        self.lengths = [cached.lengths[i] for i in self.index]
        self.pad_id = cached.pad_id

    def batch(self, idx: Sequence[int], _features=None) -> dict:
        rows = [self.index[i] for i in idx]
        batch = self.cached.batch(rows, self.features)
        if self.folds is not None:
            batch[FOLD] = torch.from_numpy(self.folds[rows])
        return batch


class FoldHeads(nn.Module):
    """k copies of a head side by side on the same cached states: outputs stacked `[k, ...]`.
    Copy j learns only from the rows outside fold j (`FoldLoss`), so the k heads of an audit
    train in one pass over the rows instead of k."""

    def __init__(self, heads: list[nn.Module]) -> None:
        super().__init__()
        self.folds = nn.ModuleList(heads)
        self.layers = heads[0].layers
        self.token_level = heads[0].token_level

    def forward(self, states, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.stack([head(states, batch) for head in self.folds])


class FoldLoss:
    """A task's modeling part as `fit` sees it when its head is a `FoldHeads`: the loss is the
    sum over copies j of the task's own loss on the rows outside fold j. The copies share no
    weights, so copy j's gradient is that of its own loss on its share of the batch."""

    def __init__(self, task) -> None:
        self.task = task

    def __getattr__(self, name: str):
        return getattr(self.task.modeling, name)

    def loss(self, stacked: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        folds = batch[FOLD].to(stacked.device)
        total = stacked.new_zeros(())
        for j in range(stacked.shape[0]):
            keep = folds != j
            if bool(keep.any()):
                total = total + self.task.modeling.loss(stacked[j][keep], rows_of(batch, keep))
        return total


def rows_of(batch: dict, keep: torch.Tensor) -> dict:
    """The rows `keep` of a batch (every tensor whose first axis is the batch's rows)."""
    size = keep.shape[0]
    return {k: v[keep] if isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == size else v
            for k, v in batch.items()}


@dataclass
class OutOfFold:
    """Every example's out-of-fold output and what made it."""

    task: object
    examples: list
    outputs: list
    folds: np.ndarray
    fold_metrics: list
    seconds: float
    fold_steps: list[int] = dataclasses.field(default_factory=list)  # each head's optimizer steps
    reader: str = ""  # what the folds trained (the kind's audit reader's name, or the head `train` trains)
    options: dict = dataclasses.field(default_factory=dict)  # the task's options the folds trained with
    settings: TrainSettings | None = None  # and the run's settings


def fold_numbers(count: int, folds: int, seed: int) -> np.ndarray:
    """Each example's fold: a seeded shuffle cut into `folds` near-equal parts."""
    if folds < 2:
        raise UserError(f"{said('folds', folds)}: needs at least 2 (each row is predicted by a head that never saw it)")
    if count < folds:
        raise UserError(f"{said('folds', folds)}: only {count} training examples")
    order = np.random.default_rng(seed).permutation(count)
    numbers = np.empty(count, dtype=np.int64)
    numbers[order] = np.arange(count) % folds
    return numbers


def fold_options(task, cli_options: dict | None, config: MultiConfig) -> dict:
    """The task's options for the folds: its mode features or finetune (auto: the folds fine-tune)."""
    options = task_settings(task, cli_options or {}, config.options)
    return {**options, "mode": "features" if options.get("mode") == "features" else "finetune"}


def with_reader(kind: str, options: dict, chosen: AuditReader | None, num_layers: int) -> dict:
    """The folds' options with the kind's audit reader's over those left at the kind's defaults."""
    if chosen is None:
        return options
    defaults = kind_defaults(kind)
    wanted = chosen.options_for(num_layers)
    return {**options, **{k: v for k, v in wanted.items() if options.get(k) == defaults.get(k)}}


def fold_reader(kind: str, options: dict, reader: str = "auto") -> AuditReader | None:
    """The kind's audit reader where the folds train on frozen states (not a branch of tuned
    layers) and `reader` is auto; None: the head `train` would train."""
    if reader not in READERS:
        raise UserError(f"{said('reader')}: expected one of {', '.join(READERS)}, got {reader!r}")
    if reader != "auto" or options.get("mode") != "features" or options.get("tune_layers") is not None:
        return None
    chosen = task_class(kind).parts.scoring.audit_reader
    return None if chosen is None or any(options.get(name) for name in chosen.unless) else chosen


def out_of_fold(config: MultiConfig, model: str, settings: TrainSettings, audit: AuditSettings,
                limit: int | None = None, cli_options: dict | None = None) -> OutOfFold:
    """Train `audit.folds` heads on the task of `config` (one task), each on all but one fold,
    and predict the fold it left out."""
    started = time.perf_counter()
    t = config.tasks[0]
    options = fold_options(t, cli_options, config)
    chosen = fold_reader(t.kind, options, audit.reader)
    if chosen is not None:
        log.info(f"audit: the folds' reader: {chosen.name} ({said('reader', 'head')}: the head `train` trains)")
    frozen = options["mode"] == "features"
    torch.manual_seed(settings.seed)
    encoder = Encoder.load(model, lazy=frozen)
    options = with_reader(t.kind, options, chosen, encoder.info.num_layers)
    if chosen is not None and chosen.epochs and settings.epochs is None:
        settings = dataclasses.replace(settings, epochs=chosen.epochs)
    task, examples = read_task(t.kind, t.train, encoder, options, t.limit or limit)
    task.scoring.disputes([], [], t.train)  # (a head the kind cannot audit is refused before any training)
    # inference features with the loss's targets: the rows a fold trains on and predicts are
    # the same encoded inputs (so one cache entry serves every fold)
    features, owner = task.modeling.encode_for_inference(examples, encoder.tokenizer, with_labels=True)
    if not features:
        raise UserError(f"{source_name(t.train)}: no usable training examples")
    dev = task.reading.read(t.dev, need_labels=True) if t.dev else None
    whole = TaskData(t.name, task, features, dev, t.dev)
    if frozen:
        # the frozen checkpoint's hash is the remembered one (as `train` keeps it): its weights
        # need not load to name the cache entry
        encoder.reference = reference(encoder, model, cache_root(options.get("cache_dir")))
        attach_cache(BertHeads(encoder, {t.name: task}), [whole], options, model, t.train, progress=settings.progress)
    numbers = fold_numbers(len(examples), audit.folds, settings.seed)
    feature_fold = numbers[np.asarray(owner)]
    fold_settings = dataclasses.replace(settings, keep="last", resume=False, overwrite=False)
    held = [np.flatnonzero(feature_fold == fold).tolist() for fold in range(audit.folds)]
    if frozen:
        fold_runs = joint_folds(t.name, task, encoder, whole, feature_fold, audit.folds, fold_settings)
    else:
        fold_runs = one_fold_at_a_time(t.name, task, encoder, whole, held, fold_settings)
    outputs: list = [None] * len(examples)
    fold_metrics, fold_steps = [], []
    lines = LogLines("audit", audit.folds, "folds", show=settings.progress)  # where no bar is drawn
    for fold, (fold_task, runner, metrics, steps) in enumerate(fold_runs):
        fold_metrics.append(metrics)
        fold_steps.append(steps)
        held_examples = sorted({owner[i] for i in held[fold]})
        local = {k: j for j, k in enumerate(held_examples)}
        held_features = [features[i] for i in held[fold]]
        held_owner = [local[owner[i]] for i in held[fold]]
        if frozen:
            dev_view = CachedDev(held_features, held_owner, FoldCache(whole.cached, held[fold], features))
            runner = CachedHead(t.name, fold_task, runner, dev_view, next(runner.parameters()).device)
        raw = run_heads(runner, held_features, [t.name], INFERENCE_BATCH,
                        progress=f"audit fold {fold + 1}/{audit.folds}: held-out rows" if settings.progress else None)[t.name]
        merged = fold_task.judging.collect(raw, held_owner, [examples[k] for k in held_examples], held_features)
        for k, out in zip(held_examples, merged):
            outputs[k] = out
        lines.tick(fold + 1)
    reader = chosen.name if chosen is not None else f"the {t.kind} head `train` trains"
    return OutOfFold(task, examples, outputs, numbers, fold_metrics, time.perf_counter() - started, fold_steps, reader,
                     options, settings)


def one_fold_at_a_time(name: str, task, encoder, whole: TaskData, held: list[list[int]], settings: TrainSettings):
    """Fine-tuning: per fold (the encoder put back to the checkpoint's weights first), a fresh
    head and the encoder trained on the other folds; yields (task, the net, dev metrics, steps)."""
    start = {k: v.detach().clone() for k, v in encoder.model.state_dict().items()}
    for fold, held_idx in enumerate(held):
        log.info(f"audit: fold {fold + 1}/{len(held)}")
        out = set(held_idx)
        train_idx = [i for i in range(len(whole.train_features)) if i not in out]
        fold_task = copy.deepcopy(task)  # the same fresh head each fold
        encoder.model.load_state_dict(start)
        net = BertHeads(encoder, {name: fold_task})
        data = TaskData(name, fold_task, [whole.train_features[i] for i in train_idx], whole.dev_examples,
                        whole.dev_path)
        result = fit(net, [data], settings, None, evaluate_task)
        yield fold_task, net, plain(result.get("dev", {}).get(name, {})), steps_taken(result)
        del net
    encoder.model.load_state_dict(start)


def joint_folds(name: str, task, encoder, whole: TaskData, feature_fold: np.ndarray, folds: int,
                settings: TrainSettings):
    """Features mode: the k heads trained side by side in one pass over the cached states
    (`FoldHeads`; the gradients of all k are clipped together, to the norm times sqrt(k));
    then per fold (task, its head, dev metrics, steps)."""
    log.info(f"audit: {folds} heads side by side on the cached states")
    heads = FoldHeads([copy.deepcopy(task.head) for _ in range(folds)])  # the same fresh head each fold
    joint = copy.copy(task)  # the task with the folds' loss
    joint.modeling = FoldLoss(task)
    net = BertHeads(encoder, {name: task})
    net.heads[name] = heads
    every = list(range(len(whole.train_features)))
    data = TaskData(name, joint, whole.train_features, None, None,
                    cached=FoldCache(whole.cached, every, whole.train_features, feature_fold))
    settings = settle_run(settings, [whole], "features", how="fixed").settings  # (as a fold run settles it)
    # head j learns from the (k-1)/k of each batch outside fold j: batches of batch_size * k/(k-1)
    # rows give each head the batch size, and the number of steps, of its own run
    batch = max(settings.batch_size, round(settings.batch_size * folds / (folds - 1)))
    result = fit(net, [data], dataclasses.replace(settings, batch_size=batch,
                                                  max_grad_norm=settings.max_grad_norm * folds ** 0.5), None, evaluate_task)
    steps = steps_taken(result)
    for head in heads.folds:
        fold_task = copy.deepcopy(task, {id(task.head): head})  # its own spec (a dev set fits its temperature)
        metrics = {}
        if whole.dev_cached is not None:
            metrics = plain(evaluate_cached(fold_task, head, whole.dev_cached, whole.dev_examples, whole.dev_path))
        yield fold_task, head, metrics, steps


def steps_taken(result: dict) -> int:
    """The optimizer steps a `fit` run took (its last epoch's record)."""
    return int(((result.get("history") or [{}])[-1]).get("step", 0))


# -- ranking --------------------------------------------------------------------------------
@dataclass
class Ranking:
    """The units of a `Disputes` ranked: `order` (most suspect first), each unit's `score`
    (label quality, lower is more suspect), which units cleanlab `flagged`, the estimated noise
    rate of each class."""

    order: np.ndarray
    score: np.ndarray
    flagged: np.ndarray
    noise: dict


def rank(disputes: Disputes) -> Ranking:
    """cleanlab's label quality (self-confidence) and its label issues (`find_label_issues`'s
    default, prune by noise rate); a kind's own scores are ranked as they are."""
    if disputes.probs is None:
        score = np.asarray(disputes.scores, dtype=float)
        flagged = np.asarray(disputes.flagged, dtype=bool)
        return Ranking(np.argsort(score, kind="stable"), score, flagged, {})
    require("audit", "bertheads audit")
    from cleanlab.count import estimate_joint
    from cleanlab.filter import find_label_issues
    from cleanlab.rank import get_label_quality_scores

    probs = np.clip(np.asarray(disputes.probs, dtype=float), 1e-6, 1.0)
    if disputes.multi_label:
        from cleanlab.multilabel_classification.filter import find_label_issues as find_multi
        from cleanlab.multilabel_classification.rank import get_label_quality_scores as multi_scores

        score = multi_scores(disputes.labels, probs)
        flagged = find_multi(disputes.labels, probs, n_jobs=1)
        noise = {}
        for j, name in enumerate(disputes.names):
            given = np.asarray([int(j in labels) for labels in disputes.labels])
            binary = np.stack([1 - probs[:, j], probs[:, j]], axis=1)
            noise[name] = class_noise(estimate_joint(given, binary))[1] if 0 < given.sum() < len(given) else 0.0
    else:
        labels = np.asarray(disputes.labels, dtype=np.int64)
        probs = probs / probs.sum(1, keepdims=True)
        score = get_label_quality_scores(labels, probs, method="self_confidence")
        present = np.unique(labels)
        if len(present) < 2:
            raise UserError("audit: the training labels hold one class only; there is nothing to dispute")
        flagged = find_label_issues(labels, probs, n_jobs=1)
        noise = {name: rate for c, (name, rate) in enumerate(zip(disputes.names, class_noise(estimate_joint(labels, probs))))
                 if c in present}  # the classes the given labels have (a tag of the scheme may have none)
    return Ranking(np.argsort(score, kind="stable"), np.asarray(score, dtype=float), np.asarray(flagged, dtype=bool),
                   {k: round(float(v), 4) for k, v in noise.items()})


def class_noise(joint: np.ndarray) -> list[float]:
    """Per given class, the share of its rows whose true class is estimated to be another."""
    rows = joint.sum(1)
    return [float(1 - joint[c, c] / rows[c]) if rows[c] > 0 else 0.0 for c in range(len(rows))]


def issue_records(disputes: Disputes, ranking: Ranking, examples: list, path, only_flagged: bool) -> list[dict]:
    """The ranked units as issues.jsonl's records: where the row is (file, line, id), the given
    and the suggested label with both probabilities, the score, what the kind shows of it."""
    name = source_name(path)
    out = []
    for i in ranking.order:
        if only_flagged and not ranking.flagged[i]:
            continue
        unit = disputes.units[i]
        e = examples[unit["example"]]
        record = {"file": name, "line": getattr(e, "line", None),
                  "id": (getattr(e, "extra", None) or {}).get("id"), "row": unit["example"]}
        record.update(judged(disputes, i))
        record.update({"score": round(float(ranking.score[i]), 6), "flagged": bool(ranking.flagged[i])})
        record.update({k: v for k, v in unit.items() if k != "example"})
        out.append(record)
    return out


def judged(disputes: Disputes, i: int) -> dict:
    """Unit i's given and suggested labels and their probabilities."""
    names, given = disputes.names, disputes.labels[i]
    if disputes.probs is None:
        return {"given": given, "suggested": disputes.suggested[i]}
    p = disputes.probs[i]
    if disputes.multi_label:
        chosen = [j for j in range(len(names)) if p[j] >= 0.5]
        return {"given": [names[j] for j in given], "suggested": [names[j] for j in chosen],
                "given_probability": {names[j]: round(float(p[j]), 6) for j in given},
                "suggested_probability": {names[j]: round(float(p[j]), 6) for j in chosen}}
    best = int(np.argmax(p))
    return {"given": names[given], "suggested": names[best], "given_probability": round(float(p[given]), 6),
            "suggested_probability": round(float(p[best]), 6)}


@dataclass
class AuditResult:
    """What an audit found: `issues` (ranked records, the flagged ones unless every row was
    asked for), `ranking` (every unit ranked, flagged or not) and `summary`."""

    issues: list[dict]
    ranking: list[dict]
    summary: dict
    out: Path | None = None


def audit_task(config: MultiConfig, out: str | Path | None, model: str = "default",
               settings: TrainSettings | None = None, audit: AuditSettings | None = None, limit: int | None = None,
               cli_options: dict | None = None) -> AuditResult:
    """Out-of-fold predictions for the task of `config`, ranked; `out/issues.jsonl` and
    `out/summary.json` written (atomically, as one folder) when `out` is given."""
    settings = settings or TrainSettings()
    audit = audit or AuditSettings()
    if not config.single or len(config.tasks) != 1:
        raise UserError(f"{config.path}: audit reads one task")
    if audit.rows not in ROWS:
        raise UserError(f"{said('rows')}: expected one of {', '.join(ROWS)}, got {audit.rows!r}")
    if out is not None:  # (before any training: never over the data, a model, or a folder of other files)
        check_target(out, "summary.json", inputs=run_inputs(config, model), overwrite=settings.overwrite,
                     what="an audit's folder")
    oof = out_of_fold(config, model, settings, audit, limit, cli_options)
    task, examples = oof.task, oof.examples
    disputes = task.scoring.disputes(oof.outputs, examples, config.tasks[0].train)
    ranking = rank(disputes)
    everything = issue_records(disputes, ranking, examples, config.tasks[0].train, only_flagged=False)
    issues = everything if audit.rows == "all" else [r for r in everything if r["flagged"]]
    t = config.tasks[0]
    accuracy = None
    if disputes.probs is not None and not disputes.multi_label:
        accuracy = round(float(np.mean(np.argmax(disputes.probs, 1) == np.asarray(disputes.labels))), 4)
    summary = {
        "kind": t.kind, "train": source_name(t.train), "examples": len(examples), "unit": disputes.unit,
        "units": len(disputes.units), "flagged": int(ranking.flagged.sum()),
        "flagged_share": round(float(ranking.flagged.mean()), 4) if len(ranking.flagged) else 0.0,
        "noise_rate": ranking.noise, "out_of_fold_agreement": accuracy,
        "classes": {n: int(c) for n, c in class_counts(disputes).items()},
        "top": [{k: r[k] for k in r if k not in ("flagged",)} for r in issues[:audit.top]],
        "fold_dev": oof.fold_metrics, "fold_steps": oof.fold_steps, "seconds": round(oof.seconds, 2),
        "reader": oof.reader,
        "ranking": "cleanlab find_label_issues (prune by noise rate), ranked by self-confidence"
                   if disputes.probs is not None else f"the {t.kind} kind's own score",
        "settings": plain({"model": model, "audit": dataclasses.asdict(audit),
                           "training": {k: v for k, v in dataclasses.asdict(oof.settings or settings).items()
                                        if k in ("epochs", "lr", "batch_size", "seed", "max_grad_norm", "warmup_ratio")},
                           "task": {k: v for k, v in oof.options.items()
                                    if v is not None}}),
    }
    if out is not None:
        write_audit(Path(out), issues, summary)
    return AuditResult(issues, everything, summary, Path(out) if out is not None else None)


def class_counts(disputes: Disputes) -> dict:
    counts = dict.fromkeys(disputes.names, 0)
    for given in disputes.labels:
        for j in (given if isinstance(given, list) else [given]):
            if isinstance(j, int) and 0 <= j < len(disputes.names):
                counts[disputes.names[j]] += 1
    return counts


def write_audit(out: Path, issues: list[dict], summary: dict) -> None:
    """DIR/issues.jsonl and DIR/summary.json, the folder replaced in one step."""
    with atomic_directory(out) as tmp:
        (tmp / "issues.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in issues),
                                          encoding="utf-8")
        (tmp / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
