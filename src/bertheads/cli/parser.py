"""The `bertheads` command line, built from the settings dataclasses: `COMMANDS` is the table
of commands, each a handler in `bertheads.cli.commands` and the groups of settings whose
fields are its flags. No flag is written here by hand."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from bertheads import __version__
from bertheads.base.runtimes import choices as runtime_choices
from bertheads.base.schema import add_flags, add_override_flags, closest
from bertheads.cli import settings as cli
from bertheads.cli.commands import (
    cmd_analyze,
    cmd_audit,
    cmd_calibrate,
    cmd_combine,
    cmd_distill,
    cmd_env,
    cmd_evaluate,
    cmd_export,
    cmd_extract,
    cmd_gate,
    cmd_predict,
    cmd_report,
    cmd_select,
    cmd_serve,
    cmd_train,
    cmd_train_multi,
    cmd_tune,
)
from bertheads.engines.ray_job import EngineSettings
from bertheads.export.modes import RuntimeSettings
from bertheads.inference.extract import ExtractSettings, ExtractSource
from bertheads.inference.extract import input_formats as extract_formats
from bertheads.inference.select import SelectSettings
from bertheads.inference.stream import StreamSettings
from bertheads.serve.settings import Address, ServeSettings
from bertheads.tasks import TASKS, inference_flags, input_formats
from bertheads.training.audit import AuditSettings
from bertheads.training.distill import DistillData, DistillSettings
from bertheads.training.flags import HEAD_FLAGS, accept_layer_lists, add_kind_flags, add_training_flags
from bertheads.training.settings import TrainSettings
from bertheads.training.tune import TuneSettings


class ShowDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """`(default: X)` after each flag's help, except where there is no default to show."""

    def _get_help_string(self, action: argparse.Action) -> str:
        default = action.default
        if default is argparse.SUPPRESS:  # a flag whose value is left unset unless given (see add_flags)
            default = getattr(action, "shown_default", None)
        if default in (None, False, ()) or action.nargs == 0 or "default" in (action.help or ""):
            return action.help or ""
        if default is action.default:
            return super()._get_help_string(action)
        return f"{action.help} (default: {str(default).replace('%', '%%')})"


class Parser(argparse.ArgumentParser):
    """argparse with defaults in `--help` and one-line errors (`bertheads: error: ...`, exit 2)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", ShowDefaults)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        if message.startswith("unrecognized arguments:"):
            unknown = [word.split("=")[0] for word in message.split(":", 1)[1].split() if word.startswith("--")]
            known = all_flags(self)
            message += "".join(f" ({flag}: did you mean {close}?)" for flag in unknown
                               if (close := closest(flag, sorted(known), cutoff=0.75)))
        self.exit(2, f"bertheads: error: {message} (see {self.prog} --help)\n")


def all_flags(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of `parser` and of its commands' parsers, all the way down."""
    flags: set[str] = set()
    for action in parser._actions:
        flags.update(s for s in action.option_strings if s.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                flags |= all_flags(sub)
    return flags


# -- the table ------------------------------------------------------------------------------
@dataclass
class Group:
    """One settings dataclass's fields as a command's flags (see `schema.add_flags`); `now`
    gives what is known only when the parser is built: defaults from the environment, choices
    from the registry."""

    cls: type
    only: tuple[str, ...] | None = None
    now: Callable[[], dict] = dict  # keywords of `add_flags`: defaults, choices


@dataclass
class Command:
    name: str
    help: str
    handler: Callable | None
    groups: tuple[Group, ...] = ()
    options: str | None = None  # the kinds' inference options of this command, as flags
    description: str | None = None
    more: Callable[[argparse.ArgumentParser], None] | None = None  # flags derived otherwise (a kind's)
    kinds: bool = False  # one sub-command per task kind (`audit KIND`), each with the kind's training flags


READ = (Group(cli.SavedModel),)
RUNTIME = Group(RuntimeSettings, now=lambda: {"choices": {"runtime": runtime_choices()}})
SUPPRESS = partial(dict, suppress=True)  # flags not given leave no value: a config file's stand
STREAM = ("chunk_size", "batch_size", "skip_bad_lines")

COMMANDS = (
    Command("evaluate", "metrics of a saved model on labelled data", cmd_evaluate,
            (*READ, Group(cli.EvaluateFiles), Group(cli.Head), Group(cli.AsJson), Group(StreamSettings, STREAM),
             RUNTIME), options="evaluate"),
    Command("predict", "predictions as JSON lines, in input order", cmd_predict,
            (*READ, Group(cli.PredictFiles, now=lambda: {"choices": {"format": ("auto", *input_formats())}}),
             Group(cli.Head),
             Group(StreamSettings, (*STREAM, "keep_fields", "progress")), RUNTIME, Group(EngineSettings)),
            options="predict"),
    Command("analyze", "every head on each input, one encoder pass, as JSON lines", cmd_analyze,
            (*READ, Group(cli.AnalyzeFiles), Group(StreamSettings, (*STREAM, "keep_fields")), RUNTIME),
            options="analyze"),
    Command("export", "a transformers directory for one head, or an ONNX graph of the model", cmd_export,
            (*READ, Group(cli.ExportFiles), Group(cli.Head), Group(RuntimeSettings, ("gate_data",)))),
    Command("calibrate", "a copy of a model with each head's temperature refitted on other labelled data",
            cmd_calibrate, (*READ, Group(cli.CalibrateFiles), Group(cli.Head), Group(StreamSettings, ("batch_size",)))),
    Command("gate", "each lower precision this machine runs a model in, checked against fp32 and timed "
                    "(MODEL_DIR/gate.json)", cmd_gate,
            (*READ, Group(RuntimeSettings, ("device", "gate_data", "verify")), Group(cli.AsJson))),
    Command("report", "an HTML page of figures for a saved model", cmd_report,
            (*READ, Group(cli.ReportFiles), Group(cli.Head), Group(StreamSettings, ("batch_size",)))),
    Command("extract", "frozen-encoder vectors per word piece and per text, for other tools", cmd_extract,
            (Group(ExtractSource, now=lambda: {"choices": {"input_format": extract_formats()}}),
             Group(ExtractSettings)), more=accept_layer_lists),
    Command("combine", "one model from several that share an identical encoder", cmd_combine,
            (Group(cli.CombineFiles),)),
    Command("serve", "HTTP API (FastAPI) and web page for a saved model", cmd_serve,
            (*READ, Group(Address),
             Group(ServeSettings, now=lambda: {"defaults": {"token": os.environ.get("BERTHEADS_TOKEN") or None}}),
             RUNTIME), options="serve"),
    Command("audit", "the training rows whose labels the model disputes, ranked (out-of-fold heads, cleanlab)",
            cmd_audit, (Group(cli.AuditFiles), Group(AuditSettings)), kinds=True,
            description="Train --folds heads, each on all but one fold of --train (as `train` would: --mode features "
                        "trains them on the features cache in seconds), predict the fold each left out, and rank "
                        "the rows whose given label those predictions dispute (cleanlab's confident learning). "
                        "Writes OUT/issues.jsonl and OUT/summary.json."),
    Command("distill", "a smaller student with a model's heads, trained on its scores of unlabelled inputs",
            cmd_distill,
            (Group(DistillData, now=SUPPRESS), Group(cli.DistillFiles), Group(DistillSettings, now=SUPPRESS)),
            more=lambda p: add_flags(p, TrainSettings, suppress=True),  # (not given: the config's)
            description="Score --data (and --train) with the TEACHER model, every head from one pass per input "
                        "(the scores kept in the cache), and train a student with the same heads on --model: the "
                        "teacher's scores at --soft-temperature, and the gold labels of --train where given "
                        "(docs/distill.md). The student is a model folder as `train` writes one."),
    Command("select", "the unlabelled inputs most worth labelling next (margin, entropy or diverse)", cmd_select,
            (*READ, Group(cli.SelectFiles), Group(cli.Head), Group(SelectSettings), Group(StreamSettings, ("batch_size",)), RUNTIME)),
    Command("env", "this machine: CPU flags, GPUs, runtimes, and what --device/--precision auto pick", cmd_env,
            (Group(cli.AsJson),)),
)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="bertheads", description="One pretrained BERT encoder, many task heads: fine-tune or "
                                                  "train on frozen features, evaluate, predict, extract, serve.")
    parser.add_argument("--version", action="version", version=f"bertheads {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    add_flags(common, cli.Verbosity)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_train(sub, common)
    for command in COMMANDS:
        if command.name == "combine":
            add_tune(sub, common)  # (listed in this order in --help)
        add_command(sub, common, command)
    return parser


def add_command(sub, common, command: Command) -> argparse.ArgumentParser:
    p = sub.add_parser(command.name, help=command.help, description=command.description, parents=[common])
    if command.kinds:
        kinds = p.add_subparsers(dest="kind", required=True, metavar="KIND")
        for kind, cls in TASKS.items():
            k = kinds.add_parser(kind, help=cls.help, description=cls.help, parents=[common])
            for group in command.groups:
                add_flags(k, group.cls, only=group.only, **group.now())
            add_kind_flags(k, kind, suppress=True)
            k.set_defaults(handler=command.handler)
        return p
    for group in command.groups:
        add_flags(p, group.cls, only=group.only, **group.now())
    if command.options:
        flags = inference_flags(command.options)
        add_override_flags(p, [f for f, _ in flags.values()], {n: text for n, (_, text) in flags.items()})
    if command.more:
        command.more(p)
    p.set_defaults(handler=command.handler)
    return p


def add_train(sub, common) -> None:
    train_p = sub.add_parser("train", help="fine-tune a head (or train it on frozen features)", parents=[common],
                             description="Train a head of one task kind, or several heads at once (multi), or "
                                         "what a config file says (train --config FILE, e.g. a saved model's "
                                         "DIR/config.yaml; flags given override the file).")
    add_flags(train_p, cli.TrainRun, suppress=True)
    add_training_flags(train_p, suppress=True)
    train_p.set_defaults(handler=cmd_train)
    kinds = train_p.add_subparsers(dest="kind", required=False, metavar="KIND")
    for kind, cls in TASKS.items():
        p = kinds.add_parser(kind, help=cls.help, description=cls.help, parents=[common])
        add_flags(p, cli.TrainFiles, {"config": argparse.SUPPRESS})
        add_kind_flags(p, kind, suppress=True)
        p.set_defaults(handler=cmd_train)
    p = kinds.add_parser("multi", help="several heads on one encoder, trained jointly from a YAML config",
                         parents=[common])
    add_flags(p, cli.MultiFiles)
    # override the file's rule for mixing the tasks' batches
    add_flags(p, TrainSettings, {"sampling": None, "temperature": None}, only=("sampling", "temperature"))
    # flags given override the file; head flags apply to every task (a task's own entry wins), and
    # those not given leave each kind's default (so --help shows none)
    add_training_flags(p, dict.fromkeys(HEAD_FLAGS), suppress=True)
    p.set_defaults(handler=cmd_train_multi)


def add_tune(sub, common) -> None:
    tune_p = sub.add_parser("tune", help="search training settings on dev (Optuna), keep the best model",
                            description="Train one setting per trial and keep the best on --dev: by default "
                                        "the BERT paper's grid (lr 5e-5, 3e-5, 2e-5; batch size 16, 32; "
                                        "up to 4 epochs, the best epoch taken).")
    kinds = tune_p.add_subparsers(dest="kind", required=True, metavar="KIND")
    for kind, cls in TASKS.items():
        p = kinds.add_parser(kind, help=cls.help, parents=[common])
        add_flags(p, cli.TuneFiles)
        add_flags(p, TuneSettings)
        add_kind_flags(p, kind)
        p.set_defaults(handler=cmd_tune, epochs=4)
