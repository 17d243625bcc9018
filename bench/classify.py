"""Sequence classification benchmark (issue 2): bertheads against the Hugging Face Trainer
(training) and `pipeline("text-classification")` (prediction) on SST-2, in one run, with the
same checkpoint, data and hyperparameters; then our dev metrics on MRPC and RTE.

    nice -n 10 .venv/bin/python bench/classify.py --limit 16000
    nice -n 10 .venv/bin/python bench/classify.py                 # full SST-2 epoch

Training throughput is the wall time of the training epoch only (no tokenisation, evaluation
or saving) on both sides. Prediction throughput is end to end (texts in, labels out), the
median of `--repeats`. On a shared machine the sides take turns (see `run_sliced`), and each
side's CPU seconds are recorded too: with `--threads 1` examples per CPU-second measure the
work, whatever else loads the machine. "% of peak" counts the encoder's matrix-multiply FLOPs
(training = 3x forward) per CPU-second over a 1024x1024 fp32 matmul's rate, measured the same way.
Results: bench/out/classify.json; a Markdown summary on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from common import OUT, environment, matmul_peak_gflops, median, require_data, save_json  # noqa: E402

TASKS = {  # name -> (data folder, training epochs for ours)
    "sst2": (("sst2",), 1),
    "mrpc": (("glue", "MRPC"), 3),
    "rte": (("glue", "RTE"), 3),
}


@dataclass
class Hyper:
    epochs: int = 1
    batch_size: int = 32
    lr: float = 5e-5
    max_length: int = 128
    seed: int = 42
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    eval_batch_size: int = 64


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


class Usage:
    """Wall time, this process's CPU time and the load average over a block."""

    def __init__(self) -> None:
        self.wall, self.cpu, self.load = time.perf_counter(), time.process_time(), os.getloadavg()[0]

    def done(self) -> dict:
        wall = time.perf_counter() - self.wall
        return {"wall_s": round(wall, 2), "cpu_s": round(time.process_time() - self.cpu, 2),
                "cores_used": round((time.process_time() - self.cpu) / wall, 2),
                "load_before": round(self.load, 2), "load_after": round(os.getloadavg()[0], 2)}


# -- data ---------------------------------------------------------------------------------
def read_split(path: Path, labels: list | None = None):
    """Texts, pairs and label indices of a GLUE TSV, read with our reader (the same rows
    for both sides); `labels` is the label list (from training when None)."""
    from bertheads.tasks.classify.formats import infer_labels, normalise_label, read_file
    from bertheads.tasks.classify.spec import ClassifySpec

    examples = read_file(str(path), ClassifySpec())
    if labels is None:
        _, labels = infer_labels(examples, str(path), None)
    gold = [labels.index(normalise_label(e.label)) for e in examples]
    pairs = [e.pair for e in examples] if examples[0].pair is not None else None
    return [e.text for e in examples], pairs, gold, labels


# -- FLOP counting ------------------------------------------------------------------------
def encoder_gflop(batch_shapes: list[tuple[int, int]], config, first_token_last: bool = False) -> float:
    """Forward matrix-multiply GFLOPs of the encoder for batches of (rows, padded length).
    `first_token_last`: the last layer runs for [CLS] alone (keys and values still for every
    token), as ours does for a [CLS] head; the count is then what ours actually computes."""
    h, inter, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    total = 0.0
    for rows, length in batch_shapes:
        dense = 2 * rows * length * (4 * h * h + 2 * h * inter)
        attention = 4 * rows * length * length * h
        if first_token_last:
            last = 2 * rows * length * 2 * h * h + 2 * rows * (2 * h * h + 2 * h * inter) + 4 * rows * length * h
            total += (layers - 1) * (dense + attention) + last
        else:
            total += layers * (dense + attention)
    return total / 1e9


def matmul_gflops_per_cpu_second() -> float:
    """fp32 matrix-multiply rate per CPU-second of this process."""
    return matmul_peak_gflops(repeats=9, clock=time.process_time)


def flop_summary(padded: list[tuple[int, int]], lengths: list[int], seconds: float, config,
                 peak: float, factor: int, first_token_last: bool = False) -> dict:
    """Achieved GFLOP/s counting the tokens run (padding included) and the useful ones."""
    run = factor * encoder_gflop(padded, config, first_token_last) / seconds
    useful = factor * encoder_gflop([(1, n) for n in lengths], config, first_token_last) / seconds
    return {"gflops_run": round(run, 1), "gflops_useful": round(useful, 1),
            "peak_share_run": round(run / peak, 3), "peak_share_useful": round(useful / peak, 3),
            "padding_share": round(1 - sum(lengths) / sum(r * n for r, n in padded), 3)}


# -- ours ---------------------------------------------------------------------------------
def run_ours(name: str, folder: Path, hyper: Hyper, limit: int | None, out: Path, model: str | None = None) -> dict:
    """Fine-tune with `bertheads.training.loop`; `epoch_windows` are the (start, end) wall times of
    each training epoch loop (evaluation and saving excluded), `epoch_cpu` its CPU seconds."""
    import importlib

    import bertheads
    from bertheads.encoder.pretrained import default_model_path

    joint, loop = importlib.import_module("bertheads.training.joint"), importlib.import_module("bertheads.training.loop")

    # Epoch boundaries, read off the loop without changing it: `fit` plans each epoch right
    # before its first batch (and once up front to count steps) and evaluates right after
    # its last one.
    marks: dict[str, list[tuple[float, float]]] = {"plan": [], "evaluate": []}

    def marked(key, fn):
        def call(*args, **kwargs):
            marks[key].append((time.time(), time.process_time()))
            return fn(*args, **kwargs)
        return call

    loop.plan_epoch = marked("plan", loop.plan_epoch)
    joint.evaluate_task = marked("evaluate", joint.evaluate_task)  # what `train_tasks` hands `fit`
    settings = bertheads.TrainSettings(epochs=hyper.epochs, batch_size=hyper.batch_size, lr=hyper.lr,
                                       warmup_ratio=hyper.warmup_ratio, weight_decay=hyper.weight_decay,
                                       seed=hyper.seed, eval_batch_size=hyper.eval_batch_size)
    log(f"{name}: ours, {hyper.epochs} epoch(s)")
    usage = Usage()
    bertheads.train("classify", str(folder / "train.tsv"), str(folder / "dev.tsv"), out=out,
                    model=model or default_model_path(), settings=settings, limit=limit, max_length=hyper.max_length)
    metrics = json.loads((out / "metrics.json").read_text())
    history = metrics["history"]
    result = {"epoch_windows": [(a[0], b[0]) for a, b in zip(marks["plan"][1:], marks["evaluate"])],
              "epoch_cpu": [b[1] - a[1] for a, b in zip(marks["plan"][1:], marks["evaluate"])],
              "examples_per_epoch": len(read_split(folder / "train.tsv")[0][: limit or None]),
              "loop_reported_examples_per_second": [h["train_examples_per_second"] for h in history],
              "dev": metrics["dev"], "best_epoch": metrics["best_epoch"],
              "dev_per_epoch": [h["dev"] for h in history], "usage": usage.done()}
    log(f"{name}: ours done, dev {metrics['dev']}")
    return result


def our_padded_batches(lengths: list[int], hyper: Hyper) -> list[tuple[int, int]]:
    """The (rows, padded length) of our first training epoch's batches (our own planner)."""
    from bertheads.training.loop import TaskData, TrainSettings, plan_epoch

    data = [TaskData("x", None, [{"input_ids": [0] * n} for n in lengths])]
    plan = plan_epoch(data, TrainSettings(batch_size=hyper.batch_size, seed=hyper.seed), 0, 0, 1)
    return [(len(idx), max(lengths[i] for i in idx)) for _, idx in plan]


# -- the Hugging Face Trainer -------------------------------------------------------------
def run_trainer(name: str, folder: Path, hyper: Hyper, limit: int | None, out: Path,
                model: str | None = None) -> dict:
    import torch
    import transformers
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from bertheads.encoder.pretrained import default_model_path
    from bertheads.tasks.classify.metrics import label_metrics

    transformers.logging.set_verbosity_error()
    source = model or default_model_path()
    texts, pairs, gold, labels = read_split(folder / "train.tsv")
    if limit:
        texts, gold = texts[:limit], gold[:limit]
        pairs = pairs[:limit] if pairs else None
    dev_texts, dev_pairs, dev_gold, _ = read_split(folder / "dev.tsv", labels)
    tokenizer = AutoTokenizer.from_pretrained(source)

    def dataset(t, p, y):
        enc = tokenizer(t, p, truncation=True, max_length=hyper.max_length)
        return [{**{k: enc[k][i] for k in enc}, "labels": y[i]} for i in range(len(t))]

    train_set, dev_set = dataset(texts, pairs, gold), dataset(dev_texts, dev_pairs, dev_gold)
    torch.manual_seed(hyper.seed)
    model = AutoModelForSequenceClassification.from_pretrained(
        source, num_labels=len(labels), id2label={i: str(v) for i, v in enumerate(labels)},
        label2id={str(v): i for i, v in enumerate(labels)})
    shapes: list[tuple[int, int]] = []  # (rows, padded length) of every batch the collator pads

    class CountingCollator(DataCollatorWithPadding):
        def __call__(self, features):
            batch = super().__call__(features)
            shapes.append(tuple(batch["input_ids"].shape))
            return batch

    class EpochClock(TrainerCallback):
        def __init__(self):
            self.windows, self.cpu = [], []

        def on_epoch_begin(self, args, state, control, **kwargs):
            self.start, self.start_cpu = time.time(), time.process_time()

        def on_epoch_end(self, args, state, control, **kwargs):
            self.windows.append((self.start, time.time()))
            self.cpu.append(time.process_time() - self.start_cpu)

    args = TrainingArguments(
        output_dir=str(out / "checkpoints"), num_train_epochs=hyper.epochs,
        per_device_train_batch_size=hyper.batch_size, per_device_eval_batch_size=hyper.eval_batch_size,
        learning_rate=hyper.lr, warmup_steps=hyper.warmup_ratio, weight_decay=hyper.weight_decay,
        lr_scheduler_type="linear", max_grad_norm=1.0, seed=hyper.seed, eval_strategy="no",
        save_strategy="no", logging_strategy="no", report_to="none", use_cpu=True,
        dataloader_num_workers=0, disable_tqdm=False)
    clock = EpochClock()
    trainer = Trainer(model=model, args=args, train_dataset=train_set, data_collator=CountingCollator(tokenizer),
                      processing_class=tokenizer, callbacks=[clock])
    log(f"{name}: Trainer, {hyper.epochs} epoch(s), {torch.get_num_threads()} threads, optim {args.optim}")
    usage = Usage()
    output = trainer.train()
    train_usage = usage.done()
    train_shapes = list(shapes)
    prediction = trainer.predict(dev_set)
    dev = label_metrics(prediction.predictions.argmax(-1), np.asarray(dev_gold), len(labels))
    trainer.save_model(str(out / "model"))
    result = {"epoch_windows": clock.windows, "epoch_cpu": clock.cpu, "examples_per_epoch": len(train_set),
              "trainer_reported_samples_per_second": output.metrics.get("train_samples_per_second"),
              "dev": dev, "usage": train_usage, "threads": torch.get_num_threads(), "optim": str(args.optim),
              "batch_shapes": train_shapes[: len(train_shapes) // hyper.epochs],
              "lengths": [len(x["input_ids"]) for x in train_set]}
    log(f"{name}: Trainer done, dev {dev}")
    return result


# -- time slicing -------------------------------------------------------------------------
def run_sliced(commands: dict[str, list[str]], slice_s: float) -> dict[str, list[tuple[float, float]]]:
    """Run the commands as processes that take turns: one runs for `slice_s` seconds while the
    others are stopped (SIGSTOP/SIGCONT), so every side sees the same share of whatever else
    loads this shared machine. Returns each side's running intervals (wall clock)."""
    procs = {name: subprocess.Popen(cmd) for name, cmd in commands.items()}
    running: dict[str, list[tuple[float, float]]] = {name: [] for name in procs}
    turn = 0
    try:
        for p in procs.values():
            os.kill(p.pid, signal.SIGSTOP)
        while True:
            alive = [n for n, p in procs.items() if p.poll() is None]
            if not alive:
                break
            name = alive[turn % len(alive)]
            turn += 1
            start = time.time()
            os.kill(procs[name].pid, signal.SIGCONT)
            try:
                procs[name].wait(timeout=None if len(alive) == 1 else slice_s)
            except subprocess.TimeoutExpired:
                os.kill(procs[name].pid, signal.SIGSTOP)
            running[name].append((start, time.time()))
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.terminate()
                p.wait()
    failed = [n for n, p in procs.items() if p.returncode != 0]
    if failed:
        raise SystemExit(f"benchmark side(s) failed: {', '.join(failed)}")
    return running


def active_seconds(window: tuple[float, float], running: list[tuple[float, float]]) -> float:
    """How long a side actually ran during `window` (its stopped turns left out)."""
    start, end = window
    return sum(max(0.0, min(end, b) - max(start, a)) for a, b in running)


def throughput(result: dict, running: list[tuple[float, float]]) -> None:
    """Add examples/s per epoch (and their median) computed on running time only."""
    active = [active_seconds(w, running) for w in result["epoch_windows"]]
    result["epoch_active_seconds"] = [round(a, 2) for a in active]
    result["epoch_wall_seconds"] = [round(b - a, 2) for a, b in result["epoch_windows"]]
    result["per_epoch_examples_per_second"] = [round(result["examples_per_epoch"] / a, 2) for a in active]
    result["train_examples_per_second"] = median(result["per_epoch_examples_per_second"])
    # CPU seconds of the process over the epoch: the work done, whatever else runs on the
    # machine (a fair measure with --threads 1; with more threads idle threads may spin).
    result["train_examples_per_cpu_second"] = median([round(result["examples_per_epoch"] / c, 2)
                                                      for c in result["epoch_cpu"]])


# -- prediction ---------------------------------------------------------------------------
def ours_as_transformers(ours_dir: Path, dest: Path) -> Path:
    """Our saved classify model as a `BertForSequenceClassification` directory: the same
    encoder, the head's pooler as `bert.pooler`, its output layer as `classifier`."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    manifest = json.loads((ours_dir / "bertheads.json").read_text())
    (name, entry), = manifest["heads"].items()
    labels = entry["spec"]["labels"]
    hf = AutoModelForSequenceClassification.from_pretrained(
        str(ours_dir / "encoder"), num_labels=len(labels), id2label={i: str(v) for i, v in enumerate(labels)},
        label2id={str(v): i for i, v in enumerate(labels)})
    head = load_file(str(ours_dir / "heads" / f"{name}.safetensors"))
    with torch.no_grad():
        hf.bert.pooler.dense.weight.copy_(head["pooler.weight"])
        hf.bert.pooler.dense.bias.copy_(head["pooler.bias"])
        hf.classifier.weight.copy_(head["out.weight"])
        hf.classifier.bias.copy_(head["out.bias"])
    hf.save_pretrained(str(dest))
    AutoTokenizer.from_pretrained(str(ours_dir / "encoder")).save_pretrained(str(dest))
    return dest


def bench_prediction(ours_dir: Path, trainer_dir: Path, folder: Path, repeats: int, peak: float, work: Path) -> dict:
    """Dev sentences through our `predict` and through the pipeline (on the Trainer's model and
    on ours converted). The pipeline runs at batch size 32 (the issue's setting); ours with its
    own defaults (length-sorted batches of at most 64 texts and 2048 tokens). The repeats of the three alternate, so load from
    elsewhere on the machine falls on all of them alike."""
    from transformers import AutoConfig, AutoTokenizer, pipeline

    import bertheads
    from bertheads.compute.batching import INFERENCE_BATCH, INFERENCE_TOKENS, sorted_batches

    model = bertheads.load(ours_dir)
    labels = model.task().spec.labels
    texts, _, gold, _ = read_split(folder / "dev.tsv", labels)
    gold_names = [str(labels[g]) for g in gold]
    config = AutoConfig.from_pretrained(str(ours_dir / "encoder"))
    lengths = [len(x) for x in AutoTokenizer.from_pretrained(str(ours_dir / "encoder"))(
        texts, truncation=True, max_length=128)["input_ids"]]
    batch = 32

    def ours(inputs):  # our own batching (length-sorted, token-budgeted), as a user gets it
        return [str(p["label"]) for p in model.predict(inputs)]

    def through(pipe):
        return lambda inputs: [p["label"] for p in pipe(inputs, batch_size=batch, truncation=True, max_length=128)]

    runners = {"ours": ours,
               "pipeline_trainer_model": through(pipeline("text-classification", model=str(trainer_dir),
                                                          device="cpu")),
               "pipeline_our_model": through(pipeline("text-classification", device="cpu", model=str(
                   ours_as_transformers(ours_dir, work / "ours-as-transformers"))))}
    for run in runners.values():  # warm-up
        run(texts[:64])
    times: dict[str, list[float]] = {k: [] for k in runners}
    cpu: dict[str, list[float]] = {k: [] for k in runners}
    predicted: dict[str, list[str]] = {}
    for r in range(repeats):
        for key, run in runners.items():
            log(f"prediction: {key}, repeat {r + 1}/{repeats}")
            start, start_cpu = time.perf_counter(), time.process_time()
            predicted[key] = run(texts)
            times[key].append(round(time.perf_counter() - start, 3))
            cpu[key].append(round(time.process_time() - start_cpu, 3))
    ours_shapes = [(len(b), lengths[b[0]]) for b in sorted_batches(lengths, INFERENCE_BATCH, INFERENCE_TOKENS)]
    in_order = [(len(lengths[i:i + batch]), max(lengths[i:i + batch])) for i in range(0, len(lengths), batch)]
    result = {"sentences": len(texts), "pipeline_batch_size": batch, "ours_batching": {
        "max_texts": INFERENCE_BATCH, "max_tokens": INFERENCE_TOKENS}, "repeats": repeats}
    for key in runners:
        result[key] = {"seconds": times[key], "sentences_per_second": round(len(texts) / median(times[key]), 2),
                       "cpu_seconds": cpu[key],
                       "sentences_per_cpu_second": round(len(texts) / median(cpu[key]), 2),
                       "accuracy": float(np.mean([a == b for a, b in zip(predicted[key], gold_names)])),
                       "label_agreement_with_ours": float(np.mean([a == b for a, b in
                                                                   zip(predicted[key], predicted["ours"])])),
                       **flop_summary(ours_shapes if key == "ours" else in_order, lengths, median(cpu[key]),
                                      config, peak, 1, first_token_last=key == "ours")}
    return result


# -- the run ------------------------------------------------------------------------------
def summary(results: dict) -> str:
    """Markdown lines for bench/RESULTS.md."""
    lines = []

    def row(label, ours, peer, unit="", target=""):
        ratio = f"{ours / peer:.2f}x" if peer else ""
        return f"| {label} | {ours:.1f}{unit} | {peer:.1f}{unit} | {ratio} | {target} |"

    sst = results["tasks"].get("sst2")
    if sst and "trainer" in sst:
        o, t = sst["ours"], sst["trainer"]
        lines += [
            "| SST-2 | ours | Hugging Face | ratio / difference | target |",
            "|---|---|---|---|---|",
            row("training examples/s (running time)", o["train_examples_per_second"],
                t["train_examples_per_second"], target=">= 1.5x"),
            row("training examples per CPU-second", o["train_examples_per_cpu_second"],
                t["train_examples_per_cpu_second"]),
            f"| dev accuracy | {100 * o['dev']['accuracy']:.2f} | {100 * t['dev']['accuracy']:.2f} "
            f"| {100 * (o['dev']['accuracy'] - t['dev']['accuracy']):+.2f} points | >= -0.3 |",
            f"| training, % of matmul rate (useful / incl. padding) | {100 * o['flops']['peak_share_useful']:.0f} / "
            f"{100 * o['flops']['peak_share_run']:.0f} | {100 * t['flops']['peak_share_useful']:.0f} / "
            f"{100 * t['flops']['peak_share_run']:.0f} | | |",
        ]
    pred = sst.get("prediction") if sst else None
    if pred:
        o, p, q = pred["ours"], pred["pipeline_trainer_model"], pred["pipeline_our_model"]
        lines += [
            row("prediction sentences/s (pipeline on the Trainer's model)", o["sentences_per_second"],
                p["sentences_per_second"], target=">= 2x"),
            row("prediction sentences per CPU-second (same)", o["sentences_per_cpu_second"],
                p["sentences_per_cpu_second"]),
            row("prediction sentences/s (pipeline on our model, converted)", o["sentences_per_second"],
                q["sentences_per_second"]),
            f"| prediction, % of matmul rate (useful) | {100 * o['peak_share_useful']:.0f} | "
            f"{100 * p['peak_share_useful']:.0f} | | |",
            f"| dev accuracy of the predicted labels | {100 * o['accuracy']:.2f} | {100 * p['accuracy']:.2f} | | |",
            f"| label agreement, pipeline on our converted model vs ours | | "
            f"{100 * q['label_agreement_with_ours']:.2f}% | | 100% |",
        ]
    if results["tasks"]:
        lines += ["", "| task | train examples | epochs | ours dev accuracy | F1 | MCC | ours ex/s "
                      "| Trainer dev accuracy | Trainer ex/s |", "|---|---|---|---|---|---|---|---|---|"]
        for n, r in results["tasks"].items():
            o, t = r["ours"], r.get("trainer")
            lines.append(f"| {n} | {r['train_examples']} | {r['epochs']} | {100 * o['dev']['accuracy']:.2f} | "
                         f"{100 * o['dev']['f1']:.2f} | {o['dev']['mcc']:.3f} | {o['train_examples_per_second']:.1f} | "
                         + (f"{100 * t['dev']['accuracy']:.2f} | {t['train_examples_per_second']:.1f} |" if t
                            else "| |"))
    return "\n".join(lines)


def side_command(args, side: str, task: str, epochs: int, result: Path) -> list[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--side", side, "--tasks", task,
           "--pair-epochs", str(epochs), "--side-result", str(result), "--name", args.name]
    if args.limit:
        cmd += ["--limit", str(args.limit)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    return cmd


def run_side(args) -> int:
    """One side of a comparison, in its own process (started by `main`)."""
    parts, epochs = TASKS[args.tasks]
    hyper = Hyper(epochs=epochs if args.tasks == "sst2" else args.pair_epochs)
    work = OUT / args.name / f"{args.tasks}-{args.side}"
    run = run_ours if args.side == "ours" else run_trainer
    result = run(args.tasks, require_data(*parts), hyper, args.limit, work)
    Path(args.side_result).write_text(json.dumps(result) + "\n")
    return 0


def compare_task(args, name: str, work: Path, peak: float) -> dict:
    """Train ours (and the Trainer) on one task, taking turns on the CPU; then predict."""
    from transformers import AutoConfig

    parts, epochs = TASKS[name]
    folder = require_data(*parts)
    hyper = Hyper(epochs=epochs if name == "sst2" else args.pair_epochs)
    sides = ["ours"] + (["trainer"] if not args.no_trainer and (name == "sst2" or args.trainer_pairs) else [])
    files = {side: work / f"{name}-{side}.json" for side in sides}
    running = run_sliced({side: side_command(args, side, name, hyper.epochs, files[side]) for side in sides},
                         args.slice)
    entry = {"epochs": hyper.epochs, "hyper": vars(hyper)}
    for side in sides:
        entry[side] = json.loads(files[side].read_text())
        throughput(entry[side], running[side])
        log(f"{name}: {side} {entry[side]['train_examples_per_second']:.1f} ex/s (running time), "
            f"dev accuracy {entry[side]['dev']['accuracy']:.4f}")
    entry["train_examples"] = entry["ours"]["examples_per_epoch"]
    if "trainer" in entry:
        t, o = entry["trainer"], entry["ours"]
        config = AutoConfig.from_pretrained(str(work / f"{name}-ours" / "encoder"))
        lengths = t.pop("lengths")
        t["flops"] = flop_summary(t.pop("batch_shapes"), lengths,
                                  len(lengths) / t["train_examples_per_cpu_second"], config, peak, 3)
        o["flops"] = flop_summary(our_padded_batches(lengths, hyper), lengths,
                                  len(lengths) / o["train_examples_per_cpu_second"], config, peak, 3,
                                  first_token_last=True)
        if name == "sst2":
            entry["prediction"] = bench_prediction(work / f"{name}-ours", work / f"{name}-trainer" / "model",
                                                   folder, args.repeats, peak, work)
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, help="first N training examples of each task (both sides)")
    parser.add_argument("--tasks", default="sst2,mrpc,rte", help="comma-separated: sst2, mrpc, rte")
    parser.add_argument("--repeats", type=int, default=3, help="timed prediction repeats (median)")
    parser.add_argument("--pair-epochs", type=int, default=3, help="epochs for MRPC and RTE")
    parser.add_argument("--trainer-pairs", action="store_true", help="also run the Trainer on MRPC and RTE")
    parser.add_argument("--no-trainer", action="store_true", help="ours only (no Trainer, no pipeline)")
    parser.add_argument("--threads", type=int, help="torch threads for every side (default: torch's)")
    parser.add_argument("--slice", type=float, default=5.0, help="seconds per turn when sides alternate")
    parser.add_argument("--name", default="classify", help="results in bench/out/NAME.json and NAME/")
    parser.add_argument("--predict-again", metavar="RUN",
                        help="no training: copy bench/out/RUN.json to NAME.json with SST-2 prediction "
                             "timed again on RUN's two trained models (after a change to prediction)")
    parser.add_argument("--side", choices=("ours", "trainer"), help=argparse.SUPPRESS)
    parser.add_argument("--side-result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.side:
        return run_side(args)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped sides are resumed and ended
    names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    for n in names:
        if n not in TASKS:
            parser.error(f"--tasks: unknown task {n!r} (known: {', '.join(TASKS)})")
    work = OUT / args.name
    work.mkdir(parents=True, exist_ok=True)
    peak = matmul_gflops_per_cpu_second()
    results = {"command": " ".join(sys.argv), "limit": args.limit, "environment": environment(),
               "matmul_peak_gflops": round(matmul_peak_gflops(), 1),
               "matmul_gflops_per_cpu_second": round(peak, 1), "tasks": {}}
    log(f"environment {results['environment']}, fp32 matmul {results['matmul_peak_gflops']:.0f} GFLOP/s "
        f"({peak:.0f} per CPU-second), load {os.getloadavg()}")
    if args.predict_again:
        before = json.loads((OUT / f"{args.predict_again}.json").read_text())
        results["tasks"] = before["tasks"]
        results["training_from"] = {"run": args.predict_again, "command": before["command"]}
        done = OUT / args.predict_again
        results["tasks"]["sst2"]["prediction"] = bench_prediction(
            done / "sst2-ours", done / "sst2-trainer" / "model", require_data(*TASKS["sst2"][0]), args.repeats,
            peak, work)
    else:
        for n in names:
            results["tasks"][n] = compare_task(args, n, work, peak)
            save_json(args.name, results)
    results["matmul_gflops_per_cpu_second_end"] = round(matmul_gflops_per_cpu_second(), 1)
    path = save_json(args.name, results)
    print("\n" + summary(results) + f"\n\n(results: {path})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
