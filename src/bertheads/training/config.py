"""The config file that holds a run's settings: its tasks and settings read and checked (errors
name the file, line and field), and resolved over the defaults and what was given.

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
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = None
from bertheads.base.bounded import MAX_CONFIG_BYTES, MAX_DEPTH, read_yaml, too_deep
from bertheads.base.errors import UserError, where
from bertheads.base.schema import check_given, convert, names
from bertheads.saved.bundle import HEAD_NAME
from bertheads.tasks import TASKS
from bertheads.text.readers import read_text
from bertheads.training.flags import FIELDS, convert_options, own_options, task_class
from bertheads.training.loop import TrainSettings
from bertheads.training.settings import HeadOptions, RunSettings

log = logging.getLogger("bertheads")
TASK_FIELDS = ("kind", "train", "dev", "limit")
# a config's own fields (besides the settings): the tasks, or one task's fields at the top;
# `made_with` (versions) and `chosen` (what the recipe chose), in a saved model's config, are read and ignored
TOP_FIELDS = ("tasks", "kind", "train", "dev", "made_with", "chosen")
SETTINGS = (RunSettings, TrainSettings, HeadOptions)


@dataclass
class TaskConfig:
    name: str
    kind: str
    train: str | None  # None: a head from its settings alone (`HeadSettings.needs_rows`)
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


def load_mapping(path: str) -> tuple[object, dict[tuple, int]]:
    """A YAML (or, by its extension, TOML) file's data and the line of each key, read within
    `base/bounded.py`'s bounds (aliases, their expansion, depth, size)."""
    text = read_text(path)
    if Path(path).suffix.lower() == ".toml":
        if tomllib is None:
            raise UserError(f"{path}: reading TOML needs Python 3.11 or later; use YAML")
        if len(text) > MAX_CONFIG_BYTES:
            raise UserError(f"{path}: {len(text):,} characters, more than the {MAX_CONFIG_BYTES:,} a config file may "
                            f"hold")
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise UserError(f"{path}: malformed TOML ({exc})") from None
        except RecursionError:
            data = None
        if data is None or too_deep(data):
            raise UserError(f"{path}: refused: nested deeper than {MAX_DEPTH} levels")
        return data, {}
    return read_yaml(text, path)


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
        own = {**own_options(kind), **dict.fromkeys(TASK_FIELDS)}
    else:
        own = {}
    data = check_given(data, *SETTINGS, own, dict.fromkeys(TOP_FIELDS), at=path,
                       fail=lambda key, message: fail((spelled.get(key, key),), message))

    def value(key: str):
        return convert(FIELDS[key], data[key], lambda msg: fail((spelled.get(key, key),), msg))

    run = {k: value(k) for k in names(RunSettings) if k in data and k != "limit"}
    for key in ("model", "into"):  # (paths relative to the file)
        if run.get(key) not in (None, "default") and (base / run[key]).exists():
            run[key] = str((base / run[key]).resolve())
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
            if key == "train" and TASKS[kind].spec_type.needs_rows(entry):
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
    return TaskConfig(name, kind, paths.get("train"), paths.get("dev"), limit, options)


def run_settings(config: MultiConfig, settings: TrainSettings | None = None, given: dict | None = None
                 ) -> tuple[TrainSettings, dict, dict]:
    """A config's run resolved: (training settings, run settings, options for every task).
    Each comes from `settings` (or the defaults, with the kind's own defaults for one task),
    then the file, then `given` (keyword arguments or flags given on the command line, which
    may hold any setting's name; unknown names are refused with a suggestion)."""
    kinds = {t.kind for t in config.tasks}
    given = check_given(given or {}, *SETTINGS, own_options(config.tasks[0].kind) if config.single else {})
    if settings is None:
        defaults = TASKS[next(iter(kinds))].parts.modeling.training_defaults if len(kinds) == 1 else {}
        settings = TrainSettings(**{k: v for k, v in defaults.items() if k in names(TrainSettings)})
    training = {**config.training, **{k: v for k, v in given.items() if k in names(TrainSettings)}}
    settings = dataclasses.replace(settings, **training)
    run = {**config.run, **{k: v for k, v in given.items() if k in names(RunSettings)}}
    options = {**config.options, **{k: v for k, v in given.items() if k not in names(TrainSettings)
                                    and k not in names(RunSettings)}}
    return settings, run, options


def single_task(kind: str, train: str, dev: str | None, options: dict, limit: int | None = None) -> MultiConfig:
    """The config of a one-task run (`bertheads train KIND`): the head is named after the kind."""
    task_class(kind)
    return MultiConfig("<command line>", [TaskConfig(kind, kind, train, dev, limit, dict(options))], single=True)


def multi_task_manifest(config: MultiConfig) -> dict:
    return {"multi_task": {"config": str(Path(config.path).resolve()), "sampling": config.sampling,
                           "temperature": config.temperature}}
