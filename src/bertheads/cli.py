"""`bertheads train | evaluate | predict` (and the commands later issues add).

Bad input ends with one line `bertheads: error: ...` naming the file and line, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from bertheads.errors import UserError
from bertheads.packing import INFERENCE_BATCH

TRAIN_KINDS = ("classify", "tag", "qa")


def add_training_flags(p: argparse.ArgumentParser, *, max_length: int = 128, batch_size: int = 32) -> None:
    g = p.add_argument_group("training")
    g.add_argument("--model", default="default", help="'default' (embedded MiniLM-L6), a checkpoint directory or a hub name")
    g.add_argument("--epochs", type=int, default=3)
    g.add_argument("--batch-size", type=int, default=batch_size)
    g.add_argument("--lr", type=float, default=5e-5)
    g.add_argument("--max-length", type=int, default=max_length)
    g.add_argument("--seed", type=int, default=42)
    g.add_argument("--limit", type=int, default=None, help="use only the first N training examples")
    g.add_argument("--warmup-ratio", type=float, default=0.1)
    g.add_argument("--weight-decay", type=float, default=0.01)
    g.add_argument("--eval-batch-size", type=int, default=INFERENCE_BATCH)
    g.add_argument("--no-progress", action="store_true", help="no progress bars")
    f = p.add_argument_group("feature extraction")
    f.add_argument("--mode", choices=("finetune", "features"), default="finetune")
    f.add_argument("--layers", default=None, help="hidden layers the head reads: -1 (default), -1,-2,-3,-4, all")
    f.add_argument("--combine", choices=("concat", "sum", "mean", "scalar-mix"), default="concat")
    f.add_argument("--cache-dir", default=None, help="feature cache (default: $BERTHEADS_CACHE or ~/.cache/bertheads)")
    f.add_argument("--cache-dtype", choices=("float16", "float32"), default="float16")
    f.add_argument("--cache-max-gb", type=float, default=None)
    from bertheads.features import accept_layer_lists

    accept_layer_lists(p)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bertheads", description="One BERT encoder, many task heads.")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="fine-tune a head (or train it on frozen features)")
    kinds = train.add_subparsers(dest="kind", required=True)
    from bertheads.tasks import TASKS

    for kind, cls in TASKS.items():
        p = kinds.add_parser(kind, help=cls.help)
        p.add_argument("--train", required=True)
        p.add_argument("--dev")
        p.add_argument("--out", required=True)
        cls.add_arguments(p)
        add_training_flags(p, **cls.training_defaults)
    from bertheads import multi  # train multi, combine, serve

    COMMANDS.update(multi.add_parsers(sub, kinds, add_training_flags))

    ev = sub.add_parser("evaluate", help="metrics of a saved model on labelled data")
    ev.add_argument("model_dir")
    ev.add_argument("--data", required=True)
    ev.add_argument("--head")
    ev.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ev.add_argument("--batch-size", type=int, default=INFERENCE_BATCH)
    ev.add_argument("--predictions-out", help="qa: write {id: answer} JSON here (and an n-best file beside it)")
    ev.add_argument("--null-threshold", type=float, help="qa (SQuAD v2): override the saved no-answer threshold")

    pr = sub.add_parser("predict", help="predictions as JSON lines, in input order")
    pr.add_argument("model_dir")
    pr.add_argument("--input", help="file in a training format or plain lines (TAB separates a pair); default stdin")
    pr.add_argument("--output", help="JSONL file (written atomically); default stdout")
    pr.add_argument("--head")
    pr.add_argument("--format", default="auto", help="input format: auto, tsv, csv, jsonl, lines, conll")
    pr.add_argument("--question", help="qa: one question (with --context)")
    pr.add_argument("--context", help="qa: the passage for --question")
    pr.add_argument("--null-threshold", type=float, help="qa (SQuAD v2): override the saved no-answer threshold")
    pr.add_argument("--batch-size", type=int, default=INFERENCE_BATCH)
    from bertheads import extract  # bertheads extract

    COMMANDS.update(extract.add_parser(sub))
    for name in ("predict", "evaluate", "serve"):
        add_runtime_flags(sub.choices[name])
    add_export_parser(sub)
    return parser


def add_runtime_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("runtime")
    g.add_argument("--runtime", choices=("torch", "onnx"), default="torch",
                   help="onnx: run DIR/onnx/ (written by `bertheads export DIR --to onnx`) with ONNX Runtime")
    g.add_argument("--precision", choices=("fp32", "int8"), default="fp32", help="int8: the quantized ONNX graph")


def add_export_parser(sub) -> None:
    p = sub.add_parser("export", help="a transformers directory for one head, or an ONNX graph of the model")
    p.add_argument("model_dir")
    p.add_argument("--to", required=True, choices=("hf", "onnx"))
    p.add_argument("--out", help="hf: the new directory (required); onnx: default MODEL_DIR/onnx")
    p.add_argument("--head", help="hf: the head to export (required when the model has several)")
    p.add_argument("--quantize", choices=("int8",), help="onnx: also write the int8 graph")
    COMMANDS["export"] = cmd_export


def cmd_export(args) -> int:
    if args.to == "hf":
        if args.quantize:
            raise UserError("--quantize: only with --to onnx")
        if not args.out:
            raise UserError("--to hf needs --out DIR")
        from bertheads.export_hf import export_hf

        info = export_hf(args.model_dir, args.out, args.head)
        print(f"saved {args.out} ({info['class']} for head {info['head']}; "
              f"pipeline({info['pipeline']!r}, model={args.out!r}))")
        return 0
    if args.head:
        raise UserError("--head: only with --to hf (the ONNX graph holds every head)")
    from bertheads.export_onnx import export_onnx

    meta = export_onnx(args.model_dir, args.out, args.quantize, log=lambda m: print(m, file=sys.stderr))
    graphs = ", ".join(f"{g['file']} ({g['bytes'] / 1e6:.1f} MB)" for g in meta["graphs"].values())
    print(f"saved {args.out or os.path.join(args.model_dir, 'onnx')}: {graphs}")
    return 0


def settings_from(args):
    from bertheads.train import TrainSettings

    return TrainSettings(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                         warmup_ratio=args.warmup_ratio, weight_decay=args.weight_decay,
                         eval_batch_size=args.eval_batch_size, progress=not args.no_progress)


def task_options(args) -> dict:
    skip = {"command", "kind", "train", "dev", "out", "model", "epochs", "batch_size", "lr", "seed", "limit",
            "warmup_ratio", "weight_decay", "eval_batch_size", "no_progress"}
    return {k: v for k, v in vars(args).items() if k not in skip}


def cmd_train(args) -> int:
    if args.kind == "multi":
        return args.run(args)
    from bertheads.api import train

    model = train(args.kind, args.train, args.dev, args.out, model=args.model, settings=settings_from(args),
                  limit=args.limit, **task_options(args))
    metrics = getattr(model, "directory", None) and (model.directory / "metrics.json").read_text()
    print(f"saved {args.out}")
    if metrics:
        dev = json.loads(metrics).get("dev")
        if dev:
            print(json.dumps({"dev": dev}))
    return 0


def cmd_evaluate(args) -> int:
    from bertheads.api import load

    model = load(args.model_dir, runtime=args.runtime, precision=args.precision)
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
    from bertheads.api import load
    from bertheads.bundle import atomic_write_text

    model = load(args.model_dir, runtime=args.runtime, precision=args.precision)
    options = present(args, "question", "context", "null_threshold")
    examples, predictions = model.predict_file(args.input, head=args.head, fmt=args.format, batch_size=args.batch_size,
                                     progress=bool(args.output), **options)
    text = model.render(predictions, examples, args.format, head=args.head)
    if args.output:
        atomic_write_text(args.output, text)
    else:
        sys.stdout.write(text)
    return 0


def present(args, *names: str) -> dict:
    """The named options that were given on the command line."""
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


COMMANDS = {"train": cmd_train, "evaluate": cmd_evaluate, "predict": cmd_predict}


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except UserError as exc:
        print(f"bertheads: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bertheads: interrupted", file=sys.stderr)
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
