"""The training flags, defined once: `bertheads train KIND` and `train multi` build their parsers
from here, and a multi-task config's per-task fields are checked against the same definitions."""

from __future__ import annotations

import argparse
import re

from bertheads.base.errors import UserError
from bertheads.base.values import fraction, non_negative_float, positive_float, positive_int
from bertheads.encoder.layers import COMBINES
from bertheads.tasks import TASKS
from bertheads.text.batching import INFERENCE_BATCH
from bertheads.training.loop import FEATURES_LR, FINETUNE_LR, KEEP_CHOICES, TrainSettings

# training flags that are head settings: on the command line they apply to every task
HEAD_FLAGS = ("max_length", "mode", "layers", "combine", "cache_dir", "cache_dtype", "cache_max_gb")
# flags that are training settings (TrainSettings) or the run's own, not a task's
RUN_FLAGS = ("command", "kind", "train", "dev", "out", "model", "epochs", "batch_size", "lr", "seed", "limit",
             "warmup_ratio", "weight_decay", "eval_batch_size", "no_progress", "keep", "select_metric",
             "verbose", "quiet", "grad_accum", "eval_every", "patience", "save_every", "resume", "overwrite",
             "log_every", "tensorboard")


class ShowDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """`(default: X)` after each flag's help, except where there is no default to show."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False) or "default" in (action.help or ""):
            return action.help or ""
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """argparse with defaults in `--help` and one-line errors (`bertheads: error: ...`, exit 2)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", ShowDefaults)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"bertheads: error: {message} (see {self.prog} --help)\n")


def accept_layer_lists(parser: argparse.ArgumentParser) -> None:
    """Let `--layers -1,-2,-3,-4` parse: argparse reads only plain negative numbers as values."""
    parser._negative_number_matcher = re.compile(r"^-\d+$|^-\d*\.\d+$|^-\d+(,\s*-?\d+)+$")


def add_training_flags(p: argparse.ArgumentParser, *, max_length: int = 128, batch_size: int = 32) -> None:
    """The flags every `bertheads train` command takes (defaults may differ by task kind)."""
    d = TrainSettings()
    g = p.add_argument_group("training")
    g.add_argument("--model", default="default",
                   help="'default' (the embedded MiniLM-L6), a checkpoint directory, a hub name, or a bertheads "
                        "model (its head of the same kind and labels trains further; other heads are new)")
    g.add_argument("--epochs", type=positive_int, default=d.epochs, help="passes over the training data")
    g.add_argument("--batch-size", type=positive_int, default=batch_size, help="training examples per step")
    # no default here (so --help shows both): the mode decides it, in train.resolved_settings
    g.add_argument("--lr", type=positive_float, default=argparse.SUPPRESS,
                   help=f"peak learning rate (AdamW, linear decay); default {FINETUNE_LR:g} when fine-tuning, "
                        f"{FEATURES_LR:g} with --mode features (only the head learns)")
    g.add_argument("--max-length", type=positive_int, default=max_length,
                   help="tokens per input (pairs are cut longest-first)")
    g.add_argument("--seed", type=int, default=d.seed, help="random seed (head initialisation, batch order)")
    g.add_argument("--limit", type=positive_int, default=None, help="use only the first N training examples")
    g.add_argument("--warmup-ratio", type=fraction, default=d.warmup_ratio,
                   help="share of the steps over which the learning rate rises from 0")
    g.add_argument("--weight-decay", type=non_negative_float, default=d.weight_decay,
                   help="AdamW weight decay (not on biases and LayerNorm)")
    g.add_argument("--eval-batch-size", type=positive_int, default=INFERENCE_BATCH,
                   help="inputs per batch when evaluating on --dev")
    g.add_argument("--keep", choices=KEEP_CHOICES, default=d.keep,
                   help="which model is saved: the best dev evaluation (by --select-metric; an equal score with "
                        "a lower dev loss wins) or the last epoch's")
    g.add_argument("--select-metric", default=None,
                   help="dev metric that chooses the best evaluation (default: the task's main one: accuracy, "
                        "f1, pearson, ...)")
    g.add_argument("--grad-accum", type=positive_int, default=d.grad_accum,
                   help="add the gradients of N batches before each step (a step sees N * --batch-size examples)")
    g.add_argument("--eval-every", type=positive_int, default=None,
                   help="also evaluate on --dev every N steps (default: after each epoch only)")
    g.add_argument("--patience", type=positive_int, default=None,
                   help="stop after N evaluations without improvement (needs --dev)")
    g.add_argument("--no-progress", action="store_true", help="no progress bars")
    r = p.add_argument_group("checkpoints and logs")
    r.add_argument("--save-every", type=positive_int, default=None,
                   help="write OUT/checkpoint every N steps (default: after each epoch); removed when the run ends")
    r.add_argument("--resume", action="store_true",
                   help="continue the run whose checkpoint is in --out (same data, model and settings)")
    r.add_argument("--overwrite", action="store_true",
                   help="replace a model (or checkpoint) of another run in --out; without it such --out is refused")
    r.add_argument("--log-every", type=positive_int, default=d.log_every, help="steps between lines of OUT/log.jsonl")
    r.add_argument("--tensorboard", action="store_true", help="also write TensorBoard event files to OUT/tensorboard")
    f = p.add_argument_group("feature extraction")
    f.add_argument("--mode", choices=("finetune", "features"), default="finetune",
                   help="fine-tune the encoder with the head, or train the head alone on frozen, cached features")
    f.add_argument("--layers", default=None,
                   help="hidden layers the head reads: -1 (the last; default), -1,-2,-3,-4, all; 0 is the embeddings")
    f.add_argument("--combine", choices=COMBINES, default="concat", help="how several --layers are merged")
    f.add_argument("--cache-dir", default=None,
                   help="feature cache directory (default: $BERTHEADS_CACHE or ~/.cache/bertheads)")
    f.add_argument("--cache-dtype", choices=("float16", "float32"), default="float16",
                   help="precision of the cached encoder states")
    f.add_argument("--cache-max-gb", type=positive_float, default=None,
                   help="refuse to grow the feature cache beyond this size")
    accept_layer_lists(p)


def settings_from(args: argparse.Namespace) -> TrainSettings:
    """The training settings given on a command line."""
    return TrainSettings(epochs=args.epochs, batch_size=args.batch_size, lr=getattr(args, "lr", None), seed=args.seed,
                         warmup_ratio=args.warmup_ratio, weight_decay=args.weight_decay,
                         eval_batch_size=args.eval_batch_size, progress=not args.no_progress,
                         keep=args.keep, select_metric=args.select_metric, grad_accum=args.grad_accum,
                         eval_every=args.eval_every, patience=args.patience, save_every=args.save_every,
                         resume=args.resume, overwrite=args.overwrite, log_every=args.log_every,
                         tensorboard=args.tensorboard)


def task_options(args: argparse.Namespace) -> dict:
    """The task's own settings given on a command line (everything that is not a run flag)."""
    return {k: v for k, v in vars(args).items() if k not in RUN_FLAGS and not callable(v)}


def task_class(kind: str):
    if kind not in TASKS:
        raise UserError(f"unknown task kind {kind!r} (known: {', '.join(TASKS)})")
    return TASKS[kind]


def kind_parser(kind: str | None = None) -> argparse.ArgumentParser:
    """The flags of `bertheads train KIND` (their defaults are the kind's defaults); the generic
    training flags alone for None."""
    parser = argparse.ArgumentParser(add_help=False)
    if kind is None:
        add_training_flags(parser)
        return parser
    cls = task_class(kind)
    cls.add_arguments(parser)
    add_training_flags(parser, **cls.training_defaults)
    return parser


def kind_options(kind: str) -> dict[str, argparse.Action]:
    """Per-task option name -> its argparse action (type, choices): the kind's own flags and
    the head settings among the training flags."""
    actions = {a.dest: a for a in kind_parser(kind)._actions if a.dest != "help"}
    generic = {a.dest for a in kind_parser()._actions}
    return {dest: a for dest, a in actions.items() if dest not in generic or dest in HEAD_FLAGS}


def kind_defaults(kind: str) -> dict:
    """The defaults of a kind's per-task options."""
    options = kind_options(kind)
    return {k: v for k, v in vars(kind_parser(kind).parse_args([])).items() if k in options}


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
    except argparse.ArgumentTypeError as exc:
        fail(str(exc))
    except (TypeError, ValueError):
        fail(f"expected {getattr(convert, '__name__', 'a value')}, got {value!r}")
    if action.choices is not None and value not in action.choices:
        fail(f"expected one of {', '.join(map(str, action.choices))}, got {value!r}")
    return value
