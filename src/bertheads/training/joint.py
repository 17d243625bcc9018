"""Joint training of a config's tasks on one encoder (one task is the single-head case that
`bertheads train KIND` runs; the config file itself is read in `training/config.py`): each
task's data read and encoded once and its spec settled from it, the run settled
(`training/resolve.py`), the heads built in the run's mode (or continued from a saved model),
the features cache attached in features mode, and the loop run. What the saved model records
of how it was made is `training/provenance.py`'s."""


from __future__ import annotations

import logging
import os
import random
import tempfile
from dataclasses import fields
from functools import partial
from pathlib import Path

import torch

from bertheads.base.errors import UserError
from bertheads.base.schema import new_names, said, tagged
from bertheads.encoder.layers import parse_layers
from bertheads.encoder.pretrained import Encoder
from bertheads.model import BertHeads, attach_branch
from bertheads.saved import bundle
from bertheads.store import lock
from bertheads.store.encoder_refs import cache_root, reference
from bertheads.tasks.recipes import holdout_size
from bertheads.training import checkpoint
from bertheads.training.config import MultiConfig, TaskConfig
from bertheads.training.contrastive import tune_encoder
from bertheads.training.features import attach_cache
from bertheads.training.flags import kind_defaults, task_class
from bertheads.training.keeping import Choice, evaluate_and_save, metrics_file
from bertheads.training.loop import TaskData, TrainSettings, evaluate_task, fit
from bertheads.training.provenance import chosen_line, made_from, made_with, mode_line
from bertheads.training.resolve import holdout_share, settle_run
from bertheads.training.settings import AUTO, FROZEN_HEAD_MODES, MODES, HeadOptions, recipe_of, spec_name
from bertheads.training.timing import plan
from bertheads.training.trackers import check_trackers

log = logging.getLogger("bertheads")

def task_settings(task: TaskConfig, cli_options: dict, shared: dict | None = None) -> dict:
    """A task's options: its kind's defaults, then the config's options for every task
    (`shared`), then the command line's, then its own."""
    options = kind_defaults(task.kind)
    allowed = set(options)
    for given in (shared or {}, new_names(cli_options, HeadOptions)):
        options.update({k: v for k, v in given.items() if v is not None and k in allowed})
    options.update({k: v for k, v in task.options.items() if v is not None})
    return branch_mode(options)


def make_spec(cls, options: dict, encoder: Encoder):
    """The task's spec from CLI/API options (keys that are not spec fields are ignored)."""
    names = {f.name for f in fields(cls.spec_type)}
    options = {spec_name(k): v for k, v in options.items()}
    spec = cls.spec_type(**{k: v for k, v in options.items() if k in names and v is not None})
    if isinstance(spec.layers, str) or spec.layers is None:
        spec.layers = list(parse_layers(spec.layers, encoder.info.num_layers))
    if spec.mode == AUTO:  # a run whose data is not read yet (`settle_run` decides): fine-tuning for now
        spec.mode = "finetune"
    if spec.mode not in MODES:
        raise UserError(f"{said('mode')}: expected {', '.join(MODES)}, got {spec.mode!r}")
    if spec.tune_layers is not None:
        settle_branch(spec, encoder.info.num_layers)
    fit_max_length(spec, encoder, given=options.get("max_length") != kind_defaults(cls.kind).get("max_length"))
    return spec


def settle_branch(spec, count: int) -> None:
    """A head with its own top `tune_layers` layers reads the trunk's layer below them (its
    split, `spec.layers`), on the frozen encoder (`mode` features)."""
    if not 0 <= spec.tune_layers <= count:
        raise UserError(f"{said('tune_layers', spec.tune_layers)}: the encoder has {count} layers (0 to {count})")
    if tuple(i % (count + 1) for i in spec.layers) not in ((count,), (count - spec.tune_layers,)):
        raise UserError(f"{said('tune_layers')}: the head reads its own last layer; leave {said('layers')} out")
    spec.layers = [count - spec.tune_layers]
    spec.mode = "features"


def branch_mode(options: dict) -> dict:
    """A task's options with `tune_layers` set: the encoder below its branch is frozen (`mode` features)."""
    if options.get("tune_layers") is None:
        return options
    if options.get("mode") not in (None, AUTO, "features"):
        raise UserError(f"{said('tune_layers')} trains the head's own top layers on the frozen checkpoint; "
                        f"it does not go with {said('mode', options['mode'])}")
    return {**options, "mode": "features"}


def fit_max_length(spec, encoder: Encoder, given: bool = True) -> None:
    """Hold `spec.max_length` to what the encoder can read (`EncoderInfo.max_tokens`): a length
    asked for beyond it is refused in one line naming the limit; the kind's default is lowered
    to it, with a warning."""
    limit = encoder.info.max_tokens
    if limit is None or int(spec.max_length) <= limit:
        return
    kind = getattr(encoder.config, "model_type", None) or "this"
    if given:
        raise UserError(f"{said('max_length', spec.max_length)}: the {kind} encoder reads at most {limit} tokens")
    log.warning(f"{said('max_length')}: the {kind} encoder reads at most {limit} tokens; using {limit} "
                f"(not the default {spec.max_length})")
    spec.max_length = limit


def read_examples(kind: str, train_path: str, encoder: Encoder, options: dict, limit: int | None = None):
    """One task's spec settled from its options and training data; the task, its head not built
    yet (`fresh_head`), and its training examples (the first `limit`)."""
    cls = task_class(kind)
    spec = make_spec(cls, options, encoder)
    extra = {k: v for k, v in {**options, "limit": limit}.items() if k in cls.parts.modeling.prepare_options}
    examples = cls.prepare(train_path, spec, encoder, **extra)  # (a task may stop reading at limit)
    if limit:
        examples = examples[:limit]
    return cls(spec, None), examples


def fresh_head(task, encoder: Encoder):
    """The task with a fresh head for its settled spec (mode included), its first layer started
    from the checkpoint's weights where its kind says so."""
    cls = type(task)
    head = cls.build(task.spec, encoder, cls.parts.modeling.start_weights(task.spec, encoder)).head
    task.head = attach_branch(head, task.spec, encoder, fresh=True)
    return task  # (the same task: what its parts learned from the data, the loss's yardstick, is kept)


def read_task(kind: str, train_path: str, encoder: Encoder, options: dict, limit: int | None = None):
    """One task's spec settled from its options and training data, its fresh head built; the
    task and its training examples (the first `limit`)."""
    task, examples = read_examples(kind, train_path, encoder, options, limit)
    return fresh_head(task, encoder), examples


def read_data(kind: str, train_path: str, dev_path: str | None, encoder: Encoder, options: dict,
              limit: int | None = None, name: str | None = None, holdout: float = 0.0, seed: int = 0) -> TaskData:
    """Read and encode one task's training (and dev) data, its head not built yet (`fresh_head`,
    once the run's mode is settled). Without a dev file, `holdout` (a share) of the training
    examples, drawn with `seed`, is the dev set."""
    task, examples = read_examples(kind, train_path, encoder, options, limit)
    given, dev = len(examples), None
    if dev_path is None and (count := holdout_size(len(examples), holdout)):
        order = list(range(len(examples)))
        random.Random(seed).shuffle(order)
        held = set(order[:count])
        dev = [e for i, e in enumerate(examples) if i in held]
        examples = [e for i, e in enumerate(examples) if i not in held]
    features = task.modeling.encode(examples, encoder.tokenizer, with_labels=True, path=train_path)
    if not features and train_path is not None:
        raise UserError(f"{train_path}: no usable training examples")
    task.spec.trained_counts = task.scoring.class_counts(examples)  # (saved with the head, read by `select`)
    if dev_path:
        dev = task.reading.read(dev_path, need_labels=True)
    return TaskData(name or kind, task, features, dev, dev_path, examples=given, held_out=len(dev or ()) * (not dev_path))


def prepare_task(kind: str, train_path: str, dev_path: str | None, encoder: Encoder, options: dict,
                 limit: int | None = None, name: str | None = None, holdout: float = 0.0,
                 seed: int = 0) -> TaskData:
    """`read_data` with the head built in the mode the options give (fine-tuning by default)."""
    data = read_data(kind, train_path, dev_path, encoder, options, limit, name, holdout, seed)
    data.task = fresh_head(data.task, encoder)
    return data


def run_inputs(config: MultiConfig, model: str | None = None) -> list:
    """What a run reads, which its output never replaces: the config file, each task's data
    files and a local checkpoint."""
    local = [model] if model and Path(str(model)).exists() else []
    return [config.path, *local, *(f for t in config.tasks for f in (t.train, t.dev))]


def train_tasks(config: MultiConfig, out: str | Path | None, model: str = "default",
                settings: TrainSettings | None = None, limit: int | None = None,
                cli_options: dict | None = None, extra_manifest: dict | None = None,
                on_epoch=None, on_step=None, on_evaluate=None, home: str | Path | None = None) -> tuple[BertHeads, dict]:
    """Train every task of `config` on one shared encoder (batches sampled across tasks by
    `config.sampling`); evaluate each head after every epoch; save the kept epoch to `out`.
    `on_epoch`, `on_step` and `on_evaluate` are passed to `training.loop.fit`. Returns the trained network and what metrics.json holds."""
    settings = settings or TrainSettings()
    settings.sampling, settings.temperature = config.sampling, config.temperature
    if check_trackers(settings) and out is None:  # (an unknown tracker is refused before any data is read)
        raise UserError(f"{said('track')}: a tracked run needs an output directory ({said('out')})")
    if out is not None:
        checkpoint.claim_out(out, settings.resume, settings.overwrite, run_inputs(config, model), home)
    try:
        options = {t.name: task_settings(t, cli_options or {}, config.options) for t in config.tasks}
        given_modes = {opts.get("mode") for opts in options.values()} - {None, AUTO}
        if len(given_modes) > 1:
            raise UserError(f"{config.path}: tasks mix {said('mode', 'finetune')} and features; train them apart and "
                            f"`bertheads combine` features-mode models, or use one mode")
        auto = [name for name, opts in options.items() if opts.get("mode") in (None, AUTO)]
        how = recipe_of(settings)
        torch.manual_seed(settings.seed)
        saved = bundle.load(model) if bundle.is_model(model) else None
        # features mode (or a mode still to be decided): the weights load only if needed
        encoder = saved.encoder if saved is not None else Encoder.load(model, lazy="finetune" not in given_modes)
        data = [read_data(t.kind, t.train, t.dev, encoder, options[t.name], t.limit or limit, t.name,
                          holdout_share(settings, how), settings.seed) for t in config.tasks]
        bare = [d.name for d in data if not d.train_features]
        if bare and len(bare) < len(data):
            raise UserError(f"{config.path}: head {bare[0]!r} has no training rows and the others have; train it "
                            f"alone (its settings make it) and join the models with `bertheads combine`")
        if bare:  # heads from their settings alone: nothing to train
            return untrained(data, encoder, model, out, options[config.tasks[0].name],
                             {"source_model": model, **(extra_manifest or {}), "made_with": made_with(),
                              "settings": made_from(config, model, settings, limit, options)}, settings)
        run = settle_run(settings, data, next(iter(given_modes), None), mode_left=bool(auto),
                         continuing=saved is not None, how=how)
        main_process, one_process = os.environ.get("RANK", "0") == "0", os.environ.get("WORLD_SIZE", "1") == "1"
        line, timed = chosen_line(run, data), None
        if settings.time_budget is not None and one_process:  # the mode that fits, from a timed warm-up
            run, note, timed = plan(run, data, encoder, continuing=saved is not None)
            line = f"{chosen_line(run, data)}; {note}"
        if line and main_process:
            log.info(line)  # what the recipe for the data's size chose, once, before any stage (pairs, caching, epochs)
        if settings.time_budget is None and one_process:  # (after the chosen line: the warm-up takes a few seconds)
            timed = plan(run, data, encoder, continuing=saved is not None)[2]
        if timed and main_process:
            log.info(timed)  # the stages' estimate here, and the faster modes with their measured cost
        settings, mode = run.settings, run.mode
        for name in auto:
            options[name]["mode"] = mode
        for d in data:  # (reading draws no random numbers: the heads start as they would with the mode given)
            d.task.spec.mode = mode
            d.task = fresh_head(d.task, encoder)
        if mode != "features":
            encoder.model  # noqa: B018  (a lazy encoder's weights load now: they are trained)
        if saved is not None:
            continue_heads(saved, data, model)
        net = BertHeads(encoder, {d.name: d.task for d in data})
        if mode == "features":
            # the frozen encoder is the checkpoint as loaded: its hash is remembered, and the
            # model directory refers to it instead of holding a copy
            encoder.reference = reference(encoder, model, cache_root(options[config.tasks[0].name].get("cache_dir")))
        tuned, scratch = None, None
        if mode == "contrastive":  # the encoder tuned on pairs first; its states are this run's alone
            tuned = tune_encoder(net, data, settings)
            for d in data:  # a head that started from the encoder's outputs (classify's label descriptions) again
                if hasattr(d.task.head, "encoder_tuned"):
                    d.task.head.encoder_tuned(encoder)
            scratch = tempfile.TemporaryDirectory(prefix="bertheads-contrastive-")
        frozen = mode in FROZEN_HEAD_MODES
        extra = {"source_model": model, **(extra_manifest or {}), "made_with": made_with(), "chosen": line,
                 **({"contrastive": tuned} if tuned else {}),
                 "settings": made_from(config, model, settings, limit, options)}
        try:
            if frozen:
                for d, t in zip(data, config.tasks):
                    given = options[t.name] if scratch is None else {**options[t.name], "cache_dir": scratch.name}
                    attach_cache(net, [d], given, model, t.train, progress=settings.progress)
            result = fit(net, data, settings, out, evaluate_task, extra, on_epoch, on_step, on_evaluate)
        finally:
            if scratch is not None:
                scratch.cleanup()
        result["chosen"] = line
        if tuned:
            result["contrastive"] = tuned
        return net, result
    finally:  # a run that failed before its loop gives the folder back too
        if out is not None:
            lock.release(out)


def untrained(data: list[TaskData], encoder: Encoder, model: str, out, options: dict, extra: dict,
              settings: TrainSettings) -> tuple[BertHeads, dict]:
    """A run without training rows (each head from its settings, as a kind's `HeadSettings.needs_rows` allows):
    the heads built on the frozen encoder, evaluated on their dev sets where given (which settles
    thresholds and fits temperatures as after an epoch) and saved as epoch 0."""
    for d in data:
        d.task.spec.mode = "features"
        d.task = fresh_head(d.task, encoder)
    line = f"0 training examples: no training, {mode_line('features')}; the heads as their settings make them"
    log.info(line)
    net = BertHeads(encoder, {d.name: d.task for d in data})
    encoder.reference = reference(encoder, model, cache_root(options.get("cache_dir")))
    kept = evaluate_and_save(net, data, settings, 0, {}, Choice(), [], out,
                             partial(evaluate_task, progress=settings.progress), {**extra, "chosen": line})
    return net, {**metrics_file(data, kept, []), "chosen": line}


def continue_heads(saved: BertHeads, data: list[TaskData], source: str) -> None:
    """Training from a saved bertheads model: a head of the same name, kind and labels starts
    from its saved weights; any other head is new (on the saved model's encoder)."""
    for d in data:
        old = saved.tasks.get(d.name)
        if old is None or old.kind != d.task.kind:
            log.info(f"{said('model', source)}: new {d.task.kind} head {d.name!r} on its encoder")
            continue
        # the fields a head's weights depend on must agree for them to be trained further
        differ = [k for k in tagged(type(d.task.spec), "shape") if getattr(old.spec, k, None) != getattr(d.task.spec, k, None)]
        if differ:
            log.info(f"{said('model', source)}: new head {d.name!r} (its {', '.join(differ)} differ from the saved head's)")
            continue
        d.task.head.load_state_dict(old.head.state_dict())
        before, now = old.spec.trained_counts, d.task.spec.trained_counts
        d.task.spec.trained_counts = {k: before.get(k, 0) + now.get(k, 0) for k in {**before, **now}}  # (both runs')
        log.info(f"{said('model', source)}: training head {d.name!r} further")
