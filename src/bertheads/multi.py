"""Several heads on one encoder: joint training from a config file, combining separately
trained models, and `analyze` (every head on a text, one encoder pass).

```yaml
tasks:
  sentiment: {kind: classify, train: sst2/train.tsv, dev: sst2/dev.tsv}
  ner: {kind: tag, train: conll2003/train.txt, dev: conll2003/dev.txt, limit: 5000}
sampling: proportional   # or temperature (with temperature: T) or round-robin
```
Relative paths resolve against the config file's folder. Per task: `kind`, `train`, `dev`,
`limit`, and the options `bertheads train KIND` takes (max_length, text_column, ...). The
training flags given on the command line apply to every task; a task's own entry wins.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bertheads import bundle
from bertheads.errors import UserError, where
from bertheads.packing import INFERENCE_BATCH
from bertheads.readers import read_text

TOP_FIELDS = ("tasks", "sampling", "temperature")
TASK_FIELDS = ("kind", "train", "dev", "limit")
HEAD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# training flags that are head settings: on the command line they apply to every task
HEAD_FLAGS = ("max_length", "mode", "layers", "combine", "cache_dir", "cache_dtype", "cache_max_gb")


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


# -- reading the config ----------------------------------------------------------------
def kind_parser(kind: str) -> argparse.ArgumentParser:
    """The flags of `bertheads train KIND` (their defaults are the kind's defaults)."""
    from bertheads.cli import add_training_flags

    cls = bundle.task_class(kind)
    parser = argparse.ArgumentParser(add_help=False)
    cls.add_arguments(parser)
    add_training_flags(parser, **cls.training_defaults)
    return parser


def kind_options(kind: str) -> dict[str, argparse.Action]:
    """Per-task option name -> its argparse action (type, choices) for a task kind."""
    actions = {a.dest: a for a in kind_parser(kind)._actions if a.dest != "help"}
    generic = {a.dest for a in kind_parser_generic()._actions}
    return {dest: a for dest, a in actions.items() if dest not in generic or dest in HEAD_FLAGS}


def kind_parser_generic() -> argparse.ArgumentParser:
    from bertheads.cli import add_training_flags

    parser = argparse.ArgumentParser(add_help=False)
    add_training_flags(parser)
    return parser


def key_lines(node, prefix: tuple = ()) -> dict[tuple, int]:
    """Line number of every mapping key in a composed YAML tree, by its path."""
    import yaml

    lines: dict[tuple, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            path = (*prefix, str(key.value))
            lines[path] = key.start_mark.line + 1
            lines.update(key_lines(value, path))
    return lines


def read_config(path: str | Path) -> MultiConfig:
    """Parse and check a multi-task config; errors name the file, line and field."""
    import yaml

    path = str(path)
    text = read_text(path)
    lines: dict[tuple, int] = {}
    if Path(path).suffix.lower() == ".toml":
        try:
            import tomllib
        except ImportError:  # Python 3.10
            raise UserError(f"{path}: reading TOML needs Python 3.11 or later; use YAML") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise UserError(f"{path}: malformed TOML ({exc})") from None
    else:
        try:
            lines = key_lines(yaml.compose(text, Loader=yaml.SafeLoader))
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise UserError(f"{where(path, mark.line + 1 if mark else None)}: malformed YAML ({problem})") from None

    def fail(keys: tuple, message: str):
        line = next((lines[keys[:i]] for i in range(len(keys), 0, -1) if keys[:i] in lines), None)
        raise UserError(f"{where(path, line)}: {'.'.join(map(str, keys))}: {message}")

    if not isinstance(data, dict):
        raise UserError(f"{where(path)}: expected a mapping with a 'tasks' field")
    for key in data:
        if key not in TOP_FIELDS:
            fail((key,), f"unknown field (known: {', '.join(TOP_FIELDS)})")
    tasks = data.get("tasks")
    if not isinstance(tasks, dict) or not tasks:
        fail(("tasks",), "expected a mapping of head names to task settings, e.g. "
                         "'sentiment: {kind: classify, train: train.tsv}'")
    sampling = data.get("sampling", "proportional")
    from bertheads.train import SAMPLINGS

    if sampling not in SAMPLINGS:
        fail(("sampling",), f"expected one of {', '.join(SAMPLINGS)}, got {sampling!r}")
    temperature = data.get("temperature", 2.0)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature <= 0:
        fail(("temperature",), f"expected a positive number, got {temperature!r}")
    base = Path(path).resolve().parent
    out = [read_task(str(name), entry, base, fail) for name, entry in tasks.items()]
    return MultiConfig(path, out, sampling, float(temperature))


def read_task(name: str, entry, base: Path, fail) -> TaskConfig:
    keys = ("tasks", name)
    if not HEAD_NAME.match(name):
        fail(keys, "a head name may hold only letters, digits, '_', '.' and '-'")
    if not isinstance(entry, dict):
        fail(keys, "expected a mapping with kind, train (and dev, limit, task options)")
    entry = {str(k).replace("-", "_"): v for k, v in entry.items()}
    kind = entry.get("kind")
    from bertheads.tasks import TASKS

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
    allowed = kind_options(kind)
    options = {}
    for key, value in entry.items():
        if key in TASK_FIELDS:
            continue
        action = allowed.get(key)
        if action is None:
            known = sorted(set(TASK_FIELDS) | set(allowed))
            fail((*keys, key), f"unknown field for a {kind} task (known: {', '.join(known)})")
        options[key] = option_value(action, value, lambda msg, k=key: fail((*keys, k), msg))
    return TaskConfig(name, kind, paths["train"], paths.get("dev"), limit, options)


def option_value(action: argparse.Action, value, fail):
    """A config value checked and converted like the command-line flag it stands for."""
    if value is None:
        return None
    if action.dest == "layers" and isinstance(value, (list, int)) and not isinstance(value, bool):
        value = ",".join(str(v) for v in value) if isinstance(value, list) else str(value)
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if not isinstance(value, bool):
            fail(f"expected true or false, got {value!r}")
        return value
    if isinstance(value, (dict, list)) or (isinstance(value, bool) and action.type is not None):
        fail(f"expected a single value, got {value!r}")
    convert = action.type or str
    try:
        value = convert(value)
    except (TypeError, ValueError, argparse.ArgumentTypeError):
        fail(f"expected {getattr(convert, '__name__', 'a value')}, got {value!r}")
    if action.choices is not None and value not in action.choices:
        fail(f"expected one of {', '.join(map(str, action.choices))}, got {value!r}")
    return value


# -- joint training --------------------------------------------------------------------
def task_settings(task: TaskConfig, cli_options: dict) -> dict:
    """A task's options: its kind's defaults, then the command line's, then its own."""
    defaults = {k: v for k, v in vars(kind_parser(task.kind).parse_args([])).items() if k in kind_options(task.kind)}
    defaults.update({k: v for k, v in cli_options.items() if v is not None})
    defaults.update({k: v for k, v in task.options.items() if v is not None})
    return defaults


def train_multi(config: MultiConfig | str | Path, out: str | Path | None, model: str = "default",
                settings=None, limit: int | None = None, **cli_options):
    """Train every task of `config` on one shared encoder (batches sampled across tasks by
    `config.sampling`); evaluate each head after every epoch; save the best epoch to `out`."""
    from bertheads.api import Model, evaluate_task, load, prepare_task
    from bertheads.encoder import Encoder
    from bertheads.model import BertHeads
    from bertheads.train import TrainSettings, fit

    if not isinstance(config, MultiConfig):
        config = read_config(config)
    settings = settings or TrainSettings()
    settings.sampling, settings.temperature = config.sampling, config.temperature
    if out is not None:
        bundle.check_writable_out(out)
    options = {t.name: task_settings(t, cli_options) for t in config.tasks}
    modes = {opts.get("mode") or "finetune" for opts in options.values()}
    if len(modes) > 1:
        raise UserError(f"{config.path}: tasks mix --mode finetune and features; train them apart and "
                        f"`bertheads combine` features-mode models, or use one mode")
    torch.manual_seed(settings.seed)
    encoder = Encoder.load(model)
    data = [prepare_task(t.kind, t.train, t.dev, encoder, options[t.name], t.limit or limit, t.name)
            for t in config.tasks]
    net = BertHeads(encoder, {d.name: d.task for d in data})
    if modes == {"features"}:
        from bertheads.features import attach_cache

        for d, t in zip(data, config.tasks):
            attach_cache(net, [d], options[t.name], model, t.train, progress=settings.progress)
    extra = {"source_model": model, "multi_task": {"config": str(Path(config.path).resolve()),
                                                   "sampling": config.sampling,
                                                   "temperature": config.temperature}}
    result = fit(net, data, settings, out, evaluate_task, extra)
    if out is not None:
        return load(out)
    net.metrics = result
    return Model(net)


# -- combining separately trained models ------------------------------------------------
def combine(directories: list[str | Path], out: str | Path, names: list[str] | None = None):
    """One model holding the heads of several models whose encoders are identical."""
    from bertheads.api import load
    from bertheads.model import BertHeads

    if len(directories) < 2:
        raise UserError("combine: give at least two model directories")
    manifests = [bundle.read_manifest(d) for d in directories]
    hashes = []
    for directory, manifest in zip(directories, manifests):
        digest = manifest.get("encoder_hash")
        if not digest:  # older manifests: hash the weights themselves
            digest = bundle.encoder_hash(bundle.load(directory).encoder)
        hashes.append(digest)
    for directory, digest in zip(directories[1:], hashes[1:]):
        if digest != hashes[0]:
            raise UserError(
                f"{directory}: its encoder differs from {directories[0]}'s (encoder_hash {digest[:12]}... vs "
                f"{hashes[0][:12]}...); only models sharing one encoder can be combined: heads trained with "
                f"--mode features on the same checkpoint, or a model trained jointly with `train multi`")
    heads = [(str(d), name) for d, m in zip(directories, manifests) for name in m["heads"]]
    if names is not None:
        if len(names) != len(heads):
            raise UserError(f"--names: expected {len(heads)} names, one per head in order "
                            f"({', '.join(f'{d}:{n}' for d, n in heads)}), got {len(names)}")
        for name in names:
            if not HEAD_NAME.match(name):
                raise UserError(f"--names: {name!r} is not a valid head name (letters, digits, '_', '.', '-')")
    new_names = names or [n for _, n in heads]
    seen: dict[str, str] = {}
    for (directory, _), name in zip(heads, new_names):
        if name in seen:
            raise UserError(f"head name {name!r} is in both {seen[name]} and {directory}; rename heads with "
                            f"--names (one per head, in order: {', '.join(f'{d}:{n}' for d, n in heads)})")
        seen[name] = directory
    models = [load(d) for d in directories]
    tasks, metrics, renamed = {}, {}, iter(new_names)
    for model in models:
        dev = read_dev_metrics(model.directory, list(model.net.tasks))
        for name, task in model.net.tasks.items():
            new = next(renamed)
            tasks[new] = task
            if name in dev:
                metrics[new] = dev[name]
    net = BertHeads(models[0].net.encoder, tasks)
    sources = {new: {"from": str(d), "head": n} for new, (d, n) in zip(new_names, heads)}
    extra = {"source_model": manifests[0].get("source_model"), "combined_from": sources}
    bundle.save(net, out, {"dev": metrics} if metrics else None, extra)
    return load(out)


def read_dev_metrics(directory: Path, names: list[str]) -> dict:
    """A saved model's dev metrics per head ({} when it has none)."""
    path = Path(directory) / "metrics.json"
    try:
        dev = json.loads(path.read_text()).get("dev") or {}
    except (OSError, json.JSONDecodeError, AttributeError):
        return {}
    if len(names) == 1 and not (set(dev) == {names[0]} and isinstance(dev.get(names[0]), dict)):
        return {names[0]: dev}
    return {n: dev[n] for n in names if isinstance(dev.get(n), dict)}


# -- one pass over several heads ---------------------------------------------------------
def head_input(task) -> str:
    """What a head reads: 'text', 'pair' (two texts) or 'question' (a question and a passage)."""
    if task.kind == "qa":
        return "question"
    if getattr(task.spec, "pair", False):
        return "pair"
    return "text"


def analyze(model, texts: list[str], second_texts: list[str] | None = None, questions: list[str] | None = None,
            batch_size: int = INFERENCE_BATCH, **options) -> list[dict]:
    """`{head: prediction}` per text for every head that reads a single text; pair heads
    when `second_texts` are given, qa heads (the text as the passage) when `questions` are.

    Heads whose encoded inputs are identical (the same token ids, windows and segments)
    share one encoder pass; the rest get a pass of their own.
    """
    from bertheads.model import run_heads

    texts = list(texts)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise UserError(f"text {i}: expected a string, got {type(text).__name__}")
    for label, extra in (("second_texts", second_texts), ("questions", questions)):
        if extra is not None and len(extra) != len(texts):
            raise UserError(f"{label}: expected one per text ({len(texts)}), got {len(extra)}")
    net = model.net
    tokenizer = net.encoder.tokenizer
    jobs = []
    for name, task in net.tasks.items():
        form = head_input(task)
        if form == "pair":
            if second_texts is None:
                continue
            inputs = [(t, s) for t, s in zip(texts, second_texts)]
        elif form == "question":
            if questions is None:
                continue
            inputs = [{"question": q, "context": t} for t, q in zip(texts, questions)]
        else:
            inputs = texts
        examples = task.from_inputs(inputs, **options)
        features, owner = task.encode_for_inference(examples, tokenizer)
        key = (tuple(owner), tuple(tuple(f["input_ids"]) for f in features),
               tuple(tuple(f.get("token_type_ids") or ()) for f in features))
        jobs.append((name, task, examples, features, owner, key))
    groups: dict[tuple, list] = {}
    for job in jobs:
        groups.setdefault(job[-1], []).append(job)
    results: list[dict] = [{} for _ in texts]
    outputs: dict[str, list] = {}
    for group in groups.values():
        features = group[0][3]
        outputs.update(run_heads(net, features, [job[0] for job in group], batch_size) if features else
                       {job[0]: [] for job in group})
    for name, task, examples, features, owner, _ in jobs:
        collected = task.collect(outputs[name], owner, examples, features)
        for i, prediction in enumerate(task.decode(collected, examples, **options)):
            results[i][name] = prediction
    return results


# -- command line ------------------------------------------------------------------------
def add_parsers(sub, kinds, add_training_flags) -> dict:
    """`train multi`, `combine` and `serve`; returns {command: handler} for the new commands."""
    p = kinds.add_parser("multi", help="train several heads on one encoder from a YAML config")
    p.add_argument("--config", required=True, help="YAML (or TOML) naming the tasks; see the README")
    p.add_argument("--out", required=True)
    p.add_argument("--sampling", choices=("proportional", "temperature", "round-robin"),
                   help="override the config's sampling rule")
    p.add_argument("--temperature", type=float, help="override the config's sampling temperature")
    add_training_flags(p)
    # head flags given on the command line apply to every task; unset ones leave each kind's default
    p.set_defaults(**{flag: None for flag in HEAD_FLAGS}, run=cmd_train_multi)

    c = sub.add_parser("combine", help="one model from several that share an identical encoder")
    c.add_argument("model_dirs", nargs="+")
    c.add_argument("--out", required=True)
    c.add_argument("--names", nargs="+", help="new head names, one per head in input order")

    s = sub.add_parser("serve", help="HTTP server (FastAPI) and web page for a saved model")
    s.add_argument("model_dir")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--max-batch", type=int, default=64, help="most texts run together in one model call")
    s.add_argument("--batch-window-ms", type=float, default=5.0, help="how long to gather concurrent requests")
    s.add_argument("--max-texts", type=int, default=64, help="most texts in one request")
    s.add_argument("--max-text-chars", type=int, default=10000, help="longest text accepted, in characters")
    return {"combine": cmd_combine, "serve": cmd_serve}


def cmd_train_multi(args) -> int:
    from bertheads.cli import settings_from

    config = read_config(args.config)
    if args.sampling:
        config.sampling = args.sampling
    if args.temperature is not None:
        if args.temperature <= 0:
            raise UserError(f"--temperature: expected a positive number, got {args.temperature}")
        config.temperature = args.temperature
    cli_options = {flag: getattr(args, flag) for flag in HEAD_FLAGS}
    model = train_multi(config, args.out, model=args.model, settings=settings_from(args), limit=args.limit,
                        **cli_options)
    print(f"saved {args.out} (heads: {', '.join(model.heads)})")
    dev = json.loads((model.directory / "metrics.json").read_text()).get("dev")
    if dev:
        print(json.dumps({"dev": dev}))
    return 0


def cmd_combine(args) -> int:
    model = combine(args.model_dirs, args.out, args.names)
    print(f"saved {args.out} (heads: {', '.join(f'{n} ({k})' for n, k in model.heads.items())})")
    return 0


def cmd_serve(args) -> int:
    from bertheads.serve import ServeSettings, serve

    settings = ServeSettings(max_batch=args.max_batch, window_ms=args.batch_window_ms, max_texts=args.max_texts,
                             max_text_chars=args.max_text_chars)
    serve(args.model_dir, args.host, args.port, settings, runtime=args.runtime, precision=args.precision)
    return 0
