"""Training heads on one encoder: the config file that holds a run's settings, and joint
training of its tasks (one task is the single-head case that `bertheads train KIND` runs).

```yaml
tasks:
  sentiment: {kind: classify, train: sst2/train.tsv, dev: sst2/dev.tsv}
  ner: {kind: tag, train: conll2003/train.txt, dev: conll2003/dev.txt, limit: 5000}
sampling: proportional   # or temperature (with temperature: T) or round-robin
epochs: 3                # any training setting: model, lr, seed, batch_size, max_length, mode, ...
```
or, for one head (named after its kind), the task's fields at the top level:
```yaml
kind: classify
train: sst2/train.tsv
dev: sst2/dev.tsv
text_column: sentence
epochs: 2
```
Relative paths resolve against the config file's folder; YAML, or TOML for a `.toml` file.
Per task: `kind`, `train`, `dev`, `limit`, and the options `bertheads train KIND` takes
(max_length, text_column, ...). Head options at the top level apply to every task, as do the
training flags given on the command line; a task's own entry wins. A saved model's
`config.yaml` is such a file: `bertheads train --config DIR/config.yaml` runs it again.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = None
import torch
import yaml

from bertheads.base.errors import UserError, where
from bertheads.base.schema import check_given, convert, names, new_names, suggest, tagged
from bertheads.encoder.layers import parse_layers
from bertheads.encoder.pretrained import Encoder
from bertheads.model import BertHeads
from bertheads.saved import bundle
from bertheads.saved.bundle import HEAD_NAME
from bertheads.store import lock
from bertheads.store.encoder_refs import cache_root, reference
from bertheads.tasks import TASKS
from bertheads.text.readers import read_text
from bertheads.text.rows import Rows
from bertheads.training import checkpoint
from bertheads.training.features import attach_cache
from bertheads.training.flags import FIELDS, convert_options, kind_defaults, own_options, task_class
from bertheads.training.loop import TaskData, TrainSettings, evaluate_task, fit, resolved_settings
from bertheads.training.settings import HeadOptions, RunSettings, spec_name
from bertheads.training.trackers import check_trackers

log = logging.getLogger("bertheads")
TASK_FIELDS = ("kind", "train", "dev", "limit")
# a config's own fields (besides the settings): the tasks, or one task's fields at the top;
# `made_with` (versions, in a saved model's config) is read and ignored
TOP_FIELDS = ("tasks", "kind", "train", "dev", "made_with")
SETTINGS = (RunSettings, TrainSettings, HeadOptions)


@dataclass
class TaskConfig:
    name: str
    kind: str
    train: str
    dev: str | None = None
    limit: int | None = None
    options: dict = field(default_factory=dict)  # the task's own settings from the file


@dataclass
class MultiConfig:
    path: str
    tasks: list[TaskConfig]
    sampling: str = "proportional"
    temperature: float = 2.0
    run: dict = field(default_factory=dict)  # RunSettings fields the file gives (model, limit)
    training: dict = field(default_factory=dict)  # TrainSettings fields the file gives
    options: dict = field(default_factory=dict)  # options for every task (head options, one task's own)
    single: bool = False  # one task named after its kind (`kind:` at the top, or `bertheads train KIND`)


# -- reading the config ----------------------------------------------------------------
def key_lines(node, prefix: tuple = ()) -> dict[tuple, int]:
    """Line number of every mapping key in a composed YAML tree, by its path."""
    lines: dict[tuple, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            path = (*prefix, str(key.value))
            lines[path] = key.start_mark.line + 1
            lines.update(key_lines(value, path))
    return lines


def load_mapping(path: str) -> tuple[object, dict[tuple, int]]:
    """A YAML (or, by its extension, TOML) file's data and the line of each key."""
    text = read_text(path)
    if Path(path).suffix.lower() == ".toml":
        if tomllib is None:
            raise UserError(f"{path}: reading TOML needs Python 3.11 or later; use YAML")
        try:
            return tomllib.loads(text), {}
        except tomllib.TOMLDecodeError as exc:
            raise UserError(f"{path}: malformed TOML ({exc})") from None
    try:
        return yaml.safe_load(text), key_lines(yaml.compose(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UserError(f"{where(path, mark.line + 1 if mark else None)}: malformed YAML ({problem})") from None


def read_config(path: str | Path, kind: str | None = None, files: dict | None = None) -> MultiConfig:
    """Parse and check a config file; errors name the file, line and field. `kind`: the task
    kind of a file that names neither `tasks` nor `kind` (`bertheads train KIND --config F`);
    `files`: `train` and `dev` paths given on the command line, which replace a one-task file's."""
    path = str(path)
    data, lines = load_mapping(path)

    def fail(keys: tuple, message: str):
        line = next((lines[keys[:i]] for i in range(len(keys), 0, -1) if keys[:i] in lines), None)
        raise UserError(f"{where(path, line)}: {'.'.join(k if str(k).isprintable() else repr(k) for k in map(str, keys))}: "
                        f"{message}")

    if not isinstance(data, dict):
        raise UserError(f"{where(path)}: expected a mapping with a 'tasks' field (or 'kind' and 'train')")
    spelled = {str(k).replace("-", "_"): k for k in data}
    data = {str(k).replace("-", "_"): v for k, v in data.items()}
    base = Path(path).resolve().parent
    single = "tasks" not in data
    if not single and ("kind" in data or "train" in data):
        fail(("kind" if "kind" in data else "train",), "a config has 'tasks' or one task's fields at the top "
                                                       "(kind, train, dev), not both")
    if single:
        kind = data.get("kind", kind)
        if kind is None:
            fail(("tasks",), "expected a mapping of head names to task settings, e.g. "
                             "'sentiment: {kind: classify, train: train.tsv}' (or 'kind' and 'train' at the top)")
        if kind not in TASKS:
            fail(("kind",), f"unknown task kind {kind!r} (known: {', '.join(TASKS)})")
        own = set(own_options(kind)) | set(TASK_FIELDS)
    else:
        own = set()
    known = set(TOP_FIELDS) | own | {n for cls in SETTINGS for n in names(cls)}
    data = new_names(data, HeadOptions, path)
    for key in data:
        if key not in known:
            fail((spelled.get(key, key),), f"unknown setting {key!r}{suggest(key, sorted(known))}")

    def value(key: str):
        return convert(FIELDS[key], data[key], lambda msg: fail((spelled.get(key, key),), msg))

    run = {k: value(k) for k in names(RunSettings) if k in data and k != "limit"}
    if "model" in run and run["model"] not in (None, "default") and (base / run["model"]).exists():
        run["model"] = str((base / run["model"]).resolve())
    training = {k: value(k) for k in names(TrainSettings) if k in data}
    options = {k: value(k) for k in names(HeadOptions) if k in data}
    if single:
        entry = {k: v for k, v in data.items() if k in own}
        entry.update({k: str(Path(v).resolve()) for k, v in (files or {}).items() if v})
        task = read_task(kind, {**entry, "kind": kind}, base, lambda keys, msg: fail(keys[2:] or ("train",), msg))
        options.update(task.options)
        task.options = {}
        tasks = [task]
    else:
        tasks = data.get("tasks")
        if not isinstance(tasks, dict) or not tasks:
            fail(("tasks",), "expected a mapping of head names to task settings, e.g. "
                             "'sentiment: {kind: classify, train: train.tsv}'")
        tasks = [read_task(str(name), entry, base, fail) for name, entry in tasks.items()]
        if "limit" in data:  # a limit for every task (a task's own wins)
            limit = value("limit")
            for t in tasks:
                t.limit = t.limit or limit
    defaults = TrainSettings()
    return MultiConfig(path, tasks, training.get("sampling", defaults.sampling),
                       float(training.get("temperature", defaults.temperature)), run, training, options, single)


def read_task(name: str, entry, base: Path, fail) -> TaskConfig:
    keys = ("tasks", name)
    if not HEAD_NAME.match(name):
        fail(keys, "a head name may hold only letters, digits, '_', '.' and '-'")
    if not isinstance(entry, dict):
        fail(keys, "expected a mapping with kind, train (and dev, limit, task options)")
    entry = {str(k).replace("-", "_"): v for k, v in entry.items()}
    kind = entry.get("kind")
    if kind is None:
        fail(keys, f"missing field 'kind' (one of {', '.join(TASKS)})")
    if kind not in TASKS:
        fail((*keys, "kind"), f"unknown task kind {kind!r} (known: {', '.join(TASKS)})")
    paths = {}
    for key in ("train", "dev"):
        value = entry.get(key)
        if value is None:
            if key == "train":
                fail(keys, "missing field 'train' (the training file)")
            continue
        if not isinstance(value, str) or not value.strip():
            fail((*keys, key), f"expected a file path, got {value!r}")
        resolved = (base / Path(value).expanduser()).resolve()
        if not resolved.is_file():
            fail((*keys, key), f"no such file: {resolved}")
        paths[key] = str(resolved)
    limit = entry.get("limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        fail((*keys, "limit"), f"expected a positive integer, got {limit!r}")
    options = convert_options(kind, {k: v for k, v in entry.items() if k not in TASK_FIELDS}, ".".join(keys),
                              fail=lambda key, message: fail((*keys, key), message))
    return TaskConfig(name, kind, paths["train"], paths.get("dev"), limit, options)


def run_settings(config: MultiConfig, settings: TrainSettings | None = None, given: dict | None = None
                 ) -> tuple[TrainSettings, dict, dict]:
    """A config's run resolved: (training settings, run settings, options for every task).
    Each comes from `settings` (or the defaults, with the kind's own defaults for one task),
    then the file, then `given` (keyword arguments or flags given on the command line, which
    may hold any setting's name; unknown names are refused with a suggestion)."""
    kinds = {t.kind for t in config.tasks}
    given = check_given(given or {}, *SETTINGS, own_options(config.tasks[0].kind) if config.single else {})
    if settings is None:
        defaults = TASKS[next(iter(kinds))].training_defaults if len(kinds) == 1 else {}
        settings = TrainSettings(**{k: v for k, v in defaults.items() if k in names(TrainSettings)})
    training = {**config.training, **{k: v for k, v in given.items() if k in names(TrainSettings)}}
    settings = dataclasses.replace(settings, **training)
    run = {**config.run, **{k: v for k, v in given.items() if k in names(RunSettings)}}
    options = {**config.options, **{k: v for k, v in given.items() if k not in names(TrainSettings)
                                    and k not in names(RunSettings)}}
    return settings, run, options


# -- joint training --------------------------------------------------------------------
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
    if spec.mode not in ("finetune", "features"):
        raise UserError(f"--mode: expected finetune or features, got {spec.mode!r}")
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
        raise UserError(f"--max-length {spec.max_length}: the {kind} encoder reads at most {limit} tokens")
    log.warning(f"--max-length: the {kind} encoder reads at most {limit} tokens; using {limit} "
                f"(not the default {spec.max_length})")
    spec.max_length = limit


def prepare_task(kind: str, train_path: str, dev_path: str | None, encoder: Encoder, options: dict,
                 limit: int | None = None, name: str | None = None) -> TaskData:
    """Read and encode one task's training (and dev) data and build its head."""
    cls = task_class(kind)
    spec = make_spec(cls, options, encoder)
    extra = {k: v for k, v in {**options, "limit": limit}.items() if k in cls.prepare_options}
    task, examples = cls.prepare(train_path, spec, encoder, **extra)  # (a task may stop reading at limit)
    if limit:
        examples = examples[:limit]
    features = task.encode(examples, encoder.tokenizer, with_labels=True, path=train_path)
    if not features:
        raise UserError(f"{train_path}: no usable training examples")
    dev = task.read(dev_path, need_labels=True) if dev_path else None
    return TaskData(name or kind, task, features, dev, dev_path)


def train_tasks(config: MultiConfig, out: str | Path | None, model: str = "default",
                settings: TrainSettings | None = None, limit: int | None = None,
                cli_options: dict | None = None, extra_manifest: dict | None = None,
                on_epoch=None) -> tuple[BertHeads, dict]:
    """Train every task of `config` on one shared encoder (batches sampled across tasks by
    `config.sampling`); evaluate each head after every epoch; save the kept epoch to `out`.
    `on_epoch` is passed to `train.fit`. Returns the trained network and what metrics.json holds."""
    settings = settings or TrainSettings()
    settings.sampling, settings.temperature = config.sampling, config.temperature
    if check_trackers(settings) and out is None:  # (an unknown tracker is refused before any data is read)
        raise UserError("--track: a tracked run needs an output directory (--out; out= in Python)")
    if out is not None:
        checkpoint.claim_out(out, settings.resume, settings.overwrite)
    try:
        options = {t.name: task_settings(t, cli_options or {}, config.options) for t in config.tasks}
        modes = {opts.get("mode") or "finetune" for opts in options.values()}
        if len(modes) > 1:
            raise UserError(f"{config.path}: tasks mix --mode finetune and features; train them apart and "
                            f"`bertheads combine` features-mode models, or use one mode")
        torch.manual_seed(settings.seed)
        saved = bundle.load(model) if bundle.is_model(model) else None
        # features mode: the weights load only if some states are not cached yet
        encoder = saved.encoder if saved is not None else Encoder.load(model, lazy=modes == {"features"})
        data = [prepare_task(t.kind, t.train, t.dev, encoder, options[t.name], t.limit or limit, t.name)
                for t in config.tasks]
        if saved is not None:
            continue_heads(saved, data, model)
        net = BertHeads(encoder, {d.name: d.task for d in data})
        if modes == {"features"}:
            # the frozen encoder is the checkpoint as loaded: its hash is remembered, and the
            # model directory refers to it instead of holding a copy
            encoder.reference = reference(encoder, model, cache_root(options[config.tasks[0].name].get("cache_dir")))
            for d, t in zip(data, config.tasks):
                attach_cache(net, [d], options[t.name], model, t.train, progress=settings.progress)
        extra = {"source_model": model, **(extra_manifest or {}), "made_with": made_with(),
                 "settings": made_from(config, model, resolved_settings(settings, modes == {"features"}), limit, options)}
        result = fit(net, data, settings, out, evaluate_task, extra, on_epoch)
        return net, result
    finally:  # a run that failed before its loop gives the folder back too
        if out is not None:
            lock.release(out)


def continue_heads(saved: BertHeads, data: list[TaskData], source: str) -> None:
    """Training from a saved bertheads model: a head of the same name, kind and labels starts
    from its saved weights; any other head is new (on the saved model's encoder)."""
    for d in data:
        old = saved.tasks.get(d.name)
        if old is None or old.kind != d.task.kind:
            log.info(f"--model {source}: new {d.task.kind} head {d.name!r} on its encoder")
            continue
        # the fields a head's weights depend on must agree for them to be trained further
        differ = [k for k in tagged(type(d.task.spec), "shape") if getattr(old.spec, k, None) != getattr(d.task.spec, k, None)]
        if differ:
            log.info(f"--model {source}: new head {d.name!r} (its {', '.join(differ)} differ from the saved head's)")
            continue
        d.task.head.load_state_dict(old.head.state_dict())
        log.info(f"--model {source}: training head {d.name!r} further")


def single_task(kind: str, train: str, dev: str | None, options: dict, limit: int | None = None) -> MultiConfig:
    """The config of a one-task run (`bertheads train KIND`): the head is named after the kind."""
    task_class(kind)
    return MultiConfig("<command line>", [TaskConfig(kind, kind, train, dev, limit, dict(options))], single=True)


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


def multi_task_manifest(config: MultiConfig) -> dict:
    return {"multi_task": {"config": str(Path(config.path).resolve()), "sampling": config.sampling,
                           "temperature": config.temperature}}
