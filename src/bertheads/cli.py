"""Every `bertheads` command: its parser and its handler.

```
bertheads train KIND --train F [--dev F] --out DIR    KIND: classify, tag, qa, or multi --config F
bertheads evaluate DIR --data F                        metrics of a saved model
bertheads predict DIR [--input F] [--output F]         predictions as JSON lines, in input order
bertheads extract --input F --out DIR                  frozen-encoder vectors for other tools
bertheads combine DIR DIR ... --out DIR                one model from several sharing an encoder
bertheads serve DIR                                    HTTP API and web page
```
Bad input ends with one line `bertheads: error: ...` naming the file and line (or the option),
exit status 2; `-v` shows more of what happens, `-q` only warnings and errors.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from bertheads import __version__
from bertheads.api import combine, load, train, train_multi
from bertheads.atomic import atomic_write_text
from bertheads.bundle import MANIFEST
from bertheads.errors import UserError
from bertheads.extract import INPUT_FORMATS, POOLS, ExtractSettings, extract
from bertheads.flags import (
    HEAD_FLAGS,
    Parser,
    accept_layer_lists,
    add_training_flags,
    positive_float,
    positive_int,
    settings_from,
    task_options,
)
from bertheads.multitask import read_config
from bertheads.packing import INFERENCE_BATCH
from bertheads.tasks import TASKS
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
    ev.add_argument("--no-verify", action="store_true", help="load encoder weights that differ from the saved hash")
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
    pr.add_argument("--batch-size", type=positive_int, default=INFERENCE_BATCH, help="inputs per batch")
    pr.add_argument("--no-verify", action="store_true", help="load encoder weights that differ from the saved hash")
    pr.set_defaults(handler=cmd_predict)

    add_extract(sub, common)
    add_combine(sub, common)
    add_serve(sub, common)
    return parser


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
    model = load(args.model_dir, verify=not args.no_verify)
    metrics = model.evaluate(args.data, head=args.head, batch_size=args.batch_size,
                             **present(args, "predictions_out", "null_threshold"))
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
    model = load(args.model_dir, verify=not args.no_verify)
    options = present(args, "question", "context", "null_threshold")
    examples, predictions = model.predict_file(args.input, head=args.head, fmt=args.format,
                                               batch_size=args.batch_size, progress=bool(args.output), **options)
    text = model.render(predictions, examples, args.format, head=args.head)
    if args.output:
        atomic_write_text(args.output, text)
    else:
        sys.stdout.write(text)
    return 0


def cmd_extract(args) -> int:
    model = args.model
    if model not in (None, "", "default") and (Path(model) / MANIFEST).is_file():
        model = str(Path(model) / "encoder")  # a saved bertheads model: its (fine-tuned) encoder
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

    serve(args.model_dir, args.host, args.port, settings_from_args(args), verify=not args.no_verify)
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


if __name__ == "__main__":
    sys.exit(main())
