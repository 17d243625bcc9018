"""The `bertheads` command line: one parser per command, each naming its handler in
`bertheads.cli.commands`."""

from __future__ import annotations

import argparse
import os

from bertheads import __version__
from bertheads.base.schema import add_flags, add_override_flags
from bertheads.cli.commands import (
    cmd_analyze,
    cmd_combine,
    cmd_env,
    cmd_evaluate,
    cmd_export,
    cmd_extract,
    cmd_predict,
    cmd_report,
    cmd_serve,
    cmd_train,
    cmd_train_multi,
    cmd_tune,
)
from bertheads.export.modes import RuntimeSettings
from bertheads.running.extract import INPUT_FORMATS, ExtractSettings
from bertheads.running.stream import CHUNK_SIZE
from bertheads.serve.settings import ServeSettings
from bertheads.tasks import COMMANDS as INFERENCE_COMMANDS
from bertheads.tasks import TASKS, inference_options
from bertheads.text.batching import INFERENCE_BATCH
from bertheads.training.flags import (
    HEAD_FLAGS,
    Parser,
    accept_layer_lists,
    add_kind_flags,
    add_training_flags,
    positive_float,
    positive_int,
)
from bertheads.training.loop import SAMPLINGS

PREDICT_FORMATS = ("auto", "tsv", "csv", "jsonl", "lines", "conll", "json", "squad")




# -- parsers ---------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="bertheads", description="One pretrained BERT encoder, many task heads: fine-tune or "
                                                  "train on frozen features, evaluate, predict, extract, serve.")
    parser.add_argument("--version", action="version", version=f"bertheads {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    verbosity = common.add_mutually_exclusive_group()
    verbosity.add_argument("-v", "--verbose", action="store_true", help="more messages (debug level)")
    verbosity.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    train_p = sub.add_parser("train", help="fine-tune a head (or train it on frozen features)", parents=[common],
                             description="Train a head of one task kind, or several heads at once (multi), or "
                                         "what a config file says (train --config FILE, e.g. a saved model's "
                                         "DIR/config.yaml; flags given override the file).")
    train_p.add_argument("--config", default=argparse.SUPPRESS,
                         help="YAML (or TOML) holding the run's task(s) and settings (docs/multi.md); a saved model's DIR/config.yaml re-runs it")
    train_p.add_argument("--out", default=argparse.SUPPRESS, help="model directory to write (replaced atomically)")
    add_training_flags(train_p, suppress=True)
    train_p.set_defaults(handler=cmd_train)
    kinds = train_p.add_subparsers(dest="kind", required=False, metavar="KIND")
    for kind, cls in TASKS.items():
        p = kinds.add_parser(kind, help=cls.help, description=cls.help, parents=[common])
        p.add_argument("--train", help="training file (formats: docs/classify.md, docs/tag.md, docs/qa.md)")
        p.add_argument("--dev", help="labelled file evaluated after every epoch; the best epoch is kept")
        p.add_argument("--out", required=True, help="model directory to write (replaced atomically; one of "
                                                    "another run only with --overwrite)")
        p.add_argument("--config", default=argparse.SUPPRESS,
                       help=f"YAML (or TOML) holding this {kind} run's settings (and --train, --dev); flags given "
                            f"override it")
        add_kind_flags(p, kind, suppress=True)
        p.set_defaults(handler=cmd_train)
    add_train_multi(kinds, common)

    ev = sub.add_parser("evaluate", help="metrics of a saved model on labelled data", parents=[common])
    ev.add_argument("model_dir", help="a model directory written by `bertheads train`")
    ev.add_argument("--data", required=True, help="labelled file in one of the task's formats")
    ev.add_argument("--head", help="which head, for a model with several")
    ev.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ev.add_argument("--batch-size", type=positive_int, default=INFERENCE_BATCH, help="inputs per batch")
    ev.add_argument("--no-verify", action="store_true", help="load encoder weights that differ from the saved hash")
    add_stream_flags(ev, keep=False)
    ev.set_defaults(handler=cmd_evaluate)

    pr = sub.add_parser("predict", help="predictions as JSON lines, in input order", parents=[common])
    pr.add_argument("model_dir", help="a model directory written by `bertheads train`")
    pr.add_argument("--input", help="file in a training format or plain lines (TAB separates a pair); default stdin")
    pr.add_argument("--output", help="JSONL file (written atomically); default stdout")
    pr.add_argument("--head", help="which head, for a model with several")
    pr.add_argument("--format", choices=PREDICT_FORMATS, default="auto",
                    help="input format (tag: --format conll also writes CoNLL columns)")
    pr.add_argument("--batch-size", type=positive_int, default=INFERENCE_BATCH, help="inputs per batch")
    pr.add_argument("--no-verify", action="store_true", help="load encoder weights that differ from the saved hash")
    add_stream_flags(pr)
    pr.add_argument("--no-progress", action="store_true", help="no progress bar (shown with --output)")
    pr.set_defaults(handler=cmd_predict)

    an = sub.add_parser("analyze", help="every head on each input, one encoder pass, as JSON lines", parents=[common])
    an.add_argument("model_dir", help="a model directory written by `bertheads train` (several heads: all answer)")
    an.add_argument("--input", help="JSONL records with \"text\" (and \"second_text\" for pair heads, \"question\" "
                                    "for question heads), or plain lines (TAB separates a second text); default stdin")
    an.add_argument("--output", help="JSONL file (written atomically); default stdout")
    an.add_argument("--batch-size", type=positive_int, default=INFERENCE_BATCH, help="inputs per batch")
    an.add_argument("--no-verify", action="store_true", help="load encoder weights that differ from the saved hash")
    add_stream_flags(an)
    an.set_defaults(handler=cmd_analyze)
    add_runtime_flags(an)

    add_export(sub, common)
    add_tune(sub, common)
    add_report(sub, common)
    add_extract(sub, common)
    add_combine(sub, common)
    add_serve(sub, common)
    env = sub.add_parser("env", help="this machine: CPU flags, GPUs, runtimes, and what --device/--precision auto pick",
                         parents=[common])
    env.add_argument("--json", action="store_true", help="one JSON object on stdout")
    env.set_defaults(handler=cmd_env)
    for name in INFERENCE_COMMANDS:
        add_option_flags(sub.choices[name], name)
        add_runtime_flags(sub.choices[name])
    return parser


def add_option_flags(p: argparse.ArgumentParser, command: str) -> None:
    """The flags of the kinds' inference options that `command` takes (`Task.options_type`)."""
    add_override_flags(p, inference_options(command).values())


def add_stream_flags(p, keep: bool = True) -> None:
    p.add_argument("--chunk-size", type=positive_int, default=CHUNK_SIZE,
                   help="inputs read, predicted and written together (memory follows this, not the input)")
    p.add_argument("--skip-bad-lines", action="store_true",
                   help="report a malformed input line on stderr, skip it and go on (the count is printed at the end)")
    if keep:
        p.add_argument("--keep-fields", type=field_list, default=(),
                       help="input fields (comma-separated) copied into each prediction; `id` always is")


def field_list(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"expected field names separated by commas, got {text!r}")
    return names


def add_train_multi(kinds, common) -> None:
    p = kinds.add_parser("multi", help="several heads on one encoder, trained jointly from a YAML config",
                         parents=[common])
    p.add_argument("--config", required=True, help="YAML (or TOML) naming the tasks (docs/multi.md)")
    p.add_argument("--out", required=True, help="model directory to write (replaced atomically)")
    p.add_argument("--sampling", choices=SAMPLINGS, help="override the config's rule for mixing the tasks' batches")
    p.add_argument("--temperature", type=positive_float, help="override the config's sampling temperature")
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
        p.add_argument("--train", required=True, help="training file")
        p.add_argument("--dev", required=True, help="labelled file the trials are compared on")
        p.add_argument("--out", required=True,
                       help="directory for the best model, trials.jsonl and the search's storage")
        g = p.add_argument_group("search")
        g.add_argument("--trials", type=positive_int, help="sample N settings from --space (TPE) instead of a grid")
        g.add_argument("--space", help="YAML search space: flag: [values] or flag: {low, high, log}")
        g.add_argument("--restarts", type=int, default=0, help="train the best setting again with K other seeds")
        g.add_argument("--no-pruning", action="store_true", help="train every trial to its last epoch")
        add_kind_flags(p, kind)
        p.set_defaults(handler=cmd_tune, epochs=4)


def add_report(sub, common) -> None:
    p = sub.add_parser("report", help="an HTML page of figures for a saved model", parents=[common])
    p.add_argument("model_dir", help="a model directory written by `bertheads train` or `tune`")
    p.add_argument("--data", help="labelled file: confusion matrices, per-class scores, worst examples")
    p.add_argument("--out", help="page directory; default: MODEL_DIR/report")
    p.add_argument("--head", help="only this head, for a model with several")
    p.add_argument("--batch-size", type=positive_int, default=INFERENCE_BATCH, help="inputs per batch")
    p.set_defaults(handler=cmd_report)


def add_extract(sub, common) -> None:
    p = sub.add_parser("extract", help="frozen-encoder vectors per word piece and per text, for other tools",
                       parents=[common])
    p.add_argument("--model", default="default", help="'default', a checkpoint directory or a saved bertheads model")
    p.add_argument("--input", help="plain lines (TAB separates a pair), TSV/CSV/JSONL, CoNLL or SQuAD JSON; "
                                   "default stdin")
    p.add_argument("--input-format", choices=INPUT_FORMATS, default="auto", help="format of --input")
    p.add_argument("--out", required=True, help="output directory (replaced atomically)")
    add_flags(p, ExtractSettings)
    accept_layer_lists(p)
    p.set_defaults(handler=cmd_extract)


def add_combine(sub, common) -> None:
    p = sub.add_parser("combine", help="one model from several that share an identical encoder", parents=[common])
    p.add_argument("model_dirs", nargs="+", help="model directories whose encoders are identical")
    p.add_argument("--out", required=True, help="model directory to write (replaced atomically)")
    p.add_argument("--names", nargs="+", help="new head names, one per head in input order")
    p.set_defaults(handler=cmd_combine)


def add_runtime_flags(p: argparse.ArgumentParser) -> None:
    """--device, --runtime, --precision, --gate-data (export.modes.RuntimeSettings)."""
    add_flags(p, RuntimeSettings)


def add_export(sub, common) -> None:
    p = sub.add_parser("export", help="a transformers directory for one head, or an ONNX graph of the model",
                       parents=[common])
    p.add_argument("model_dir", help="a model directory written by `bertheads train`")
    p.add_argument("--to", required=True, choices=("hf", "onnx"), help="the format to write")
    p.add_argument("--out", help="hf: the new directory (required); onnx: default MODEL_DIR/onnx")
    p.add_argument("--head", help="hf: the head to export (required when the model has several)")
    p.add_argument("--quantize", choices=("int8",), help="onnx: also write the int8 graphs (dynamic for ONNX Runtime; "
                                                         "static QDQ, calibrated on dev data, for OpenVINO)")
    p.add_argument("--gate-data", help="onnx: labelled file the lower precisions are checked (and int8 calibrated) on; "
                                       "default: the model's own dev file")
    p.set_defaults(handler=cmd_export)


def add_serve(sub, common) -> None:
    p = sub.add_parser("serve", help="HTTP API (FastAPI) and web page for a saved model", parents=[common])
    p.add_argument("model_dir", help="a model directory written by `bertheads train`")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8000, help="port to listen on")
    # limits, access and checks: the fields of serve.settings.ServeSettings
    add_flags(p, ServeSettings, defaults={"token": os.environ.get("BERTHEADS_TOKEN") or None})
    p.add_argument("--no-verify", action="store_true", help="load encoder weights that differ from the saved hash")
    p.set_defaults(handler=cmd_serve)


