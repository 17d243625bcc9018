"""Hyperparameter search benchmark: `bertheads tune` against one training run with the default
settings, on the same data, in one run (ours only: the peer has no equivalent command).

    nice -n 10 .venv/bin/python bench/tune.py --task rte --limit 800 --epochs 2 --lr 5e-5,3e-5,2e-5 \
        --batch-size 16 --restarts 2
    nice -n 10 .venv/bin/python bench/tune.py --task conll --mode features --limit 1000 --epochs 2 \
        --space-layers=-1:-1,-2,-3,-4 --combine concat,mean --lr 1e-3,3e-3

Classify tasks: the baseline is `bertheads train` with every default (lr 5e-5, batch size 32,
3 epochs; `--baseline-epochs` to change); the search is the grid `--lr` x `--batch-size` (plus `--combine`,
`--layers`, `--head` for features mode), each trial scored by its best epoch, then
`--restarts` other seeds of the best setting. `--ft-epoch` (features mode) also times one
fine-tuning epoch of the same data for the time-per-trial comparison. Results:
bench/out/tune-NAME.json, the search directory (best model, trials.jsonl) at
bench/out/tune-NAME-search, and a summary on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from common import OUT, environment, require_data, save_json  # noqa: E402

TASKS = {  # name -> (kind, data folder, train file, dev file, main metric)
    "rte": ("classify", ("glue", "RTE"), "train.tsv", "dev.tsv", "accuracy"),
    "mrpc": ("classify", ("glue", "MRPC"), "train.tsv", "dev.tsv", "f1"),
    "sst2": ("classify", ("sst2",), "train.tsv", "dev.tsv", "accuracy"),
    "conll": ("tag", ("conll2003",), "train.txt", "dev.txt", "f1"),
}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def cut(path: Path, limit: int | None, kind: str, work: Path) -> str:
    """The first `limit` records of a dev file (header kept; sentences for CoNLL)."""
    if not limit:
        return str(path)
    text = path.read_text(encoding="utf-8-sig")
    if kind == "tag":
        parts = text.strip().split("\n\n")[:limit]
        out = "\n\n".join(parts) + "\n"
    else:
        lines = text.splitlines(keepends=True)
        out = "".join(lines[: limit + 1])
    target = work / f"dev-{limit}{path.suffix}"
    target.write_text(out, encoding="utf-8")
    return str(target)


def main() -> None:
    import bertheads
    from bertheads.training.tune import TuneSettings, summary, table, tune

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", choices=TASKS, required=True)
    p.add_argument("--limit", type=int, help="first N training examples")
    p.add_argument("--dev-limit", type=int, help="first N dev examples (default: all)")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", default="5e-5,3e-5,2e-5")
    p.add_argument("--batch-size", default="16,32")
    p.add_argument("--restarts", type=int, default=3)
    p.add_argument("--mode", choices=("finetune", "features"), default="finetune")
    p.add_argument("--space-layers", default=None, help="features mode: layer sets separated by ':'")
    p.add_argument("--combine", default=None, help="features mode: combine choices, comma separated")
    p.add_argument("--head", default=None, help="tag: head choices (linear,bilstm)")
    p.add_argument("--no-baseline", action="store_true")
    p.add_argument("--baseline-epochs", type=int, help="epochs of the baseline run (default: train's default)")
    p.add_argument("--ft-epoch", action="store_true", help="also time one fine-tuning epoch")
    p.add_argument("--no-pruning", action="store_true")
    p.add_argument("--trials", type=int, help="Optuna's sampler (TPE) for N trials instead of the whole grid")
    p.add_argument("--name", default=None)
    p.add_argument("--work", help="working folder (default: a new temporary one); keep it to --resume")
    p.add_argument("--resume", action="store_true",
                   help="continue the interrupted run in --work: its baseline and finished trials are kept")
    args = p.parse_args()

    kind, folder, train_name, dev_name, metric = TASKS[args.task]
    data = require_data(*folder)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench-tune-"))
    work.mkdir(parents=True, exist_ok=True)
    train, dev = str(data / train_name), cut(data / dev_name, args.dev_limit, kind, work)
    name = args.name or f"{args.task}-{args.mode}"
    record: dict = {"task": args.task, "args": vars(args), "environment": environment(),
                    "loadavg_start": Path("/proc/loadavg").read_text().split()[:3]}

    space = [f"lr: [{args.lr}]", f"batch_size: [{args.batch_size}]"]
    if args.space_layers:
        space.append("layers: [" + ", ".join(f"'{x}'" for x in args.space_layers.split(":")) + "]")
    if args.combine:
        space.append(f"layer_combine: [{args.combine}]")
    if args.head:
        space.append(f"head: [{args.head}]")
    space_file = work / "space.yaml"
    space_file.write_text("\n".join(space) + "\n")
    options = {"mode": args.mode, "cache_dir": str(work / "cache")}

    done_baseline = work / "baseline" / "metrics.json"
    if args.resume and done_baseline.exists():  # an interrupted run: its baseline is kept
        result = json.loads(done_baseline.read_text())
        record["baseline"] = {"seconds": None, "resumed": True,
                              "dev": {k: v for k, v in result["dev"].items() if isinstance(v, (int, float))},
                              "by_epoch": [h["dev"][kind][metric] for h in result["history"]]}
        log(f"baseline (kept from the interrupted run): {record['baseline']}")
    elif not args.no_baseline:
        epochs = args.baseline_epochs or bertheads.TrainSettings().epochs
        log(f"baseline: train {kind} with the defaults, {epochs} epochs")
        started = time.perf_counter()
        model = bertheads.train(kind, train, dev, work / "baseline", limit=args.limit,
                                settings=bertheads.TrainSettings(epochs=epochs, progress=False), **options)
        result = json.loads((work / "baseline" / "metrics.json").read_text())
        record["baseline"] = {"seconds": time.perf_counter() - started,
                              "dev": {k: v for k, v in result["dev"].items() if isinstance(v, (int, float))},
                              "by_epoch": [h["dev"][kind][metric] for h in result["history"]]}
        del model
        log(f"baseline: {record['baseline']}")

    if args.ft_epoch:
        log("one fine-tuning epoch of the same data")
        started = time.perf_counter()
        bertheads.train(kind, train, dev, work / "ft", limit=args.limit,
                        settings=bertheads.TrainSettings(epochs=1, progress=False))
        record["finetune_epoch_seconds_with_eval"] = time.perf_counter() - started

    log(f"search: {space_file.read_text()!r}, restarts {args.restarts}")
    started = time.perf_counter()
    rows = tune(kind, train, dev, work / "search", limit=args.limit,
                settings=bertheads.TrainSettings(epochs=args.epochs, progress=False),
                search=TuneSettings(space=str(space_file), restarts=args.restarts, pruning=not args.no_pruning,
                                    resume=args.resume, trials=args.trials),
                **options)
    record["search_seconds"] = time.perf_counter() - started
    record["trials"] = rows
    record["table"] = table(rows)
    record["summary"] = summary(rows)
    done = [r["score"] for r in rows if r["state"] == "complete"]
    if done:
        record["spread"] = {"min": min(done), "max": max(done), "median": statistics.median(done)}
    seconds = [r["seconds"] for r in rows if r["seconds"]]
    record["seconds_per_trial_median"] = statistics.median(seconds) if seconds else None
    record["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
    path = save_json(f"tune-{name}", record)
    print(record["table"])
    print(record["summary"])
    print(f"baseline: {record.get('baseline')}")
    print(f"search {record['search_seconds']:.0f} s; loadavg {record['loadavg_start']} -> {record['loadavg_end']}")
    kept = OUT / f"tune-{name}-search"  # the best model, trials.jsonl: `bertheads report` reads it
    shutil.rmtree(kept, ignore_errors=True)
    shutil.move(str(work / "search"), kept)
    print(f"wrote {path} and {kept}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
