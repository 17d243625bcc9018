"""Feature-extraction benchmark (issue 5), default checkpoint, in one run:

- cache build for the full SST-2 train set: time, size, and peak RSS of the building process
  (a child process; also a token-level cache of the same set, whose states are far larger
  than memory would comfortably hold, to show the RSS stays bounded);
- SST-2 dev accuracy: features mode (`-1,-2,-3,-4` concat) on the full train set, and on the
  first `--limit` examples next to fine-tuning on the same `--limit` examples; time per
  training epoch of both on those examples (features mode with the cache already built);
- CoNLL-2003 dev entity F1: features mode (`-1,-2,-3,-4` concat, `--head bilstm`, and the
  linear head) next to fine-tuning, on the same `--conll-limit` sentences; epoch times;
- extraction throughput: `bertheads extract` against `pipeline("feature-extraction")` on the
  same SST-2 texts, and the largest difference between their vectors;
- `--parts pooling` (not in the default): SST-2 dev accuracy in features mode at the training
  defaults (last layer, lr 1e-3, 3 epochs, batch 32, max length 128, seed 42) for each
  `--poolings` value (`cls`: [CLS]; `auto`: the checkpoint's declared pooling, mean for the
  default), on the same `--pooling-limit` training examples, and `--pooling-variants`.

    nice -n 10 .venv/bin/python bench/features.py --limit 300 --conll-limit 200 --memory-limit 2000 \\
        --name features-smoke                                             # quick check
    nice -n 10 .venv/bin/python bench/features.py --threads 1 > bench/out/features.log 2>&1 &

Epoch time is the training loop only (no tokenisation, evaluation or saving): examples /
the loop's examples per second, from each run's metrics history. Results:
bench/out/NAME.json and a Markdown summary on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from common import OUT, environment, median, require_data, save_json  # noqa: E402

LAYERS = "-1,-2,-3,-4"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def head_lines(src: Path, dst: Path, n: int | None) -> Path:
    """The header and the first n rows of a TSV file."""
    lines = src.read_text(encoding="utf-8").splitlines(keepends=True)
    dst.write_text("".join(lines[: n + 1] if n else lines), encoding="utf-8")
    return dst


def first_sentences(src: Path, dst: Path, n: int | None) -> Path:
    """The first n blank-line-separated sentences of a CoNLL file."""
    blocks = [b for b in src.read_text(encoding="utf-8").split("\n\n") if b.strip()]
    dst.write_text("\n\n".join(blocks[:n] if n else blocks) + "\n", encoding="utf-8")
    return dst


def train_run(kind: str, train: Path, dev: Path, out: Path, epochs: int, lr: float, batch_size: int,
              **options) -> dict:
    """Train with bertheads; dev metrics, per-epoch training-loop seconds, wall time."""
    import bertheads

    settings = bertheads.TrainSettings(epochs=epochs, lr=lr, batch_size=batch_size, seed=42, progress=False)
    start = time.perf_counter()
    model = bertheads.train(kind, str(train), str(dev), None, model="default", settings=settings, **options)
    wall = time.perf_counter() - start
    metrics = model.metrics
    task = model.task()
    examples = task.reading.read(str(train))
    n = len(task.modeling.encode(examples, model.net.encoder.tokenizer))  # what the loop counts (windows)
    history = metrics["history"]
    return {"dev": metrics["dev"], "best_epoch": metrics["best_epoch"], "examples": len(examples), "features": n,
            "epoch_seconds": [round(n / h["train_examples_per_second"], 2) for h in history],
            "dev_by_epoch": [h["dev"] for h in history], "wall_seconds": round(wall, 1)}


# -- memory: a child process builds a cache and reports its peak RSS --------------------------
def memory_child(args) -> None:
    """Build the cache for a task's training file, sampling this process's RSS."""
    import threading

    import psutil
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from bertheads.encoder.pretrained import Encoder
    from bertheads.store.features_cache import CacheSettings, encoder_identity, ensure_cache
    from bertheads.tasks.classify.spec import ClassifySpec
    from bertheads.tasks.classify.task import ClassifyTask

    proc = psutil.Process()
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.02)

    encoder = Encoder.load("default")
    spec = ClassifySpec(max_length=128)
    examples = ClassifyTask.prepare(args.child_train, spec, encoder)
    task = ClassifyTask(spec, None)  # (encoding needs no head)
    if args.child_limit:
        examples = examples[: args.child_limit]
    features = task.modeling.encode(examples, encoder.tokenizer)
    layers = tuple(i % (encoder.info.num_layers + 1) for i in (-1, -2, -3, -4))
    settings = CacheSettings(Path(args.child_cache), progress=False)
    from bertheads.store.features_cache import cache_key

    key = cache_key(encoder_identity(encoder), features, layers, args.child_positions, "float16",
                    encoder.info.uses_token_types)
    shutil.rmtree(Path(args.child_cache) / "features" / key, ignore_errors=True)  # measure a build, not a reuse
    baseline = proc.memory_info().rss
    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    start = time.perf_counter()
    directory = ensure_cache(encoder, features, key, layers, args.child_positions, settings,
                             {"model": "default", "train": args.child_train, "task": "classify"})
    seconds = time.perf_counter() - start
    done.set()
    thread.join()
    meta = json.loads((directory / "meta.json").read_text())
    print(json.dumps({"examples": len(features), "positions": args.child_positions, "rows": meta["rows"],
                      "threads": torch.get_num_threads(),
                      "cache_gb": round(meta["bytes"] / 1e9, 3), "build_seconds": round(seconds, 1),
                      "examples_per_second": round(len(features) / seconds, 1),
                      "rss_before_build_mb": round(baseline / 2**20), "peak_rss_during_build_mb": round(peak[0] / 2**20),
                      "directory": str(directory)}))


def memory_run(train: Path, cache: Path, positions: str, limit: int | None, threads: int | None) -> dict:
    cmd = [sys.executable, __file__, "--child", "--child-train", str(train), "--child-cache", str(cache),
           "--child-positions", positions]
    if limit:
        cmd += ["--child-limit", str(limit)]
    if threads:
        cmd += ["--threads", str(threads)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"cache child failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- extraction against the feature-extraction pipeline ---------------------------------------
def last_cls_build(train: Path, tmp: Path, limit: int, repeats: int) -> dict:
    """Cache build of [CLS] of the last layer alone (the classify default, `--layers -1`),
    with that layer run for [CLS] only (ours), with the full last layer (the fast path
    switched off), and with batches one at a time on all threads (the CPU workers switched
    off), rounds alternating; the caches must agree."""
    import numpy as np

    import bertheads.compute.batching as packing
    from bertheads.encoder.pretrained import Encoder
    from bertheads.store.features_cache import CacheSettings, cache_key, encoder_identity, ensure_cache
    from bertheads.tasks.classify.spec import ClassifySpec
    from bertheads.tasks.classify.task import ClassifyTask

    encoder = Encoder.load("default")
    spec = ClassifySpec(max_length=128)
    examples = ClassifyTask.prepare(str(train), spec, encoder)
    task = ClassifyTask(spec, None)  # (encoding needs no head)
    features = task.modeling.encode(examples[:limit], encoder.tokenizer)
    layers = (encoder.info.num_layers,)
    key = cache_key(encoder_identity(encoder), features, layers, "cls", "float32", encoder.info.uses_token_types)
    sides = {"first_token_only": (True, True), "full_last_layer": (False, True), "serial_batches": (True, False)}
    times: dict[str, list[float]] = {side: [] for side in sides}
    states = {}
    workers, ready = packing.cpu_workers, encoder.first_token_ready
    try:
        for _ in range(repeats):
            for side, (fast, parallel) in sides.items():
                root = tmp / f"cls-{side}"
                shutil.rmtree(root, ignore_errors=True)
                encoder.first_token_ready = fast
                packing.cpu_workers = workers if parallel else (lambda device, batches: (1, 1))
                start = time.perf_counter()
                directory = ensure_cache(encoder, features, key, layers, "cls",
                                         CacheSettings(root, dtype="float32", progress=False), {})
                times[side].append(time.perf_counter() - start)
                states[side] = np.load(directory / "states.npy")
    finally:
        encoder.first_token_ready, packing.cpu_workers = ready, workers
    rate = {side: round(len(features) / median(t), 1) for side, t in times.items()}
    return {"examples": len(features), "seconds": times, "examples_per_second": rate,
            "examples_per_second_fast": rate["first_token_only"], "examples_per_second_full": rate["full_last_layer"],
            "speedup": round(rate["first_token_only"] / rate["full_last_layer"], 3),
            "workers_speedup": round(rate["first_token_only"] / rate["serial_batches"], 3),
            "max_abs_difference": max(float(np.abs(states["first_token_only"] - states[side]).max())
                                      for side in ("full_last_layer", "serial_batches"))}


def extract_compare(texts: list[str], tmp: Path, repeats: int) -> dict:
    import numpy as np
    import torch
    from safetensors.numpy import load_file
    from transformers import pipeline

    from bertheads.encoder.pretrained import Encoder, default_model_path
    from bertheads.inference.extract import ExtractSettings, extract

    src = tmp / "texts.txt"
    src.write_text("\n".join(texts) + "\n", encoding="utf-8")
    encoder = Encoder.load("default")
    ours_times = []
    for _ in range(repeats):
        start = time.perf_counter()
        extract("default", str(src), tmp / "ext", ExtractSettings(vector_pool="none", max_length=128, progress=False),
                encoder=encoder)
        ours_times.append(time.perf_counter() - start)
    pipe = pipeline("feature-extraction", model=default_model_path(), device=-1)
    peer_times = []
    for _ in range(repeats):
        start = time.perf_counter()
        with torch.inference_mode():
            peer = pipe(texts, batch_size=64, return_tensors=True, truncation=True, max_length=128)
        peer_times.append(time.perf_counter() - start)
    tokens = load_file(str(tmp / "ext" / "features.safetensors"))["tokens"]
    index = [json.loads(x) for x in (tmp / "ext" / "index.jsonl").read_text().splitlines()]
    # batched pipeline outputs are padded to the batch's longest text: compare the text's rows
    diff = max(float(np.abs(tokens[r["tokens"][0]: r["tokens"][1]]
                            - p[0][: r["tokens"][1] - r["tokens"][0]].numpy()).max()) for r, p in zip(index, peer))
    ours, theirs = median(ours_times), median(peer_times)
    return {"texts": len(texts), "ours_texts_per_second": round(len(texts) / ours, 1),
            "pipeline_texts_per_second": round(len(texts) / theirs, 1), "speedup": round(theirs / ours, 2),
            "max_abs_difference": diff, "repeats": repeats,
            "note": "ours: read file, tokenize, encode, write tokens + offsets + index to disk; "
                    "pipeline: texts in, tensors out (nothing written)"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", default="features")
    p.add_argument("--limit", type=int, default=4000, help="SST-2 examples for the features-vs-fine-tuning side-by-side")
    p.add_argument("--conll-limit", type=int, default=2000, help="CoNLL sentences for the side-by-side")
    p.add_argument("--memory-limit", type=int, default=None, help="SST-2 examples for the cache build (default: all)")
    p.add_argument("--full-epochs", type=int, default=3, help="features-mode epochs on the full SST-2 train set")
    p.add_argument("--conll-full-epochs", type=int, default=3,
                   help="features-mode (bilstm) epochs on the full CoNLL train set (0: skip)")
    p.add_argument("--features-epochs", type=int, default=3)
    p.add_argument("--finetune-epochs", type=int, default=1)
    p.add_argument("--features-lr", type=float, default=1e-3)
    p.add_argument("--finetune-lr", type=float, default=5e-5)
    p.add_argument("--extract-texts", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--parts", default="memory,sst2,conll,extract",
                   help="comma-separated: memory, sst2, conll, extract; also last-cls, lstm-size, pooling "
                        "(not in the default)")
    p.add_argument("--lstm-sizes", default="128,384", help="BiLSTM sizes per direction for --parts lstm-size")
    p.add_argument("--poolings", default="cls,auto", help="--parts pooling: the --pooling values compared")
    p.add_argument("--pooling-limit", type=int, default=None,
                   help="--parts pooling: the first N SST-2 training examples (default: all)")
    p.add_argument("--pooling-variants", default="",
                   help="--parts pooling: also LAYERS@LR runs, ';'-separated, e.g. '-1,-2,-3,-4@3e-3;-1@3e-3'")
    p.add_argument("--cache-dir", default=str(OUT / "feature-cache"))
    p.add_argument("--keep-token-cache", action="store_true")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--child-train", help=argparse.SUPPRESS)
    p.add_argument("--child-cache", help=argparse.SUPPRESS)
    p.add_argument("--child-positions", help=argparse.SUPPRESS)
    p.add_argument("--child-limit", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return memory_child(args)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    parts = set(args.parts.split(","))
    sst2, conll = require_data("sst2"), require_data("conll2003")
    cache = Path(args.cache_dir)
    result: dict = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "environment": environment(),
                    "load_average_at_start": os.getloadavg(), "settings": vars(args)}
    tmp = Path(tempfile.mkdtemp(prefix="bench-features-"))
    try:
        sst2_train = head_lines(sst2 / "train.tsv", tmp / "sst2-train.tsv", args.memory_limit)
        if "memory" in parts:
            log("cache build, full SST-2 train, [CLS] x 4 layers (child process)")
            result["cache_cls"] = memory_run(sst2_train, cache, "cls", None, args.threads)
            log(json.dumps(result["cache_cls"]))
            log("cache build, full SST-2 train, every token x 4 layers (child process)")
            token_cache = tmp / "token-cache"
            result["cache_tokens"] = memory_run(sst2_train, token_cache, "tokens", None, args.threads)
            log(json.dumps(result["cache_tokens"]))
            if not args.keep_token_cache:
                shutil.rmtree(token_cache, ignore_errors=True)
            save_json(args.name, result)
        if "sst2" in parts:
            common = dict(layers=LAYERS, cache_dir=str(cache), max_length=128)
            log(f"SST-2 features mode, full train set, {args.full_epochs} epochs")
            result["sst2_features_full"] = train_run("classify", sst2_train, sst2 / "dev.tsv", tmp / "m",
                                                     args.full_epochs, args.features_lr, 32, mode="features", **common)
            log(json.dumps(result["sst2_features_full"]["dev"]))
            save_json(args.name, result)
            small = head_lines(sst2 / "train.tsv", tmp / "sst2-small.tsv", args.limit)
            log(f"SST-2 features mode, first {args.limit}")
            result["sst2_features"] = train_run("classify", small, sst2 / "dev.tsv", tmp / "m", args.features_epochs,
                                                args.features_lr, 32, mode="features", **common)
            log(f"SST-2 fine-tuning, first {args.limit}")
            result["sst2_finetune"] = train_run("classify", small, sst2 / "dev.tsv", tmp / "m", args.finetune_epochs,
                                                args.finetune_lr, 32, max_length=128)
            result["sst2_epoch_speedup"] = round(median(result["sst2_finetune"]["epoch_seconds"])
                                                 / median(result["sst2_features"]["epoch_seconds"]), 1)
            log(f"SST-2 epoch speed-up {result['sst2_epoch_speedup']}x")
            save_json(args.name, result)
        if "conll" in parts:
            small = first_sentences(conll / "train.txt", tmp / "conll-small.txt", args.conll_limit)
            common = dict(layers=LAYERS, cache_dir=str(cache), max_length=128)
            if args.conll_full_epochs:
                log(f"CoNLL features mode, bilstm head, full train set, {args.conll_full_epochs} epochs")
                result["conll_features_full"] = train_run("tag", conll / "train.txt", conll / "dev.txt", tmp / "m",
                                                          args.conll_full_epochs, args.features_lr, 32,
                                                          mode="features", head_type="bilstm", **common)
                log(json.dumps(result["conll_features_full"]["dev"]["f1"]))
                save_json(args.name, result)
            for head in ("bilstm", "linear"):
                log(f"CoNLL features mode, {head} head, first {args.conll_limit}")
                result[f"conll_features_{head}"] = train_run("tag", small, conll / "dev.txt", tmp / "m",
                                                             args.features_epochs, args.features_lr, 32,
                                                             mode="features", head_type=head, **common)
                log(json.dumps(result[f"conll_features_{head}"]["dev"]["f1"]))
            log(f"CoNLL fine-tuning, first {args.conll_limit}")
            result["conll_finetune"] = train_run("tag", small, conll / "dev.txt", tmp / "m", args.finetune_epochs,
                                                 args.finetune_lr, 32, max_length=128)
            for head in ("bilstm", "linear"):
                result[f"conll_epoch_speedup_{head}"] = round(
                    median(result["conll_finetune"]["epoch_seconds"])
                    / median(result[f"conll_features_{head}"]["epoch_seconds"]), 1)
            save_json(args.name, result)
        if "lstm-size" in parts:
            common = dict(layers=LAYERS, cache_dir=str(cache), max_length=128)
            for size in (int(x) for x in args.lstm_sizes.split(",")):
                log(f"CoNLL features mode, bilstm head of {size} per direction, full train set, "
                    f"{args.conll_full_epochs} epochs")
                run = train_run("tag", conll / "train.txt", conll / "dev.txt", tmp / "m", args.conll_full_epochs,
                                args.features_lr, 32, mode="features", head_type="bilstm", lstm_size=size, **common)
                result.setdefault("lstm_size", {})[str(size)] = run
                log(f"lstm {size}: dev F1 {run['dev']['f1']:.4f}, epoch {median(run['epoch_seconds']):.1f} s")
                save_json(args.name, result)
        if "pooling" in parts:
            pooling_runs(args, sst2, tmp, cache, result)
        if "last-cls" in parts:
            log(f"cache build, [CLS] of the last layer, first {args.limit} SST-2 train sentences: fast path on/off")
            result["last_cls_build"] = last_cls_build(sst2 / "train.tsv", tmp, args.limit, args.repeats)
            log(json.dumps(result["last_cls_build"]))
        if "extract" in parts:
            texts = [line.split("\t")[0] for line in
                     (sst2 / "train.tsv").read_text(encoding="utf-8").splitlines()[1 : args.extract_texts + 1]]
            log(f"extract vs pipeline('feature-extraction'), {len(texts)} SST-2 texts")
            result["extract"] = extract_compare(texts, tmp, args.repeats)
            log(json.dumps(result["extract"]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    path = save_json(args.name, result)
    log(f"wrote {path}")
    print(summary(result))


def pooling_runs(args, sst2: Path, tmp: Path, cache: Path, result: dict) -> None:
    """SST-2 features mode at the training defaults, one run per --pooling value (and per
    variant), on the same training examples: dev accuracy by epoch, the cache build in the wall time."""
    import bertheads
    from bertheads.training.settings import FEATURES_LR

    defaults = bertheads.TrainSettings()
    train = head_lines(sst2 / "train.tsv", tmp / "sst2-pooling.tsv", args.pooling_limit)
    runs = [("defaults", None, FEATURES_LR)]
    for variant in filter(None, args.pooling_variants.split(";")):
        layers, lr = variant.split("@")
        runs.append((f"layers {layers}, lr {lr}", layers, float(lr)))
    out: dict = {"examples": args.pooling_limit or "all", "runs": {}}
    result["pooling"] = out
    for label, layers, lr in runs:
        for pooling in args.poolings.split(","):
            log(f"SST-2 features mode, {label}, --pooling {pooling}")
            extra = {"layers": layers} if layers else {}
            run = train_run("classify", train, sst2 / "dev.tsv", tmp / "m", defaults.epochs, lr, defaults.batch_size,
                            mode="features", pooling=pooling, cache_dir=str(cache), **extra)
            out["runs"][f"{label}, --pooling {pooling}"] = run
            log(f"{label}, --pooling {pooling}: dev accuracy {run['dev']['accuracy']:.4f} "
                f"(by epoch {[round(accuracy(d), 4) for d in run['dev_by_epoch']]}), wall {run['wall_seconds']} s")
            save_json(args.name, result)


def accuracy(dev: dict) -> float:
    """The accuracy of an epoch's dev metrics ({task: metrics})."""
    return next(iter(dev.values()))["accuracy"]


def summary(r: dict) -> str:
    rows = ["| measure | value |", "|---|---|"]
    if "cache_cls" in r:
        for key in ("cache_cls", "cache_tokens"):
            c = r[key]
            rows.append(f"| cache build, {c['examples']} SST-2 train sentences, {c['positions']} x 4 layers fp16 | "
                        f"{c['build_seconds']} s ({c['examples_per_second']} ex/s), {c['cache_gb']} GB, peak RSS "
                        f"{c['peak_rss_during_build_mb']} MB (before build {c['rss_before_build_mb']} MB) |")
    if "sst2_features_full" in r:
        f = r["sst2_features_full"]
        rows.append(f"| SST-2 dev accuracy, features, full train, epochs {len(f['epoch_seconds'])} | "
                    f"{f['dev']['accuracy']:.4f} (epoch {median(f['epoch_seconds']):.1f} s) |")
        a, b = r["sst2_features"], r["sst2_finetune"]
        rows.append(f"| SST-2 dev accuracy, first {a['examples']}: features / fine-tune | "
                    f"{a['dev']['accuracy']:.4f} / {b['dev']['accuracy']:.4f} |")
        rows.append(f"| SST-2 epoch on {a['examples']}: features / fine-tune | {median(a['epoch_seconds']):.1f} s / "
                    f"{median(b['epoch_seconds']):.1f} s = {r['sst2_epoch_speedup']}x |")
    if "conll_features_full" in r:
        f = r["conll_features_full"]
        rows.append(f"| CoNLL dev F1, features (bilstm), full train ({f['examples']}), epochs {len(f['epoch_seconds'])} | "
                    f"{f['dev']['f1']:.4f} (epoch {median(f['epoch_seconds']):.1f} s) |")
    if "conll_finetune" in r:
        b = r["conll_finetune"]
        for head in ("bilstm", "linear"):
            a = r[f"conll_features_{head}"]
            rows.append(f"| CoNLL dev F1, first {a['examples']}: features ({head}) / fine-tune | "
                        f"{a['dev']['f1']:.4f} / {b['dev']['f1']:.4f} |")
            rows.append(f"| CoNLL epoch: features ({head}) / fine-tune | {median(a['epoch_seconds']):.1f} s / "
                        f"{median(b['epoch_seconds']):.1f} s = {r[f'conll_epoch_speedup_{head}']}x |")
    if "last_cls_build" in r:
        c = r["last_cls_build"]
        rows.append(f"| cache build, [CLS] of the last layer, {c['examples']} SST-2 sentences: last layer for [CLS] "
                    f"only / full | {c['examples_per_second_fast']} / {c['examples_per_second_full']} ex/s = "
                    f"{c['speedup']}x (max abs diff {c['max_abs_difference']:.1e}) |")
        rows.append(f"| the same, batches side by side on the cores / one at a time on all threads | "
                    f"{c['examples_per_second_fast']} / {c['examples_per_second']['serial_batches']} ex/s = "
                    f"{c['workers_speedup']}x |")
    for size, run in r.get("lstm_size", {}).items():
        by_epoch = ", ".join(f"{next(iter(d.values()))['f1']:.4f}" for d in run["dev_by_epoch"])  # {task: metrics}
        rows.append(f"| CoNLL dev F1, features (bilstm {size} per direction), full train, epochs "
                    f"{len(run['epoch_seconds'])} | {run['dev']['f1']:.4f} (by epoch {by_epoch}; "
                    f"epoch {median(run['epoch_seconds']):.1f} s) |")
    for label, run in r.get("pooling", {}).get("runs", {}).items():
        by_epoch = ", ".join(f"{accuracy(d):.4f}" for d in run["dev_by_epoch"])
        rows.append(f"| SST-2 dev accuracy, features, {run['examples']} train, {label} | {run['dev']['accuracy']:.4f} "
                    f"(by epoch {by_epoch}; wall {run['wall_seconds']} s) |")
    if "extract" in r:
        e = r["extract"]
        rows.append(f"| extract, {e['texts']} texts: ours / pipeline | {e['ours_texts_per_second']} / "
                    f"{e['pipeline_texts_per_second']} texts/s = {e['speedup']}x (max abs diff {e['max_abs_difference']:.1e}) |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
