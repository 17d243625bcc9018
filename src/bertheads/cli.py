"""Every `bertheads` command: its parser and its handler.

```
bertheads train KIND --train F [--dev F] --out DIR    KIND: classify, tag, qa, or multi --config F
bertheads evaluate DIR --data F                        metrics of a saved model
bertheads predict DIR [--input F] [--output F]         predictions as JSON lines, in input order
bertheads extract --input F --out DIR                  frozen-encoder vectors for other tools
bertheads tune KIND --train F --dev F --out DIR       search training settings, keep the best model
bertheads report DIR [--data F] [--out PAGE_DIR]       an HTML page of figures for a saved model
bertheads combine DIR DIR ... --out DIR                one model from several sharing an encoder
bertheads serve DIR                                    HTTP API and web page
```
Bad input ends with one line `bertheads: error: ...` naming the file and line (or the option),
exit status 2; `-v` shows more of what happens, `-q` only warnings and errors.
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import os
import sys
import threading
from pathlib import Path

from bertheads import __version__
from bertheads.api import combine, load, train, train_multi
from bertheads.bundle import MANIFEST, encoder_location
from bertheads.errors import UserError
from bertheads.export_hf import export_hf
from bertheads.export_onnx import export_onnx
from bertheads.extract import INPUT_FORMATS, POOLS, ExtractSettings, extract
from bertheads.flags import (
    HEAD_FLAGS,
    Parser,
    accept_layer_lists,
    add_training_flags,
    fraction,
    non_negative_float,
    positive_float,
    positive_int,
    settings_from,
    task_options,
)
from bertheads.multitask import read_config
from bertheads.packing import INFERENCE_BATCH
from bertheads.stream import CHUNK_SIZE, StreamSettings
from bertheads.tasks import TASKS
from bertheads.tasks.qa_spans import WINDOW_CHOICES
from bertheads.train import SAMPLINGS

log = logging.getLogger("bertheads")
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

    train_p = sub.add_parser("train", help="fine-tune a head (or train it on frozen features)",
                             description="Train a head of one task kind, or several heads at once (multi).")
    kinds = train_p.add_subparsers(dest="kind", required=True, metavar="KIND")
    for kind, cls in TASKS.items():
        p = kinds.add_parser(kind, help=cls.help, description=cls.help, parents=[common])
        p.add_argument("--train", required=True, help="training file (formats: see the README)")
        p.add_argument("--dev", help="labelled file evaluated after every epoch; the best epoch is kept")
        p.add_argument("--out", required=True, help="model directory to write (replaced atomically; one of "
                                                    "another run only with --overwrite)")
        cls.add_arguments(p)
        add_training_flags(p, **cls.training_defaults)
        p.set_defaults(handler=cmd_train)
    add_train_multi(kinds, common)

    ev = sub.add_parser("evaluate", help="metrics of a saved model on labelled data", parents=[common])
    ev.add_argument("model_dir", help="a model directory written by `bertheads train`")
    ev.add_argument("--data", required=True, help="labelled file in one of the task's formats")
    ev.add_argument("--head", help="which head, for a model with several")
    ev.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ev.add_argument("--batch-size", type=positive_int, default=INFERENCE_BATCH, help="inputs per batch")
    ev.add_argument("--predictions-out", help="qa: write {id: answer} JSON here (and an n-best file beside it)")
    ev.add_argument("--null-threshold", type=float, help="qa (SQuAD v2): override the saved no-answer threshold")
    ev.add_argument("--threshold", type=fraction, help="multi-label classify: one threshold for every label "
                                                       "instead of the saved ones")
    ev.add_argument("--window-choice", choices=WINDOW_CHOICES,
                    help="qa: override the saved way spans of a long passage's windows compare")
    ev.add_argument("--paragraph-windows", action=argparse.BooleanOptionalAction,
                    help="qa: override whether each paragraph of a passage is read in windows of its own")
    ev.add_argument("--paragraph-match", type=non_negative_float, metavar="W",
                    help="qa: override the saved weight of how well each paragraph matches the question")
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
    pr.add_argument("--question", help="qa: one question (with --context)")
    pr.add_argument("--context", help="qa: the passage for --question")
    pr.add_argument("--null-threshold", type=float, help="qa (SQuAD v2): override the saved no-answer threshold")
    pr.add_argument("--threshold", type=fraction, help="multi-label classify: one threshold for every label "
                                                       "instead of the saved ones")
    pr.add_argument("--min-score", type=fraction,
                    help="single-label classify: no label (null) when the best score is below this")
    pr.add_argument("--batch-size", type=positive_int, default=INFERENCE_BATCH, help="inputs per batch")
    pr.add_argument("--no-verify", action="store_true", help="load encoder weights that differ from the saved hash")
    add_stream_flags(pr)
    pr.add_argument("--long-input", choices=("truncate", "windows"),
                    help="classify: override the saved way of reading texts longer than --max-length")
    pr.add_argument("--pool", choices=("mean", "max"), help="classify, --long-input windows: override the saved pooling")
    pr.add_argument("--window-choice", choices=WINDOW_CHOICES,
                    help="qa: override the saved way spans of a long passage's windows compare")
    pr.add_argument("--paragraph-windows", action=argparse.BooleanOptionalAction,
                    help="qa: override whether each paragraph of a passage is read in windows of its own")
    pr.add_argument("--paragraph-match", type=non_negative_float, metavar="W",
                    help="qa: override the saved weight of how well each paragraph matches the question")
    pr.add_argument("--no-progress", action="store_true", help="no progress bar (shown with --output)")
    pr.set_defaults(handler=cmd_predict)

    add_export(sub, common)
    add_tune(sub, common)
    add_report(sub, common)
    add_extract(sub, common)
    add_combine(sub, common)
    add_serve(sub, common)
    for name in ("predict", "evaluate", "serve"):
        add_runtime_flags(sub.choices[name])
    return parser


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
    p.add_argument("--config", required=True, help="YAML (or TOML) naming the tasks; see the README")
    p.add_argument("--out", required=True, help="model directory to write (replaced atomically)")
    p.add_argument("--sampling", choices=SAMPLINGS, help="override the config's rule for mixing the tasks' batches")
    p.add_argument("--temperature", type=positive_float, help="override the config's sampling temperature")
    add_training_flags(p)
    # head flags given on the command line apply to every task; unset ones leave each kind's default
    p.set_defaults(**{flag: None for flag in HEAD_FLAGS}, handler=cmd_train_multi)


TUNE_FLAGS = ("trials", "restarts", "space", "resume", "no_pruning")


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
        cls.add_arguments(p)
        add_training_flags(p, **cls.training_defaults)
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
    p.add_argument("--layers", default=None, help="hidden layers: -1 (the last; default), -1,-2,-3,-4, all; "
                                                  "0 is the embeddings")
    p.add_argument("--combine", choices=("concat", "sum", "mean"), default="concat", help="how several layers merge")
    p.add_argument("--pool", choices=POOLS, default="mean",
                   help="per-text vector: mean of the pieces, the [CLS] piece, or none")
    p.add_argument("--format", choices=("safetensors", "npy"), default="safetensors", help="array file format")
    p.add_argument("--max-length", type=positive_int, default=512,
                   help="pieces per input; longer inputs are cut (index: truncated)")
    p.add_argument("--dtype", choices=("float32", "float16"), default="float32", help="precision of the vectors")
    p.add_argument("--no-tokens", action="store_true", help="write only the pooled vectors")
    p.add_argument("--batch-size", type=positive_int, default=INFERENCE_BATCH, help="inputs per batch")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    accept_layer_lists(p)
    p.set_defaults(handler=cmd_extract)


def add_combine(sub, common) -> None:
    p = sub.add_parser("combine", help="one model from several that share an identical encoder", parents=[common])
    p.add_argument("model_dirs", nargs="+", help="model directories whose encoders are identical")
    p.add_argument("--out", required=True, help="model directory to write (replaced atomically)")
    p.add_argument("--names", nargs="+", help="new head names, one per head in input order")
    p.set_defaults(handler=cmd_combine)


def add_runtime_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("runtime")
    g.add_argument("--runtime", choices=("torch", "onnx"), default="torch",
                   help="onnx: run DIR/onnx/ (written by `bertheads export DIR --to onnx`) with ONNX Runtime")
    g.add_argument("--precision", choices=("fp32", "int8"), default="fp32", help="int8: the quantized ONNX graph")


def add_export(sub, common) -> None:
    p = sub.add_parser("export", help="a transformers directory for one head, or an ONNX graph of the model",
                       parents=[common])
    p.add_argument("model_dir", help="a model directory written by `bertheads train`")
    p.add_argument("--to", required=True, choices=("hf", "onnx"), help="the format to write")
    p.add_argument("--out", help="hf: the new directory (required); onnx: default MODEL_DIR/onnx")
    p.add_argument("--head", help="hf: the head to export (required when the model has several)")
    p.add_argument("--quantize", choices=("int8",), help="onnx: also write the int8 graph")
    p.set_defaults(handler=cmd_export)


def add_serve(sub, common) -> None:
    p = sub.add_parser("serve", help="HTTP API (FastAPI) and web page for a saved model", parents=[common])
    p.add_argument("model_dir", help="a model directory written by `bertheads train`")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8000, help="port to listen on")
    p.add_argument("--max-batch", type=positive_int, default=64, help="most texts run together in one model call")
    p.add_argument("--batch-window-ms", type=float, default=5.0, help="how long to gather concurrent requests")
    p.add_argument("--max-texts", type=positive_int, default=64, help="most texts in one request")
    p.add_argument("--max-text-chars", type=positive_int, default=10000, help="longest text accepted, in characters")
    # limits, access and checks (serve.settings_from_args reads these)
    p.add_argument("--max-batch-tokens", type=positive_int, default=4096, help="encoder tokens in one model call")
    p.add_argument("--max-queue", type=positive_int, default=64,
                   help="requests waiting; more get 503 with Retry-After")
    p.add_argument("--timeout", type=positive_float, default=30.0,
                   help="seconds a request may take: 503 if not started by then, 504 if not finished")
    p.add_argument("--max-connections", type=positive_int, default=128, help="concurrent connections; more get 503")
    p.add_argument("--allowed-host", action="append", metavar="NAME",
                   help="a Host header name to accept besides loopback names (repeatable; '*': any)")
    p.add_argument("--token", default=os.environ.get("BERTHEADS_TOKEN") or None,
                   help="require 'Authorization: Bearer TOKEN' (default: $BERTHEADS_TOKEN)")
    p.add_argument("--insecure", action="store_true", help="serve a non-loopback --host without a token")
    p.add_argument("--cors-origin", action="append", metavar="ORIGIN",
                   help="a browser origin allowed to call the API (repeatable; default: none)")
    p.add_argument("--no-verify", action="store_true", help="load encoder weights that differ from the saved hash")
    p.set_defaults(handler=cmd_serve)


# -- handlers --------------------------------------------------------------------------
def report_saved(model, out: str, heads: bool = False) -> None:
    """`saved DIR` on stderr, then the kept dev metrics as one JSON line on stdout (once, from
    the main process under torchrun)."""
    if os.environ.get("RANK", "0") != "0":
        return
    names = f" (heads: {', '.join(model.heads)})" if heads else ""
    log.info(f"saved {out}{names}")
    path = Path(out) / "metrics.json"
    if path.is_file():
        saved = json.loads(path.read_text())
        if saved.get("dev"):
            print(json.dumps({"dev": saved["dev"], "kept": saved.get("kept")}))


def cmd_train(args) -> int:
    model = train(args.kind, args.train, args.dev, args.out, model=args.model, settings=settings_from(args),
                  limit=args.limit, **task_options(args))
    report_saved(model, args.out)
    return 0


def cmd_train_multi(args) -> int:
    config = read_config(args.config)
    if args.sampling:
        config.sampling = args.sampling
    if args.temperature is not None:
        config.temperature = args.temperature
    cli_options = {flag: getattr(args, flag) for flag in HEAD_FLAGS}
    model = train_multi(config, args.out, model=args.model, settings=settings_from(args), limit=args.limit,
                        **cli_options)
    report_saved(model, args.out, heads=True)
    return 0


def cmd_evaluate(args) -> int:
    model = load(args.model_dir, verify=not args.no_verify, runtime=args.runtime, precision=args.precision)
    model.choose_windows(args.head, args.window_choice, args.paragraph_windows, args.paragraph_match)
    settings = StreamSettings(chunk_size=args.chunk_size, batch_size=args.batch_size,
                              skip_bad_lines=args.skip_bad_lines)
    metrics = model.evaluate(args.data, head=args.head, settings=settings,
                             **present(args, "predictions_out", "null_threshold", "threshold"))
    if metrics.get("skipped"):
        log.warning(f"skipped {metrics['skipped']} bad record(s) of {args.data}")
    if args.json:
        print(json.dumps(metrics))
    else:
        for key, value in metrics.items():
            if isinstance(value, float):
                print(f"{key:>16}  {value:.4f}")
            elif not isinstance(value, dict):
                print(f"{key:>16}  {value}")
            else:
                print(f"{key:>16}  {json.dumps(value)}")
    return 0


def cmd_predict(args) -> int:
    if args.output:
        check_output_file(args.output)
    model = load(args.model_dir, verify=not args.no_verify, runtime=args.runtime, precision=args.precision)
    options = present(args, "question", "context", "null_threshold", "threshold", "min_score")
    model.read_long_inputs(args.head, **present(args, "long_input", "pool"))
    model.choose_windows(args.head, args.window_choice, args.paragraph_windows, args.paragraph_match)
    settings = StreamSettings(chunk_size=args.chunk_size, batch_size=args.batch_size, keep_fields=args.keep_fields,
                              skip_bad_lines=args.skip_bad_lines, progress=bool(args.output) and not args.no_progress)
    report = model.predict_stream(args.input, args.output, head=args.head, fmt=args.format, settings=settings,
                                  **options)
    if report.skipped and os.environ.get("RANK", "0") == "0":
        log.warning(f"skipped {report.skipped} bad record(s) of {args.input or '<stdin>'}")
    return 0


def cmd_export(args) -> int:
    if args.to == "hf":
        if args.quantize:
            raise UserError("--quantize: only with --to onnx")
        if not args.out:
            raise UserError("--to hf needs --out DIR")
        info = export_hf(args.model_dir, args.out, args.head)
        log.info(f"saved {args.out} ({info['class']} for head {info['head']}; "
                 f"pipeline({info['pipeline']!r}, model={args.out!r}))")
        return 0
    if args.head:
        raise UserError("--head: only with --to hf (the ONNX graph holds every head)")
    meta = export_onnx(args.model_dir, args.out, args.quantize, log=log.info)
    graphs = ", ".join(f"{g['file']} ({g['bytes'] / 1e6:.1f} MB)" for g in meta["graphs"].values())
    log.info(f"saved {args.out or os.path.join(args.model_dir, 'onnx')}: {graphs}")
    return 0


def cmd_tune(args) -> int:
    from bertheads.tune import TuneSettings, summary, table, tune  # optuna loads only for this command

    if args.restarts < 0:
        raise UserError(f"--restarts: expected 0 or more, got {args.restarts}")
    settings = settings_from(args)
    settings.resume = False  # tune's --resume continues the search (its trials start afresh)
    search = TuneSettings(trials=args.trials, restarts=args.restarts, space=args.space, resume=args.resume,
                          pruning=not args.no_pruning)
    options = {k: v for k, v in task_options(args).items() if k not in TUNE_FLAGS}
    rows = tune(args.kind, args.train, args.dev, args.out, model=args.model, settings=settings,
                search=search, limit=args.limit, **options)
    print(table(rows))
    print(summary(rows))
    return 0


def cmd_report(args) -> int:
    from bertheads.report import report  # matplotlib loads only for this command

    page = report(args.model_dir, args.data, args.out, head=args.head, batch_size=args.batch_size)
    log.info(f"wrote {page}")
    return 0


def cmd_extract(args) -> int:
    model = args.model
    if model not in (None, "", "default") and (Path(model) / MANIFEST).is_file():
        model = encoder_location(model)  # a saved bertheads model: its (fine-tuned) encoder
    settings = ExtractSettings(layers=args.layers, combine=args.combine, pool=args.pool, format=args.format,
                               max_length=args.max_length, dtype=args.dtype, tokens=not args.no_tokens,
                               batch_size=args.batch_size, progress=not args.no_progress)
    meta = extract(model, args.input, args.out, settings, args.input_format)
    cut = f", {meta['truncated']} cut at --max-length {meta['max_length']}" if meta["truncated"] else ""
    log.info(f"wrote {args.out}: {meta['texts']} texts, {meta['tokens']} pieces, dim {meta['dim']}{cut}")
    return 0


def cmd_combine(args) -> int:
    model = combine(args.model_dirs, args.out, args.names)
    log.info(f"saved {args.out} (heads: {', '.join(f'{n} ({k})' for n, k in model.heads.items())})")
    return 0


def cmd_serve(args) -> int:
    from bertheads.serve import serve, settings_from_args  # the web stack loads only for this command

    serve(args.model_dir, args.host, args.port, settings_from_args(args), verify=not args.no_verify,
          runtime=args.runtime, precision=args.precision)
    return 0


def check_output_file(path: str) -> None:
    """`--output` must name a file that can be written (checked before any work is done)."""
    out = Path(path)
    if out.is_dir():
        raise UserError(f"--output {path}: is a directory; give a file name")
    parent = next((p for p in out.absolute().parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise UserError(f"--output {path}: {parent} is not a directory")


def present(args, *names: str) -> dict:
    """The named options that were given on the command line."""
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


# -- running ---------------------------------------------------------------------------
class OneLine(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        prefix = "" if record.levelno == logging.INFO else f"{record.levelname.lower()}: "
        return f"bertheads: {prefix}{record.getMessage()}"


def set_up_logging(verbose: bool = False, quiet: bool = False) -> None:
    """bertheads' messages on stderr, one line each (`-v`: debug too; `-q`: warnings and errors)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLine())
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = build_parser().parse_args(argv)
    set_up_logging(getattr(args, "verbose", False), getattr(args, "quiet", False))
    try:
        return args.handler(args)
    except UserError as exc:
        print(f"bertheads: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print(f"bertheads: interrupted{': ' + str(exc) if str(exc) else ''}", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # an internal fault: still one line, the traceback on request
        if os.environ.get("BERTHEADS_DEBUG"):
            raise
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"bertheads: internal error: {type(exc).__name__}: {msg} (BERTHEADS_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return 1


def command() -> None:
    """The `bertheads` command: main(), then a quick exit.

    When the command is done (its files are written and renamed into place), the exit handlers
    run and the standard streams are flushed, and then the process ends without Python tearing
    down every imported module one by one, which takes most of a second once torch is loaded.
    The usual exit is kept under torchrun and while a non-daemon thread still runs."""
    code = main()
    alone = "WORLD_SIZE" not in os.environ
    workers = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    if not alone or workers:
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):  # a reader that went away, a stream already closed
            pass
    os._exit(code)


if __name__ == "__main__":
    command()
