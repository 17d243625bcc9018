"""Joint training of a config's tasks on one encoder (one task is the single-head case that
`bertheads train KIND` runs; the config file itself is read in `training/config.py`): each
task's spec settled and its data prepared, the heads built (or continued from a saved model),
the features cache attached in features mode, the loop run, and what the saved model records
of how it was made."""


from __future__ import annotations

import dataclasses
import logging
import random
import sys
import tempfile
from dataclasses import fields
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = None
import torch

from bertheads.base.errors import UserError
from bertheads.base.schema import new_names, said, tagged
from bertheads.encoder.layers import parse_layers
from bertheads.encoder.pretrained import Encoder
from bertheads.model import BertHeads
from bertheads.saved import bundle
from bertheads.store import lock
from bertheads.store.encoder_refs import cache_root, reference
from bertheads.tasks.recipes import HOLDOUT, Recipe, holdout_size
from bertheads.text.rows import Rows
from bertheads.training import checkpoint
from bertheads.training.config import MultiConfig, TaskConfig
from bertheads.training.contrastive import tune_encoder
from bertheads.training.features import attach_cache
from bertheads.training.flags import kind_defaults, task_class
from bertheads.training.loop import TaskData, TrainSettings, evaluate_task, fit, resolved_settings
from bertheads.training.settings import (
    AUTO,
    FROZEN_HEAD_MODES,
    MODES,
    MOST_PAIRS,
    HeadOptions,
    recipe_of,
    spec_name,
)
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
    return options


def make_spec(cls, options: dict, encoder: Encoder):
    """The task's spec from CLI/API options (keys that are not spec fields are ignored)."""
    names = {f.name for f in fields(cls.spec_type)}
    options = {spec_name(k): v for k, v in options.items()}
    spec = cls.spec_type(**{k: v for k, v in options.items() if k in names and v is not None})
    if isinstance(spec.layers, str) or spec.layers is None:
        spec.layers = list(parse_layers(spec.layers, encoder.info.num_layers))
    if spec.mode == AUTO:  # a run whose data is not read yet (`settle_recipe` decides): fine-tuning for now
        spec.mode = "finetune"
    if spec.mode not in MODES:
        raise UserError(f"{said('mode')}: expected {', '.join(MODES)}, got {spec.mode!r}")
    fit_max_length(spec, encoder, given=options.get("max_length") != kind_defaults(cls.kind).get("max_length"))
    return spec


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


def read_task(kind: str, train_path: str, encoder: Encoder, options: dict, limit: int | None = None):
    """One task's spec settled from its options and training data, its fresh head built; the
    task and its training examples (the first `limit`)."""
    cls = task_class(kind)
    spec = make_spec(cls, options, encoder)
    extra = {k: v for k, v in {**options, "limit": limit}.items() if k in cls.parts.modeling.prepare_options}
    task, examples = cls.prepare(train_path, spec, encoder, **extra)  # (a task may stop reading at limit)
    if limit:
        examples = examples[:limit]
    return task, examples


def prepare_task(kind: str, train_path: str, dev_path: str | None, encoder: Encoder, options: dict,
                 limit: int | None = None, name: str | None = None, holdout: float = 0.0,
                 seed: int = 0) -> TaskData:
    """Read and encode one task's training (and dev) data and build its head. Without a dev
    file, `holdout` (a share) of the training examples, drawn with `seed`, is the dev set."""
    task, examples = read_task(kind, train_path, encoder, options, limit)
    given, dev = len(examples), None
    if dev_path is None and (count := holdout_size(len(examples), holdout)):
        order = list(range(len(examples)))
        random.Random(seed).shuffle(order)
        held = set(order[:count])
        dev = [e for i, e in enumerate(examples) if i in held]
        examples = [e for i, e in enumerate(examples) if i not in held]
    features = task.modeling.encode(examples, encoder.tokenizer, with_labels=True, path=train_path)
    if not features:
        raise UserError(f"{train_path}: no usable training examples")
    task.spec.trained_counts = task.scoring.class_counts(examples)  # (saved with the head, read by `select`)
    if dev_path:
        dev = task.reading.read(dev_path, need_labels=True)
    return TaskData(name or kind, task, features, dev, dev_path, examples=given, held_out=len(dev or ()) * (not dev_path))


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
        holdout = settings.holdout if settings.holdout is not None else (0.0 if how == "fixed" else HOLDOUT)
        torch.manual_seed(settings.seed)
        saved = bundle.load(model) if bundle.is_model(model) else None
        # features mode (or a mode still to be decided): the weights load only if needed
        encoder = saved.encoder if saved is not None else Encoder.load(model, lazy="finetune" not in given_modes)

        def prepared(t):
            return prepare_task(t.kind, t.train, t.dev, encoder, options[t.name], t.limit or limit, t.name,
                                holdout, settings.seed)

        for name in auto:  # fine-tuning until the data's size says otherwise
            options[name]["mode"] = next(iter(given_modes), "finetune")
        data = [prepared(t) for t in config.tasks]
        recipe = recipe_of_data(data, how)
        if auto and not given_modes and saved is None and recipe.mode != "finetune":
            for name in auto:
                options[name]["mode"] = recipe.mode
            torch.manual_seed(settings.seed)  # the heads start as they would with the mode given
            data = [prepared(t) for t in config.tasks]
        modes = {d.task.spec.mode for d in data}
        if modes != {"features"}:
            encoder.model  # noqa: B018  (a lazy encoder's weights load now: they are trained)
        settings, line = settle_recipe(settings, recipe, data, how, auto)
        if saved is not None:
            continue_heads(saved, data, model)
        net = BertHeads(encoder, {d.name: d.task for d in data})
        if modes == {"features"}:
            # the frozen encoder is the checkpoint as loaded: its hash is remembered, and the
            # model directory refers to it instead of holding a copy
            encoder.reference = reference(encoder, model, cache_root(options[config.tasks[0].name].get("cache_dir")))
        tuned, scratch = None, None
        if modes == {"contrastive"}:  # the encoder tuned on pairs first; its states are this run's alone
            tuned = tune_encoder(net, data, settings)
            scratch = tempfile.TemporaryDirectory(prefix="bertheads-contrastive-")
        frozen = len(modes) == 1 and next(iter(modes)) in FROZEN_HEAD_MODES
        extra = {"source_model": model, **(extra_manifest or {}), "made_with": made_with(), "chosen": line,
                 **({"contrastive": tuned} if tuned else {}),
                 "settings": made_from(config, model, resolved_settings(settings, frozen), limit, options)}
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


# -- the recipe for the data's size ------------------------------------------------------
def mode_line(mode: str) -> str:
    """How the recipe's line names a mode."""
    if mode == "features":
        return f"{said('mode', 'features')} (the head alone, on the frozen encoder's states)"
    if mode == "contrastive":
        return (f"{said('mode', 'contrastive')} (the encoder tuned on pairs of training texts, SetFit's recipe; "
                "then the head alone on it)")
    return "fine-tuning"


def recipe_of_data(data: list[TaskData], how: str) -> Recipe:
    """The recipe of the run's largest task (its batches are most of the steps), from its kind's
    table; its mode only when every task's own recipe (its kind's table, its own size) has that
    mode too, else fine-tuning, which every kind's fixed recipe uses (a tagger on a classifier's
    small-data features mode would learn next to nothing)."""
    own = [d.task.modeling.recipe(d.examples, how) for d in data]
    largest = own[max(range(len(data)), key=lambda i: data[i].examples)]
    return largest if len({r.mode for r in own}) == 1 else dataclasses.replace(largest, mode="finetune")


def recipe_pairs(recipe: Recipe, mode: str, examples: int) -> int | None:
    """The pairs a contrastive run tunes the encoder on when the recipe gives a count per
    example (never fewer than the default's most); None: the default count."""
    if mode != "contrastive" or not recipe.pairs_each:
        return None
    return max(MOST_PAIRS, recipe.pairs_each * examples)


def settle_recipe(settings: TrainSettings, recipe: Recipe, data: list[TaskData], how: str,
                  auto_mode: list[str]) -> tuple[TrainSettings, str]:
    """The run's settings with what was left to the recipe filled in (what was given stays), and
    the one line that says what was chosen: `200 examples: --mode features, batch 8, up to 38
    epochs, keeping the best on dev`."""
    batch = settings.batch_size or recipe.batch_size
    features = sum(len(d.train_features) for d in data)
    epochs = settings.epochs or recipe.epochs_for(features, batch * settings.grad_accum)
    examples = sum(d.examples for d in data)
    mode = data[0].task.spec.mode
    pairs = settings.pairs or recipe_pairs(recipe, mode, examples)
    settled = dataclasses.replace(settings, batch_size=batch, epochs=epochs, recipe=how, pairs=pairs,
                                  holdout=settings.holdout if settings.holdout is not None else
                                  (0.0 if how == "fixed" else HOLDOUT))
    parts = [mode_line(mode) + ("" if auto_mode else " (given)"),
             *([f"{pairs:,} pairs ({recipe.pairs_each} an example)"] if pairs and not settings.pairs else []),
             f"batch {batch}" + ("" if settings.batch_size is None else " (given)")]
    held = sum(d.held_out for d in data)
    given = "" if settings.epochs is None else " (given)"

    def count(n: int) -> str:
        return f"{n} epoch{'' if n == 1 else 's'}"

    dev = any(d.dev_path for d in data)
    if settings.keep == "last":
        parts.append(f"{count(epochs)}{given}, keeping the last ({said('keep')} last)")
    elif dev or held:
        where = "dev" if dev else f"{held} held-out training examples (no {said('dev')}; {said('holdout')} 0 for none)"
        parts.append(f"{'' if epochs == 1 else 'up to '}{count(epochs)}{given}, keeping the best on {where}")
    else:
        why = (f"{said('holdout')} 0" if settings.holdout == 0 else "none held out with a fixed recipe"
               if how == "fixed" else "too few examples to hold some out")
        parts.append(f"{count(epochs)}{given}, keeping the last (no {said('dev')}; {why})")
    fixed = f" ({said('recipe')} fixed)" if how == "fixed" else ""
    return settled, f"{examples} training examples{fixed}: {', '.join(parts)}"


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


# -- what a saved model says about how it was made ----------------------------------------
def made_with() -> dict:
    """The versions of bertheads, Python, torch and transformers."""
    import transformers

    version = getattr(sys.modules.get("bertheads"), "__version__", "unknown")
    return plain({"bertheads": version, "python": sys.version.split()[0], "torch": torch.__version__,
                  "transformers": transformers.__version__})


def plain(value):
    """A value as YAML writes it safely (tuples as lists, paths as text)."""
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, str):
        return str(value)  # a str subclass (torch's version) as plain text
    if value is None or isinstance(value, (int, float, bool)):
        return value
    return str(value)


def made_from(config: MultiConfig, model: str, settings: TrainSettings, limit: int | None,
              options: dict[str, dict]) -> dict:
    """A run's full settings as a config file holds them (what `read_config` reads back): the
    start model, every training setting but those that only steer the run, and each task's
    kind, data and options (one task at the top level, several under `tasks`)."""
    source = str(Path(model).resolve()) if model not in (None, "", "default") and Path(model).exists() else model
    left_out = set(tagged(TrainSettings, "not-recorded"))
    training = {k: v for k, v in dataclasses.asdict(settings).items() if k not in left_out}
    tasks = {}
    for t in config.tasks:
        entry = {"kind": t.kind, "train": data_name(t.train), **({"dev": data_name(t.dev)} if t.dev else {}),
                 **({"limit": t.limit or limit} if (t.limit or limit) else {}),
                 **{k: v for k, v in options[t.name].items() if v is not None}}
        tasks[t.name] = plain(entry)
    record = {"model": source, **plain(training)}
    if config.single and len(tasks) == 1:
        return {**next(iter(tasks.values())), **record}
    return {"tasks": tasks, **record}


def data_name(data) -> str:
    """A task's data as a config records it: a path, or a description of rows given in memory."""
    return data.description() if isinstance(data, Rows) else str(data)


