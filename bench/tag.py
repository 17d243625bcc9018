"""Token tagging benchmark (issue 3): bertheads against the Hugging Face Trainer (training,
first-sub-word labels) and `pipeline("token-classification", aggregation_strategy="simple")`
(prediction on raw text) on CoNLL-2003, in one run, with the same checkpoint, data and
hyperparameters (batch 32, lr 5e-5, warm-up 10%, weight decay 0.01, max length 128, seed 42).

    nice -n 10 .venv/bin/python bench/tag.py --limit 500            # quick check
    nice -n 10 .venv/bin/python bench/tag.py                        # full, 1 epoch
    nice -n 10 .venv/bin/python bench/tag.py --epochs 3 --only ours # our 3-epoch F1

Dev F1 is entity-level, seqeval's default mode (conlleval rules), on both sides, from each
word's first piece. Training throughput is examples per second of the training loop only
(no tokenisation, evaluation or saving): once over the full epochs (which run minutes apart, so
machine load can differ), and, for the headline ratio, in `--speed-rounds` interleaved rounds
(ours, then the Trainer, one epoch over the same `--speed-sentences` random training sentences;
median of the per-round ratios). Prediction throughput is end to end on raw dev sentences (the
words joined by spaces): texts in, entities out, ours and the pipeline alternating, median of
`--repeats`.
Results: bench/out/NAME.json and a Markdown summary on stdout.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from common import OUT, environment, matmul_peak_gflops, median, require_data, save_json  # noqa: E402

HYPER = {"batch_size": 32, "lr": 5e-5, "max_length": 128, "seed": 42, "warmup_ratio": 0.1, "weight_decay": 0.01}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def read_conll(path: Path, limit: int | None = None) -> list[tuple[list[str], list[str]]]:
    """(words, tags) per sentence: the word is the first column, the tag the last."""
    sentences, words, tags = [], [], []
    for line in path.read_text(encoding="utf-8").split("\n"):
        parts = line.split()
        if not parts or parts[0] == "-DOCSTART-":
            if words:
                sentences.append((words, tags))
                words, tags = [], []
            continue
        words.append(parts[0])
        tags.append(parts[-1])
    if words:
        sentences.append((words, tags))
    return sentences[:limit] if limit else sentences


def write_conll(path: Path, sentences) -> None:
    path.write_text("\n\n".join("\n".join(f"{w} {t}" for w, t in zip(ws, ts)) for ws, ts in sentences) + "\n")


# -- ours -----------------------------------------------------------------------------------
def run_ours(train_file: Path, dev_file: Path, out: Path, epochs: int, model: str = "default") -> dict:
    import json

    import bertheads

    settings = bertheads.TrainSettings(epochs=epochs, batch_size=HYPER["batch_size"], lr=HYPER["lr"],
                                       seed=HYPER["seed"], warmup_ratio=HYPER["warmup_ratio"],
                                       weight_decay=HYPER["weight_decay"], progress=False)
    start = time.perf_counter()
    bertheads.train("tag", str(train_file), str(dev_file), out, model=model, settings=settings,
                    max_length=HYPER["max_length"])
    wall = time.perf_counter() - start
    metrics = json.loads((out / "metrics.json").read_text())
    history = metrics["history"]
    return {"dev_f1": metrics["dev"]["f1"], "dev_precision": metrics["dev"]["precision"],
            "dev_recall": metrics["dev"]["recall"], "dev_accuracy": metrics["dev"]["accuracy"],
            "per_type_f1": {k: v["f1"] for k, v in metrics["dev"]["per_type"].items()},
            "best_epoch": metrics["best_epoch"], "f1_by_epoch": [h["dev"]["tag"]["f1"] for h in history],
            "train_examples_per_second": median([h["train_examples_per_second"] for h in history]),
            "train_call_wall_s": round(wall, 1)}


# -- Hugging Face Trainer ---------------------------------------------------------------------
def first_piece_labels(enc, index: int, tags: list[str], label2id: dict) -> list[int]:
    """The usual run_ner labelling: a word's first piece carries its label, the rest -100."""
    labels, previous = [], None
    for word in enc.word_ids(index):
        labels.append(-100 if word is None or word == previous else label2id[tags[word]])
        previous = word
    return labels


def first_piece_tags(sentences, enc, logits, labels: list[str]) -> list[list[str]]:
    """Each word's tag from its first piece's logits (words cut off by truncation stay O)."""
    pred = []
    for i, (words, _) in enumerate(sentences):
        tags, previous = ["O"] * len(words), None
        for j, word in enumerate(enc.word_ids(i)):
            if word is not None and word != previous:
                tags[word] = labels[int(np.argmax(logits[i][j]))]
            previous = word
        pred.append(tags)
    return pred


def encode_for_trainer(tokenizer, sentences, label2id: dict):
    """Tokenized rows (truncated at max length) with first-piece labels, and the encoding."""
    enc = tokenizer([w for w, _ in sentences], is_split_into_words=True, truncation=True,
                    max_length=HYPER["max_length"])
    rows = []
    for i, (_, tags) in enumerate(sentences):
        rows.append({**{k: enc[k][i] for k in ("input_ids", "token_type_ids", "attention_mask") if k in enc},
                     "labels": first_piece_labels(enc, i, tags, label2id)})
    return rows, enc


def make_trainer(rows, labels: list[str], model_dir: str, out: Path, epochs: int):
    """AutoModelForTokenClassification from the checkpoint and a Trainer with our hyperparameters."""
    import torch
    from transformers import (
        AutoModelForTokenClassification,
        AutoTokenizer,
        DataCollatorForTokenClassification,
        Trainer,
        TrainingArguments,
    )
    from transformers import logging as hf_logging

    hf_logging.set_verbosity_error()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    torch.manual_seed(HYPER["seed"])
    model = AutoModelForTokenClassification.from_pretrained(
        model_dir, num_labels=len(labels), id2label=dict(enumerate(labels)), label2id={t: i for i, t in enumerate(labels)})
    args = TrainingArguments(
        output_dir=str(out / "trainer-tmp"), num_train_epochs=epochs,
        per_device_train_batch_size=HYPER["batch_size"], per_device_eval_batch_size=64,
        learning_rate=HYPER["lr"], weight_decay=HYPER["weight_decay"], warmup_steps=HYPER["warmup_ratio"],
        seed=HYPER["seed"], data_seed=HYPER["seed"], eval_strategy="no", save_strategy="no",
        logging_strategy="no", report_to="none", disable_tqdm=True, use_cpu=True, dataloader_num_workers=0)
    return Trainer(model=model, args=args, train_dataset=rows, processing_class=tokenizer,
                   data_collator=DataCollatorForTokenClassification(tokenizer))


def run_trainer(train, dev, labels: list[str], model_dir: str, out: Path, epochs: int) -> dict:
    from transformers import AutoTokenizer

    from bertheads.tasks.tag.scheme import entity_metrics

    label2id = {t: i for i, t in enumerate(labels)}
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    train_rows, _ = encode_for_trainer(tokenizer, train, label2id)
    dev_rows, dev_enc = encode_for_trainer(tokenizer, dev, label2id)
    trainer = make_trainer(train_rows, labels, model_dir, out, epochs)
    start = time.perf_counter()
    result = trainer.train()
    train_wall = time.perf_counter() - start
    logits = trainer.predict(dev_rows).predictions
    pred = first_piece_tags(dev, dev_enc, logits, labels)
    metrics = entity_metrics([t for _, t in dev], pred)
    saved = out / "tag-hf-model"
    trainer.save_model(str(saved))
    return {"dev_f1": metrics["f1"], "dev_precision": metrics["precision"], "dev_recall": metrics["recall"],
            "dev_accuracy": metrics["accuracy"], "per_type_f1": {k: v["f1"] for k, v in metrics["per_type"].items()},
            "train_examples_per_second": result.metrics["train_samples_per_second"],
            "train_loop_wall_s": round(train_wall, 1), "model_dir": str(saved)}


# -- training speed, interleaved ------------------------------------------------------------
def training_speed(train, labels: list[str], model_dir: str, out: Path, sentences: int, rounds: int) -> dict:
    """Examples/s of one epoch over the same random `sentences` training sentences, ours then
    the Trainer's, repeated `rounds` times: the two sides see the same machine load."""
    import random

    from transformers import AutoTokenizer

    import bertheads

    subset = random.Random(HYPER["seed"]).sample(train, min(sentences, len(train)))
    path = out / "speed-train.txt"
    write_conll(path, subset)
    rows, _ = encode_for_trainer(AutoTokenizer.from_pretrained(model_dir), subset,
                                 {t: i for i, t in enumerate(labels)})
    settings = bertheads.TrainSettings(epochs=1, batch_size=HYPER["batch_size"], lr=HYPER["lr"], seed=HYPER["seed"],
                                       warmup_ratio=HYPER["warmup_ratio"], weight_decay=HYPER["weight_decay"],
                                       progress=False)
    ours, peer, loads = [], [], []
    for r in range(rounds):
        loads.append(round(os.getloadavg()[0], 2))
        model = bertheads.train("tag", str(path), None, None, model="default", settings=settings,
                                max_length=HYPER["max_length"])
        ours.append(model.metrics["history"][0]["train_examples_per_second"])
        del model
        peer.append(make_trainer(rows, labels, model_dir, out, 1).train().metrics["train_samples_per_second"])
        log(f"  speed round {r + 1}: ours {ours[-1]:.1f} ex/s, Trainer {peer[-1]:.1f} ex/s")
    ratios = [a / b for a, b in zip(ours, peer)]
    return {"sentences": len(subset), "ours_examples_per_second": ours, "trainer_examples_per_second": peer,
            "ratio_median": round(median(ratios), 2), "ours_median": median(ours), "trainer_median": median(peer),
            "load_average_per_round": loads}


# -- prediction speed --------------------------------------------------------------------------
def time_prediction(ours_dir: Path, hf_dir: str | None, texts: list[str], repeats: int) -> dict:
    import bertheads

    model = bertheads.load(ours_dir)
    model.predict(texts[:64])  # warm-up
    pipe = None
    if hf_dir:
        from transformers import pipeline

        pipe = pipeline("token-classification", model=hf_dir, aggregation_strategy="simple", device="cpu")
        pipe(texts[:16])
    ours_s, pipe_s, ours_entities, pipe_entities = [], [], 0, 0
    for r in range(repeats):
        start = time.perf_counter()
        out = model.predict(texts)
        ours_s.append(time.perf_counter() - start)
        ours_entities = sum(len(o["entities"]) for o in out)
        log(f"  ours predict round {r + 1}: {len(texts) / ours_s[-1]:.1f} sentences/s")
        if pipe is not None:
            start = time.perf_counter()
            found = pipe(texts)
            pipe_s.append(time.perf_counter() - start)
            pipe_entities = sum(len(f) for f in found)
            log(f"  pipeline round {r + 1}: {len(texts) / pipe_s[-1]:.1f} sentences/s")
    result = {"sentences": len(texts), "ours_sentences_per_second": len(texts) / median(ours_s),
              "ours_seconds": [round(s, 2) for s in ours_s], "ours_entities": ours_entities}
    if pipe_s:
        result.update({"pipeline_sentences_per_second": len(texts) / median(pipe_s),
                       "pipeline_seconds": [round(s, 2) for s in pipe_s], "pipeline_entities": pipe_entities})
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, help="first N training sentences")
    parser.add_argument("--dev-limit", type=int, help="first N dev sentences")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="prediction timing rounds")
    parser.add_argument("--speed-rounds", type=int, default=3, help="interleaved training-speed rounds (0: none)")
    parser.add_argument("--speed-sentences", type=int, default=1600, help="training sentences a speed round")
    parser.add_argument("--only", choices=("all", "ours"), default="all", help="'ours': skip the Trainer and pipeline")
    parser.add_argument("--name", default=None, help="result name under bench/out (default tag[-limitN][-eE])")
    args = parser.parse_args()
    name = args.name or "tag" + (f"-limit{args.limit}" if args.limit else "") + (
        f"-e{args.epochs}" if args.epochs != 1 else "") + ("-ours" if args.only == "ours" else "")

    from bertheads.encoder.pretrained import default_model_path
    from bertheads.tasks.tag.scheme import tag_list

    data = require_data("conll2003")
    train = read_conll(data / "train.txt", args.limit)
    dev = read_conll(data / "dev.txt", args.dev_limit)
    labels = tag_list([type("S", (), {"tags": t})() for _, t in train], with_inside=False)
    out = OUT / name
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="tag-bench-"))
    train_file, dev_file = tmp / "train.txt", tmp / "dev.txt"
    write_conll(train_file, train)
    write_conll(dev_file, dev)
    results = {"command": " ".join(["bench/tag.py", *sys.argv[1:]]), "environment": environment(),
               "matmul_peak_gflops": round(matmul_peak_gflops(), 1), "train_sentences": len(train),
               "dev_sentences": len(dev), "epochs": args.epochs, "hyperparameters": HYPER,
               "load_average_start": os.getloadavg()}
    log(f"{len(train)} training / {len(dev)} dev sentences, {args.epochs} epoch(s), tags {labels}")

    log("ours: training")
    results["ours"] = run_ours(train_file, dev_file, out / "tag-ours-model", args.epochs)
    log(f"ours: dev F1 {results['ours']['dev_f1']:.4f}, {results['ours']['train_examples_per_second']:.1f} ex/s")
    hf_dir = None
    if args.only == "all":
        log("Trainer: training")
        results["trainer"] = run_trainer(train, dev, labels, default_model_path(), out, args.epochs)
        hf_dir = results["trainer"]["model_dir"]
        log(f"Trainer: dev F1 {results['trainer']['dev_f1']:.4f}, "
            f"{results['trainer']['train_examples_per_second']:.1f} ex/s")
    if args.only == "all" and args.speed_rounds:
        log(f"training speed: {args.speed_rounds} interleaved rounds of {args.speed_sentences} sentences")
        results["train_speed"] = training_speed(train, labels, default_model_path(), out, args.speed_sentences,
                                                args.speed_rounds)
    log("prediction on raw dev text")
    texts = [" ".join(words) for words, _ in dev]
    results["predict"] = time_prediction(out / "tag-ours-model", hf_dir, texts, args.repeats)
    results["load_average_end"] = os.getloadavg()
    if "trainer" in results:
        o, t, p = results["ours"], results["trainer"], results["predict"]
        results["comparison"] = {
            "f1_points_ours_minus_trainer": round(100 * (o["dev_f1"] - t["dev_f1"]), 2),
            "train_speed_ratio_full_epoch": round(o["train_examples_per_second"] / t["train_examples_per_second"], 2),
            "train_speed_ratio": results.get("train_speed", {}).get("ratio_median"),
            "predict_speed_ratio": round(p["ours_sentences_per_second"] / p["pipeline_sentences_per_second"], 2),
        }
    path = save_json(name, results)
    print(summary(results))
    log(f"wrote {path}")


def summary(r: dict) -> str:
    o, p = r["ours"], r["predict"]
    lines = [f"CoNLL-2003: {r['train_sentences']} train / {r['dev_sentences']} dev sentences, {r['epochs']} epoch(s)",
             "", "| | dev F1 | train ex/s (full epoch) | predict sentences/s |", "|---|---|---|---|",
             f"| bertheads | {100 * o['dev_f1']:.2f} (by epoch: "
             + ", ".join(f"{100 * f:.2f}" for f in o["f1_by_epoch"])
             + f") | {o['train_examples_per_second']:.1f} | {p['ours_sentences_per_second']:.1f} |"]
    if "trainer" in r:
        t, c = r["trainer"], r["comparison"]
        lines.append(f"| HF Trainer / pipeline | {100 * t['dev_f1']:.2f} | {t['train_examples_per_second']:.1f} | "
                     f"{p['pipeline_sentences_per_second']:.1f} |")
        lines.append(f"| ours vs peer | {c['f1_points_ours_minus_trainer']:+.2f} points | "
                     f"{c['train_speed_ratio_full_epoch']:.2f}x | {c['predict_speed_ratio']:.2f}x |")
    if "train_speed" in r:
        s = r["train_speed"]
        lines += ["", f"Training speed, {len(s['ours_examples_per_second'])} interleaved rounds of {s['sentences']} "
                  f"sentences: ours {s['ours_median']:.1f} ex/s, Trainer {s['trainer_median']:.1f} ex/s, "
                  f"median ratio {s['ratio_median']:.2f}x"]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
